"""Inbound PUBLISH handling of a connection (a mixin of `Connection`).

A publish is checked (QoS, Receive Maximum, topic limits, `$SYS`, ACL, retained quota,
payload format), then handed to the broker link; QoS 1 is acknowledged (PUBACK) and QoS 2
received (PUBREC) only once the broker stored the message. Refusals: v5 PUBACK / PUBREC
with the reason code (QoS 0: dropped), 3.1.1 acknowledged as usual and dropped
(3.1.1 §3.3.5 allows it; MQTT has no negative acknowledgement there); a QoS above the
maximum or a Receive Maximum overrun is a v5 DISCONNECT (0x9B / 0x93), a 3.1.1 close.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import replace
from typing import TYPE_CHECKING

import trio

from gateway.mqtt.broker_link import FULL, STEP
from gateway.mqtt.logtext import shown
from gateway.mqtt.message import MqttMessage, now_ms
from gateway.mqtt.packets import NO_PROPERTIES, MqttProtocolError, Puback, Publish, Pubrec
from gateway.mqtt.topics import validate_topic_name

if TYPE_CHECKING:
    from gateway.mqtt.codec import PublishRun
    from gateway.mqtt.connection import Connection

__all__ = ["PublishHandler"]

log = logging.getLogger(__name__)

_PUBACK_V3 = struct.Struct(">BBH")  # type 4, remaining length 2, packet id

_NO_FORWARD = {"topic_alias": None, "message_expiry_interval": None,
               "subscription_identifiers": ()}


class PublishHandler:
    """`Connection.on_publish` and its acknowledgements."""

    #: set by the first PUBLISH: from then on the connection's reads pass the delivery
    #: gate (flow.py); connections that only subscribe always read.
    publishing = False
    #: the last topic this connection published to that passed the topic, $SYS and ACL
    #: checks (devices repeat their topic: those checks run once, not per PUBLISH)
    _topic_ok: str | None = None
    #: the task reading this connection (set by Connection.handle)
    _reader: trio.lowlevel.Task | None = None

    async def wait_gate(self: Connection) -> None:
        """Wait while the delivery gate is closed (flow.py). The time the gateway does not
        read is not the client's: keep alive and packet deadlines move by as much."""
        start = trio.current_time()
        await self.gw.link.gate.wait_open()
        waited = trio.current_time() - start
        self._ka_deadline += waited
        self._packet_deadline += waited

    async def on_publish(self: Connection, p: Publish) -> None:
        self.publishing = True
        gw = self.gw
        cfg = gw.config
        stats = gw.stats
        stats.msgs_in += 1
        qos = p.qos
        pid = p.packet_id
        v5 = self.version == 5
        if qos > cfg.maximum_qos:
            log.info("client %s: PUBLISH QoS %d above maximum_qos", shown(self.client_id), qos)
            self.close(0x9B)  # QoS not supported
            return
        if qos == 2 and (pid in self.qos2_pending or pid in self.session.inbound_qos2):
            if pid in self.session.inbound_qos2:
                self.send(Pubrec(pid))  # a retransmission: acknowledged once (§4.3.3)
            return
        if qos and v5 and self.inbound >= cfg.receive_maximum:
            log.info("client %s: more than %d QoS 1/2 PUBLISHes unacknowledged",
                     shown(self.client_id), cfg.receive_maximum)
            self.close(0x93)  # Receive Maximum exceeded
            return
        topic = p.topic
        code = 0
        if topic != self._topic_ok:
            code, why = self._check_topic(topic)
        if not code:
            if p.retain and gw.retained.would_refuse(topic, len(p.payload)):
                code, why = 0x97, f"max_retained ({cfg.max_retained}) reached"
            elif p.properties.payload_format_indicator == 1 and not _utf8(p.payload):
                code, why = 0x99, "payload is not UTF-8 as its format indicator says"
        if code:
            log.info("client %s: PUBLISH to %s refused (0x%02X): %s", shown(self.client_id),
                     shown(topic), code, why)
            self._refused(p, code)
            return
        props = p.properties
        expiry_at = None
        if props is not NO_PROPERTIES:
            if props.message_expiry_interval is not None:
                expiry_at = now_ms() + props.message_expiry_interval * 1000
            if props.topic_alias is not None or props.message_expiry_interval is not None:
                props = replace(props, **_NO_FORWARD)
                if props == NO_PROPERTIES:
                    props = NO_PROPERTIES
        msg = MqttMessage(topic, p.payload, qos, p.retain, props, expiry_at, self.client_id)
        link = gw.link
        link.hold()  # stored at the end of the read (Connection._handle_read)
        if qos == 0:
            step = link.submit(msg)
        elif qos == 1:
            self.inbound += 1
            step = link.submit(msg, lambda code: self._stored(pid, 1, code))
        else:
            self.inbound += 1
            self.qos2_pending.add(pid)
            step = link.submit(msg, lambda code: self._stored(pid, 2, code))
        if step == FULL:
            link.unhold()
            await link.wait_for_space()
        elif step == STEP:
            link.unhold()
            await trio.lowlevel.checkpoint()  # PINGREQs, deliveries run between slices

    async def on_publish_run(self: Connection, run: PublishRun) -> None:
        """3.1/3.1.1 PUBLISHes decoded in one go by the codec (codec.PublishRun): the
        handling of on_publish for a 3.x client (no properties), without a packet object
        per message. Nothing else runs between two of them unless the link says so (STEP,
        FULL): the connection is checked for a close only after such a wait."""
        self.publishing = True
        gw = self.gw
        cfg = gw.config
        link = gw.link
        submit = link.submit
        client_id = self.client_id
        max_qos = cfg.maximum_qos
        handled = 0
        link.hold()  # stored at the end of the read (Connection._handle_read)
        try:
            for topic, payload, flags, pid in run:
                handled += 1
                qos = (flags >> 1) & 3
                if qos > max_qos:
                    log.info("client %s: PUBLISH QoS %d above maximum_qos", shown(client_id),
                             qos)
                    self.close(0x9B)
                    return
                if qos == 2 and (pid in self.qos2_pending or pid in self.session.inbound_qos2):
                    if pid in self.session.inbound_qos2:
                        self.send(Pubrec(pid))  # a retransmission: acknowledged once (§4.3.3)
                    continue
                retain = (flags & 1) == 1
                if topic != self._topic_ok or retain:
                    code, why = self._check_topic(topic) if topic != self._topic_ok else (0, "")
                    if not code and retain and gw.retained.would_refuse(topic, len(payload)):
                        code, why = 0x97, f"max_retained ({cfg.max_retained}) reached"
                    if code:
                        log.info("client %s: PUBLISH to %s refused (0x%02X): %s",
                                 shown(client_id), shown(topic), code, why)
                        self._refuse(qos, pid, code)
                        continue
                msg = MqttMessage(topic, payload, qos, retain, NO_PROPERTIES, None, client_id)
                if qos == 0:
                    step = submit(msg)
                elif qos == 1:
                    self.inbound += 1
                    step = submit(msg, self, pid)  # answered with its round: stored_run
                else:
                    self.inbound += 1
                    self.qos2_pending.add(pid)
                    step = submit(msg, _ack_later(self, pid, 2))
                if step:
                    link.unhold()
                    if step == FULL:
                        await link.wait_for_space()
                    else:
                        await trio.lowlevel.checkpoint()
                    if self.closed:
                        return
                    link.hold()
        finally:
            gw.stats.msgs_in += handled

    def _check_topic(self: Connection, topic: str) -> tuple[int, str]:
        """(0, "") when `topic` may be published to (then it is remembered as
        `_topic_ok`), else the refusal's reason code and why."""
        cfg = self.gw.config
        try:
            validate_topic_name(topic, max_length=cfg.max_topic_length,
                                max_levels=cfg.max_topic_levels)
        except MqttProtocolError as exc:
            return 0x90, exc.message
        if topic.startswith("$SYS"):
            return 0x87, "clients may not publish to $SYS"
        if not self.gw.auth.can_publish(self.username, self.client_id, topic):
            return 0x87, "denied by the ACL"
        self._topic_ok = topic
        return 0, ""

    def _refused(self: Connection, p: Publish, code: int) -> None:
        self._refuse(p.qos, p.packet_id, code)

    def _refuse(self: Connection, qos: int, pid: int | None, code: int) -> None:
        if qos == 0:
            return
        if self.version != 5:
            code = 0
        if qos == 1:
            self.send(Puback(pid, code))
        else:
            if code < 0x80:
                self.session.inbound_qos2.add(pid)  # 3.1.1: PUBREL will follow
            self.send(Pubrec(pid, code))

    def stored_run(self: Connection, acks: list[int]) -> None:
        """The broker answered a round's QoS 1 publishes of this 3.x connection
        (BrokerLink AckSink: [packet id, reason code, ...] in order): their PUBACKs are
        queued at once and the writer is woken once. A publish not stored closes the
        connection after the PUBACKs of those before it (3.1.1 cannot say "not stored";
        the client will resend)."""
        if self.closed:
            return
        pids = acks[::2]
        codes = acks[1::2]
        bad = max(codes) >= 0x80
        if bad:
            pids = pids[:next(i for i, code in enumerate(codes) if code >= 0x80)]
        self.inbound = max(0, self.inbound - len(pids))
        if pids:
            pack = _PUBACK_V3.pack
            self.queue(b"".join([pack(0x40, 2, pid) for pid in pids]))
        if bad:
            log.warning("client %s: publish not stored; closing", shown(self.client_id))
            self.close()
            return
        self._wake_writer()

    def _stored(self: Connection, pid: int, qos: int, code: int) -> None:
        """Broker answered for a QoS 1/2 publish (runs in the dispatcher task)."""
        if self.closed:
            self.qos2_pending.discard(pid)
            return
        if self.version != 5:
            if code >= 0x80:
                # 3.1.1 has no way to say "not stored": close, the client will resend.
                log.warning("client %s: publish not stored; closing", shown(self.client_id))
                self.close()
                return
            code = 0
        elif code == 0x10 and not self.problem_info:
            pass
        if qos == 1:
            self.inbound = max(0, self.inbound - 1)
            if self.version != 5:
                self.queue(_PUBACK_V3.pack(0x40, 2, pid))  # the whole 3.x PUBACK, no codec
            else:
                self.send(Puback(pid, code))
        else:
            self.qos2_pending.discard(pid)
            if code < 0x80:
                self.session.inbound_qos2.add(pid)
                self.session.dirty = True
            else:
                self.inbound = max(0, self.inbound - 1)
            self.send(Pubrec(pid, code))
        self._wake_writer()

    def _wake_writer(self: Connection) -> None:
        """Acknowledgements were queued: the pump writes them, unless this runs in the
        connection's own reader (its round, BrokerLink.store_held), which flushes them
        with the rest of the read's output."""
        reader = self._reader
        if reader is None or trio.lowlevel.current_task() is not reader:
            self.wake()


def _ack_later(conn: Connection, pid: int, qos: int):
    return lambda code: conn._stored(pid, qos, code)


def _utf8(data: bytes) -> bool:
    try:
        str(data, "utf-8")
    except UnicodeDecodeError:
        return False
    return True
