"""One client connection: the MQTT protocol state machine over `MqttCodec`.

Tasks: the reader (this object's `handle`) decodes packets and answers them; the
session's delivery `Pump` starts only when there is something to deliver or acknowledge
asynchronously (a subscription, a QoS 1/2 publish), so an idle connection costs one task.
Writes are gathered: packets are queued (`queue`) and written together by whoever calls
`flush` first; others return at once and their bytes ride along.

Refusals use the protocol's own codes (docs/mqtt.md has the table): CONNACK reason codes
(3.1.1 return codes), PUBACK / PUBREC / SUBACK / UNSUBACK reason codes in v5 (3.1.1:
SUBACK 0x80; a refused 3.1.1 publish is still acknowledged and dropped), and a
DISCONNECT with the reason code before closing in v5 (3.1.1: the connection just closes).
Each refusal logs one line; what a peer chose (client id, topic, user name) is logged
through `logtext.shown` (a short prefix and the length). Read deadlines, the budget for
incomplete packets, the lingering close and ACL read checks are in `connection_guards`.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING

import trio

from gateway.mqtt.auth import SUB_REFUSED
from gateway.mqtt.codec import MqttCodec, PubackRun, PublishRun
from gateway.mqtt.connection_guards import ConnectionGuards
from gateway.mqtt.connection_output import ConnectionOutput
from gateway.mqtt.connection_publish import PublishHandler
from gateway.mqtt.delivery import Pump
from gateway.mqtt.logtext import shown
from gateway.mqtt.packets import (
    NO_PROPERTIES,
    PINGRESP,
    Connack,
    Connect,
    Disconnect,
    MqttProtocolError,
    Pingreq,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from gateway.mqtt.registry import SessionQuotaExceeded
from gateway.mqtt.session import Session, Subscription
from gateway.mqtt.topics import validate_topic_filter, validate_topic_name

if TYPE_CHECKING:
    from gateway.mqtt.server import MqttGateway

__all__ = ["Connection"]

log = logging.getLogger(__name__)

READ_SIZE = 65536
#: Time allowed to write a final DISCONNECT / CONNACK and close.
CLOSE_GRACE_S = 1.0
# A SUBSCRIBE waits at most this long for retained publishes still in flight to the broker
# before it reads the retained table (BrokerLink.retained_settled).
RETAINED_SETTLE_TIMEOUT_S = 2.0
NEVER = 0xFFFFFFFF  # v5 Session Expiry Interval "does not expire"


class Connection(ConnectionOutput, ConnectionGuards, PublishHandler):
    """Protocol state of one network connection (TCP, TLS or WebSocket)."""

    def __init__(self, gw: MqttGateway, stream, remote: str, transport: str) -> None:
        cfg = gw.config
        self.gw = gw
        self.stream = stream
        self.remote = remote
        self.transport = transport
        self.codec = MqttCodec(cfg.max_packet_size, topic_alias_maximum=cfg.topic_alias_maximum)
        self.codec.publish_runs = True  # 3.x PUBLISHes come as PublishRun (on_publish_run)
        self.version = 4
        self.client_id = ""
        self.username: str | None = None
        self.session: Session | None = None
        self.closed = False
        self.out: list[bytes] = []
        self.out_bytes = 0
        self._writing = False
        #: a plain TCP socket: output is written to it directly (write_now)
        self._sock = stream.socket if type(stream) is trio.SocketStream else None
        self.writes_direct = self._sock is not None
        self._reader: trio.lowlevel.Task | None = None  # the task running `handle`
        self._drained: trio.Event | None = None
        self.inflight_limit = cfg.max_inflight_out
        self.alias_out: dict[str, int] = {}
        self.alias_max = 0
        self.problem_info = True
        self.inbound = 0
        self.qos2_pending: set[int] = set()
        self.keepalive = 0
        self.finished = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._pump: Pump | None = None
        self._close_reason: int | None = None  # v5 DISCONNECT reason sent before closing
        self._final: object | None = None  # a packet to write before closing
        self._send_will = True
        self._connect_expiry = 0
        #: Filters granted although the ACL denies some topics under them: while any
        #: exists, each delivered message is checked (`may_read`), else none is.
        self.acl_checked: set[str] = set()
        self._readable: dict[str, bool] = {}
        self._ka_deadline = float("inf")  # trio time: keep alive runs out
        self._packet_deadline = float("inf")  # trio time: the partial packet must be complete
        self._partial = 0  # bytes of an incomplete packet counted in gw.partial_bytes
        #: read deadline state for the gateway's sweeper (see `_read_loop`)
        self._reading = False
        self._deadline = float("inf")
        self._read_scope: trio.CancelScope | None = None

    def ensure_pump(self) -> None:
        """Start the delivery task (also the writer of asynchronous acknowledgements)."""
        if self._pump is None and self._nursery is not None and not self.closed:
            self._pump = Pump(self.gw, self.session, self)
            self._nursery.start_soon(self._run_pump)

    async def _run_pump(self) -> None:
        try:
            await self._pump.run()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self._lost()
        except Exception:
            log.exception("delivery to %s failed", shown(self.client_id))
            self.close(0x80)

    def wake(self) -> None:
        """Asynchronous output was queued: have the pump write it."""
        if self.session is not None:
            self.session.wake()
        self.ensure_pump()

    # -- closing --------------------------------------------------------------------------

    def close(self, reason: int | None = None, *, will: bool = True) -> None:
        """Close from the server side; v5 clients get DISCONNECT `reason` first."""
        if self._close_reason is None and self._final is None:
            self._close_reason = reason
        self._send_will = self._send_will and will
        self.closed = True
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def kick(self, reason: int, *, will: bool = True) -> None:
        """Close (session takeover 0x8E, shutdown 0x8B) and wait until wound down."""
        self.close(reason, will=will)
        await self.finished.wait()

    # -- main ---------------------------------------------------------------------------

    async def handle(self) -> None:
        gw = self.gw
        self._reader = trio.lowlevel.current_task()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    await self._serve()
                finally:
                    # Closed before the nursery is: a broker answer arriving while the
                    # nursery winds down (it yields once even when empty) must not start
                    # a pump in it ("Nursery is closed to new arrivals").
                    self.closed = True
                    nursery.cancel_scope.cancel()
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the peer went away: an abnormal close (the will is sent)
        finally:
            self.closed = True
            self._release_partial()
            sess = self.session
            if sess is not None:
                gw.stats.clients -= 1
                gw.registry.closed(sess, self, send_will=self._send_will)
            with trio.CancelScope(shield=True):
                await self._goodbye()
            self.finished.set()

    async def _goodbye(self) -> None:
        cfg = self.gw.config
        with trio.move_on_after(CLOSE_GRACE_S + cfg.close_linger_s):
            final = self._final
            if final is None and self._close_reason is not None and self.version == 5 \
                    and self.session is not None:
                final = Disconnect(self._close_reason)
            if final is not None:
                try:
                    data = b"".join(self.out) + self.codec.encode(final)
                    with trio.move_on_after(CLOSE_GRACE_S):
                        await self.stream.send_all(data)
                    await self._linger()
                except Exception:
                    pass
            try:
                await self.stream.aclose()
            except Exception:
                pass

    async def _serve(self) -> None:
        cfg = self.gw.config
        packets: list = []
        with trio.move_on_after(cfg.connect_timeout_s):
            while not packets:
                data = await self.stream.receive_some(READ_SIZE)
                if not data:
                    return
                self.gw.stats.bytes_in += len(data)  # the CONNECT read counts too
                try:
                    packets = self.codec.feed(data)
                except MqttProtocolError as exc:
                    self._refused_packet(exc)
                    return
        if not packets:
            log.info("connection from %s sent no CONNECT in %.0f s", self.remote,
                     cfg.connect_timeout_s)
            return
        if not await self._on_connect(packets[0]):
            return
        await self.flush()
        if not await self._handle_read(packets[1:]):
            return
        await self.flush()
        self._packet_seen()
        await self._read_loop()

    async def _read_loop(self) -> None:
        """Read and handle packets until the connection ends. The read deadline (keep
        alive, partial packet) is enforced by the gateway's sweeper (server.py), which
        cancels `_read_scope` while this task waits in a read past `_deadline`: one scope
        per connection rather than one per read (a scope costs about as much as the read
        itself, and devices send one packet per read)."""
        gate = self.gw.link.gate
        receive = self.stream.receive_some
        if type(self.stream) is trio.SocketStream:
            receive = self._receive_tcp
        data = None
        while not self.closed:
            with trio.CancelScope() as scope:
                self._read_scope = scope
                while not self.closed:
                    if self.publishing and not gate.is_open:
                        await self.wait_gate()  # back pressure on publishers (flow.py)
                    self._deadline = self._read_deadline()
                    self._reading = True
                    try:
                        data = await receive(READ_SIZE)
                    finally:
                        self._reading = False
                    if scope.cancel_called:
                        break  # the sweep came as the read returned: keep the data
                    if not await self._received(data):
                        return
                    data = None
            self._read_scope = None
            if scope.cancelled_caught:
                self._read_timed_out()
                return
            if data is not None and not await self._received(data):
                return
            data = None

    async def _received(self, data: bytes) -> bool:
        """Handle one read's bytes; False when the connection is to end."""
        if not data:
            return False
        self.gw.stats.bytes_in += len(data)
        try:
            packets = self.codec.feed(data)
        except MqttProtocolError as exc:
            if await self._handle_read(exc.packets):
                self._refused_packet(exc)
            return False
        if not await self._handle_read(packets):
            return False
        if packets:
            self._packet_seen()
        self._count_partial()
        if self._partial and not await self._within_partial_budget():
            self._read_timed_out()
            return False
        if self.out:
            await self.flush()
            if self.out_bytes > self.gw.config.max_out_buffer:
                # The pump's write is stuck on a client that does not read: stop
                # reading until it moves, so PUBACKs / PINGRESPs cannot pile up here.
                await self.wait_drained()
        return True

    async def _handle_read(self, packets: list) -> bool:
        """`_handle` the packets of one read, then store its publishes in this task if
        the dispatcher is idle (BrokerLink.store_held) and deliver them to the sessions
        reading their LMQs here too when that is simple (Session.deliver_now); their
        PUBACKs go out with this read's flush."""
        link = self.gw.link
        try:
            ok = await self._handle(packets)
            if ok and link.held:
                woken: list = []
                try:
                    await link.store_held(woken)
                finally:
                    for w in dict.fromkeys(woken):
                        deliver = getattr(w, "deliver_now", None)
                        if deliver is None or not deliver():
                            w.wake()
            return ok
        finally:
            link.unhold()

    def _refused_packet(self, exc: MqttProtocolError) -> None:
        # The codec's message may quote what the peer sent (e.g. a protocol name).
        log.info("client %s from %s: %s", shown(self.client_id), self.remote,
                 shown(str(exc), 200))
        self._final = self.codec.error_reply(exc)
        self.close()

    # -- CONNECT ------------------------------------------------------------------------------

    def _refuse_connect(self, code: int, why: str) -> bool:
        log.info("CONNECT of %s from %s refused (0x%02X): %s", shown(self.client_id),
                 self.remote, code, why)
        self._final = Connack(False, code)
        self.close()
        return False

    async def _on_connect(self, connect: Connect) -> bool:
        gw = self.gw
        cfg = gw.config
        v = self.version = connect.protocol_version
        props = connect.properties
        cid = connect.client_id
        self.client_id = cid
        assigned = None
        if not cid:
            cid = self.client_id = "lmq-" + uuid.uuid4().hex
            if v == 5:
                assigned = cid
        if len(cid.encode("utf-8")) > cfg.max_client_id_length:
            return self._refuse_connect(0x85, "client identifier too long")
        if v == 5 and props.authentication_method is not None:
            return self._refuse_connect(0x8C, "enhanced authentication is not supported")
        if gw.stopping:
            return self._refuse_connect(0x8B, "server shutting down")
        rc = await gw.auth.authenticate(connect.username, connect.password)
        if rc:
            return self._refuse_connect(rc, "authentication failed")
        self.username = connect.username
        will = connect.will
        if will is not None:
            if will.qos > cfg.maximum_qos:
                if v == 5:
                    return self._refuse_connect(0x9B, "will QoS above maximum_qos")
                will = replace(will, qos=cfg.maximum_qos)
            try:
                validate_topic_name(will.topic, max_length=cfg.max_topic_length,
                                    max_levels=cfg.max_topic_levels)
            except MqttProtocolError as exc:
                return self._refuse_connect(0x90, f"will topic: {exc.message}")
            if not gw.auth.can_publish(self.username, cid, will.topic):
                return self._refuse_connect(0x87, f"will topic {shown(will.topic)} not allowed")
        ka = connect.keepalive
        server_ka = None
        if v == 5 and cfg.max_keepalive and (ka == 0 or ka > cfg.max_keepalive):
            ka = server_ka = cfg.max_keepalive
        self.keepalive = ka
        if v == 5:
            req = props.session_expiry_interval or 0
            expiry: int | None = None if req == NEVER else req
            self._connect_expiry = req
        else:
            expiry = 0 if connect.clean_start else None
        granted_expiry = expiry
        if cfg.max_session_expiry_s is not None and (expiry is None or expiry > cfg.max_session_expiry_s):
            granted_expiry = cfg.max_session_expiry_s
        if v == 5:
            rx = props.receive_maximum or 65535
            self.inflight_limit = min(rx, cfg.max_inflight_out)
            self.alias_max = props.topic_alias_maximum or 0
            self.problem_info = props.request_problem_information != 0
        try:
            sess, present = await gw.registry.open(self, cid, v, connect.clean_start,
                                                   granted_expiry, will)
        except SessionQuotaExceeded:
            # v5: Quota exceeded; 3.1.1 has no such code: Server unavailable (0x03).
            return self._refuse_connect(0x97, f"max_stored_sessions "
                                        f"({cfg.max_stored_sessions}) reached")
        self.session = sess
        gw.stats.clients += 1
        for f in sess.subs:
            self._note_acl(f, self._acl_decision(f))
        ack_props = NO_PROPERTIES
        if v == 5:
            ack_props = Properties(
                session_expiry_interval=(granted_expiry if granted_expiry != expiry else None),
                receive_maximum=cfg.receive_maximum,
                maximum_qos=cfg.maximum_qos if cfg.maximum_qos < 2 else None,
                maximum_packet_size=cfg.max_packet_size,
                topic_alias_maximum=cfg.topic_alias_maximum or None,
                assigned_client_identifier=assigned,
                server_keep_alive=server_ka,
            )
        self.send(Connack(present, 0, ack_props))
        if sess.inflight or sess.subs or sess.direct:
            self.ensure_pump()
        return True

    # -- the other packets ------------------------------------------------------------------

    async def _handle(self, packets: list) -> bool:
        """Handle decoded packets in order; False once the connection must close."""
        for p in packets:
            if self.closed:
                return False
            t = type(p)
            if t is PublishRun:
                await self.on_publish_run(p)
            elif t is Publish:
                await self.on_publish(p)
            elif t is PubackRun:
                self._on_pubacks(p)
            elif t is Puback or t is Pubcomp:
                self._on_ack(p)
            elif t is Pubrec:
                self._on_pubrec(p)
            elif t is Pubrel:
                self._on_pubrel(p)
            elif t is Subscribe:
                self.gw.link.unhold()  # publishes before it are not held back meanwhile
                await self._on_subscribe(p)
            elif t is Unsubscribe:
                self._on_unsubscribe(p)
            elif t is Pingreq:
                self.queue(_PINGRESP_BYTES)
            elif t is Disconnect:
                self._on_disconnect(p)
                return False
            else:  # AUTH without an authentication method
                log.info("client %s sent an unexpected %s", shown(self.client_id), t.__name__)
                self.close(0x82)
                return False
        return not self.closed

    def _on_ack(self, p: Puback | Pubcomp) -> None:
        sess = self.session
        entry = sess.inflight.get(p.packet_id)
        if entry is None:
            return
        if type(p) is Puback and entry.qos != 1:
            return
        if type(p) is Pubcomp and entry.state != "r":
            return
        sess.complete(p.packet_id)

    def _on_pubacks(self, ids: PubackRun) -> None:
        """_on_ack of a run of plain PUBACKs (their packet ids)."""
        self.session.complete_run(ids)

    def _on_pubrec(self, p: Pubrec) -> None:
        sess = self.session
        entry = sess.inflight.get(p.packet_id)
        if entry is None or entry.qos != 2:
            self.send(Pubrel(p.packet_id, 0x92 if self.version == 5 else 0))
            return
        if p.reason_code >= 0x80:
            sess.complete(p.packet_id)  # the receiver refused it: flow over (§4.3.3)
            return
        entry.state = "r"
        sess.dirty = True
        self.send(Pubrel(p.packet_id))

    def _on_pubrel(self, p: Pubrel) -> None:
        sess = self.session
        if p.packet_id in sess.inbound_qos2:
            sess.inbound_qos2.discard(p.packet_id)
            sess.dirty = True
            self.inbound = max(0, self.inbound - 1)
            self.send(Pubcomp(p.packet_id))
        else:
            self.send(Pubcomp(p.packet_id, 0x92 if self.version == 5 else 0))

    async def _on_subscribe(self, p: Subscribe) -> None:
        gw = self.gw
        cfg = gw.config
        sess = self.session
        sub_id = p.properties.subscription_identifiers[0] if p.properties.subscription_identifiers else None
        codes = []
        added = []
        for s in p.subscriptions:
            code = self._check_subscription(s.topic_filter)
            if code:
                codes.append(code)
                continue
            granted = min(s.qos, cfg.maximum_qos)
            sub = Subscription(s.topic_filter, granted, s.no_local, s.retain_as_published,
                               s.retain_handling, sub_id)
            try:
                existed = await gw.registry.subscribe(sess, sub)
            except Exception as exc:
                log.warning("subscribe of %s to %s failed: %r", shown(self.client_id),
                            shown(s.topic_filter), exc)
                codes.append(0x80)
                continue
            codes.append(granted)
            added.append((sub, existed))
        self.send(Suback(p.packet_id, tuple(codes)))
        if gw.link.retained_inflight and any(
            sub.group is None and sub.retain_handling != 2 for sub, _ in added
        ):
            await gw.link.retained_settled(RETAINED_SETTLE_TIMEOUT_S)
        for sub, existed in added:
            if sub.group is not None or sub.retain_handling == 2:
                continue
            if sub.retain_handling == 1 and existed:
                continue
            ids = (sub.sub_id,) if sub.sub_id is not None else ()
            found, cut = await gw.retained.match_bounded(sub.filter,
                                                         cfg.max_retained_per_subscription)
            if cut:
                log.info("client %s: retained messages for %s cut at "
                         "max_retained_per_subscription (%d)", shown(self.client_id),
                         shown(sub.filter), cfg.max_retained_per_subscription)
            for msg in found:
                sess.direct.append((msg, min(msg.qos, sub.qos), True, ids, None))
        if added:
            self.wake()

    def _check_subscription(self, topic_filter: str) -> int:
        gw = self.gw
        cfg = gw.config
        sess = self.session
        try:
            validate_topic_filter(topic_filter, max_length=cfg.max_topic_length,
                                           max_levels=cfg.max_topic_levels)
        except MqttProtocolError as exc:
            log.info("client %s: subscription %s refused: %s", shown(self.client_id),
                     shown(topic_filter), exc.message)
            return 0x8F
        if len(sess.subs) >= cfg.max_subscriptions_per_client and topic_filter not in sess.subs:
            log.info("client %s: subscription %s refused: max_subscriptions_per_client (%d)",
                     shown(self.client_id), shown(topic_filter), cfg.max_subscriptions_per_client)
            return 0x97
        decision = self._acl_decision(topic_filter)
        if decision == SUB_REFUSED:
            log.info("client %s: subscription %s refused by the ACL", shown(self.client_id),
                     shown(topic_filter))
            return 0x87
        self._note_acl(topic_filter, decision)
        return 0

    def _on_unsubscribe(self, p: Unsubscribe) -> None:
        registry = self.gw.registry
        codes = tuple(0 if registry.unsubscribe(self.session, f) else 0x11 for f in p.topic_filters)
        self.acl_checked.difference_update(p.topic_filters)
        self.send(Unsuback(p.packet_id, codes if self.version == 5 else ()))

    def _on_disconnect(self, p: Disconnect) -> None:
        sess = self.session
        if self.version == 5:
            new = p.properties.session_expiry_interval
            if new is not None:
                if self._connect_expiry == 0 and new != 0:
                    log.info("client %s: DISCONNECT sets a session expiry after 0",
                             shown(self.client_id))
                    self.close(0x82)  # MQTT-3.14.2-2
                    return
                cap = self.gw.config.max_session_expiry_s
                expiry = None if new == NEVER else new
                if cap is not None and (expiry is None or expiry > cap):
                    expiry = cap
                sess.expiry = expiry
        # Only v5 reason 0x04 keeps the will (MQTT-3.14.4-3: a normal DISCONNECT drops it).
        self._send_will = self.version == 5 and p.reason_code == 0x04
        self.closed = True


_PINGRESP_BYTES = bytes((0xD0, 0))
assert PINGRESP is not None
