"""Persistent MQTT sessions kept in the cluster, so that one made on gateway A resumes on
gateway B (docs/stateless-gateways.md "Sessions"). Standard RocketMQ requests only.

* **Session record** (client id, protocol version, expiry, subscriptions, owning gateway):
  a message on the system topic `SESSION_TOPIC`, multi-dispatched into the session's own
  LMQ `%LMQ%mqtt_s_<sha256(client id)>`; the newest entry of that LMQ is the session
  (GET_MAX_OFFSET, then one PULL_MESSAGE). A deleted session is a record without
  subscriptions (``"r": null``). Its commitlog offset orders records: a gateway holding a
  copy older than the newest record written by another gateway drops its copy.
* **Read positions**: consumer offsets (UPDATE_CONSUMER_OFFSET / QUERY_CONSUMER_OFFSET) of
  the group `MQTT_S_<sha256(client id)>` on each LMQ the session reads, written with the
  starting position on SUBSCRIBE and the committed position (lowest unacknowledged) on
  every state flush and on disconnect.

Writes go through one FIFO (`post_*`, one task), so a session's records keep their order
without holding up the connection. The record written on a disconnect also carries the
session's in-flight outbound messages, inbound QoS 2 ids and positions (`"s"`): the
gateway that resumes it re-sends the unacknowledged ones (DUP, same packet ids). While a
session is connected, the same state is written whenever it changed (`post_state`, from
the state flush): one pending write per session, built when written, after the FIFO's
writes, at most `STATE_WRITES_PER_S` a second. So after a crash of its gateway the
resumed session re-sends what that record held in flight (less what newer committed
positions acknowledged) and keeps its inbound QoS 2 ids; only what changed after the
record was written is delivered again as new or forgotten.

**Sweep** (`sweep_sessions`, run by the route log's sweep on the MQTT gateway with the
smallest id): a persistent session whose record names a gateway that has been out of the
gateways' group for `orphan_timeout_s` is ended by its Session Expiry Interval, counted
from its disconnect (the record's `gone`) or, for a session its gateway lost by dying,
from when the gateway was found gone: its routes are removed and a delete record is
written. At most `SWEEP_READS` records are read per round. A will waiting for its Will
Delay Interval is in the disconnect record too (`"w"`): the sweeper publishes it once
the delay (or the session) ran out and its gateway vanished, then writes the record
again without it (so it is sent once).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import trio

from core.client import MessageQueue, PullStatus
from core.client.errors import MQClientError
from core.common.properties import MessageConst, encode_properties
from core.common.sysflag import PullSysFlag
from core.remoting.codes import RequestCode, ResponseCode
from core.remoting.errors import RemotingError
from gateway.routing.master_follow import MasterFollower

__all__ = ["ClusterSessions", "SESSION_TOPIC", "StoredSession", "offsets_group",
           "session_lmq"]

log = logging.getLogger(__name__)

SESSION_TOPIC = "LMQ_GW_SESSIONS"
#: A record larger than this is not read back (a session of max_subscriptions_per_client
#: filters of max_topic_length stays far below).
MAX_RECORD_BYTES = 4 * 1024 * 1024
#: Session records read per sweep round (the rest wait for the next round).
SWEEP_READS = 200
#: Records carrying a connected session's in-flight state (written when it changed, so
#: that a session resumed elsewhere after a crash re-sends with DUP and keeps its inbound
#: QoS 2 ids) per second per gateway, at most; sessions wait their turn in order.
STATE_WRITES_PER_S = 200


def _key(client_id: str) -> str:
    return hashlib.sha256(client_id.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def session_lmq(client_id: str) -> str:
    return "%LMQ%mqtt_s_" + _key(client_id)


def offsets_group(client_id: str) -> str:
    return "MQTT_S_" + _key(client_id)


@dataclass
class StoredSession:
    """The newest record of a session: `stamp` is its commitlog offset (orders records)."""

    stamp: int
    gateway: str
    record: dict | None  # None: the session was ended
    #: in-flight, inbound QoS 2 ids and positions when its gateway wrote them (disconnect)
    state: dict | None = None
    #: a will waiting for its delay when the record was written (`will_record`)
    will: dict | None = None


class ClusterSessions:
    """Reads and (ordered) writes of the sessions kept in the cluster."""

    def __init__(self, link: Any, addr: str, broker_name: str, gateway_id: str, *,
                 topic: str = SESSION_TOPIC, retry_s: float = 0.5) -> None:
        self.link = link
        self.client = link.client
        #: the master of `broker_name`, followed across a failover (re-read on a failure)
        self.master = MasterFollower(self.client, broker_name, addr, min_interval_s=retry_s)
        self.broker_name = broker_name
        self.gateway_id = gateway_id
        self.topic = topic
        self.retry_s = retry_s
        self._outbox: list[tuple[str, Any]] = []
        self._work = trio.Event()
        #: client id -> connected session whose in-flight state is to be written
        self._state_due: dict[str, Any] = {}
        self._state_at = 0.0  # trio time before which no state record is written
        #: client id -> gateway its newest record names (sweep)
        self._owners: dict[str, str] = {}
        #: client id -> stamp of the record found expired (ended when found again)
        self._doomed: dict[str, int] = {}
        #: client id -> (route log clock) time before which its record is not read again
        self._next_read: dict[str, float] = {}
        #: gateways whose sweeper this may be (ids starting with this)
        self.sweep_prefix = "mqtt-"
        #: publishes a will of a session whose gateway vanished: (client id, Will)
        self.on_will: Any = None

    @property
    def addr(self) -> str:
        return self.master.addr

    @addr.setter
    def addr(self, value: str) -> None:
        self.master.addr = value

    # -- writes (ordered) -----------------------------------------------------------------

    def post_record(self, sess: Any, *, state: bool = False) -> trio.Event:
        """Write `sess`'s record (owner: this gateway); its stamp lands in
        `sess.cluster_stamp` once stored, and the event returned is set then. With
        `state` (on disconnect) the record also carries the session's in-flight
        outbound messages, inbound QoS 2 ids and positions, so the gateway that resumes
        it re-sends what was not acknowledged (DUP, same packet ids)."""
        done = trio.Event()
        self._post(("record", (sess, self._body(sess, state), done)))
        return done

    def _body(self, sess: Any, state: bool) -> dict:
        body = {"c": sess.client_id, "g": self.gateway_id, "r": sess.record()}
        if state:
            body["s"] = {"pos": sess.offsets_record(), "inf": sess.inflight_record(),
                         "q2": sorted(sess.inbound_qos2)}
            if sess.will is not None and sess.will_due is not None:
                due = int(time.time() * 1000 + (sess.will_due - trio.current_time()) * 1000)
                body["w"] = will_record(sess.will, due)
        return body

    def post_state(self, sess: Any) -> None:
        """The in-flight state of connected `sess` changed: write its record with that
        state soon (a session already waiting keeps its place; the record is built when
        written, so it is the newest state then), at most `STATE_WRITES_PER_S` records
        a second for the whole gateway, after the ordered writes."""
        if sess.client_id not in self._state_due:
            self._state_due[sess.client_id] = sess
            self._work.set()

    def post_delete(self, client_id: str) -> None:
        self._post(("record", (None, {"c": client_id, "g": self.gateway_id, "r": None},
                               None)))

    def post_raw(self, body: dict) -> None:
        """Write a record body as it is (the sweeper's copy of a record without its will)."""
        self._post(("record", (None, body, None)))

    def post_offsets(self, client_id: str, offsets: dict[tuple[str, str], int]) -> None:
        if offsets:
            self._post(("offsets", (client_id, offsets)))

    def _post(self, item: tuple[str, Any]) -> None:
        self._outbox.append(item)
        self._work.set()

    async def settled(self) -> None:
        """Return once everything posted so far was written (shutdown; bound it)."""
        while self._outbox:
            await trio.sleep(0.01)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await self.client.api.create_topic(self.addr, self.topic, 1, 1)
        task_status.started()
        while True:
            if self._outbox:
                kind, data = self._outbox[0]
                if await self._attempt(self._write_record(*data) if kind == "record"
                                       else self._write_offsets(*data)):
                    self._outbox.pop(0)
                continue
            now = trio.current_time()
            if self._state_due and now >= self._state_at:
                cid = next(iter(self._state_due))
                sess = self._state_due.pop(cid)
                if sess.conn is None or sess.ended:
                    continue  # gone: its disconnect record (if any) carries the state
                self._state_at = now + 1 / STATE_WRITES_PER_S
                if not await self._attempt(self._write_record(sess, self._body(sess, True),
                                                              None)):
                    self._state_due.setdefault(cid, sess)
                continue
            with trio.move_on_at(self._state_at if self._state_due else math.inf):
                await self._work.wait()
            self._work = trio.Event()

    async def _attempt(self, write: Any) -> bool:
        """Run one write; on a failure wait (or follow a moved master) and say so."""
        try:
            await write
            return True
        except (MQClientError, RemotingError, OSError) as exc:
            log.warning("session state not stored yet, retrying: %r", exc)
            if await self.master.reresolve():
                await self._refresh_link()
            else:
                await trio.sleep(self.retry_s)
            return False

    async def _refresh_link(self) -> None:
        """The master moved: the link's broker table (offsets of the sessions go through
        it) is re-read now rather than at its next periodic refresh."""
        try:
            await self.link.refresh_cluster()
        except (MQClientError, RemotingError, OSError) as exc:
            log.warning("cluster refresh after a master moved failed: %r", exc)

    async def _write_record(self, sess: Any, body: dict, done: trio.Event | None) -> None:
        lmq = session_lmq(body["c"])
        props = encode_properties({MessageConst.INNER_MULTI_DISPATCH: lmq})
        ext = {"a": "MQTT_GATEWAY", "b": self.topic, "c": "TBW102", "d": "1", "e": "0",
               "f": "0", "g": str(int(time.time() * 1000)), "h": "0", "i": props, "j": "0",
               "k": "false", "m": "false"}
        data = json.dumps(body, separators=(",", ":")).encode()
        result = await self.client.api.send_message(
            self.addr, MessageQueue(self.topic, self.broker_name, 0), ext, data,
            batch=False, uniq_id="")
        if sess is not None and result is not None and result.offset_msg_id:
            sess.cluster_stamp = int(result.offset_msg_id[-16:], 16)
        if done is not None:
            done.set()

    async def _write_offsets(self, client_id: str,
                             offsets: dict[tuple[str, str], int]) -> None:
        group = offsets_group(client_id)
        for (broker, lmq), offset in offsets.items():
            if broker in self.link.brokers:
                await self.client.api.update_consumer_offset(
                    self.link.addr(broker), group, lmq, 0, offset)

    # -- reads ------------------------------------------------------------------------------

    async def fetch(self, client_id: str) -> StoredSession | None:
        """The newest record of `client_id`'s session, or None (never recorded)."""
        api = self.client.api
        lmq = session_lmq(client_id)
        end = await api.get_max_offset(self.addr, lmq, 0)
        if end <= 0:
            return None
        ext = {"consumerGroup": offsets_group(client_id), "topic": lmq, "queueId": "0",
               "queueOffset": str(end - 1), "maxMsgNums": "1",
               "sysFlag": str(int(PullSysFlag.SUBSCRIPTION)), "commitOffset": "0",
               "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0",
               "expressionType": "TAG"}
        got = await api.pull_message(self.addr, ext, self.client.config.request_timeout)
        if got.status is not PullStatus.FOUND or not got.messages:
            return None  # cut by retention
        msg = got.messages[-1]
        if len(msg.body) > MAX_RECORD_BYTES:
            return None
        try:
            body = json.loads(msg.body)
            if body["c"] != client_id:
                return None  # a hash collision
            return StoredSession(msg.commitlog_offset, str(body["g"]), body["r"],
                                 body.get("s"), body.get("w"))
        except (ValueError, KeyError, TypeError):
            return None

    async def load_offsets(self, client_id: str,
                           keys: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """Committed positions of the session on (broker, LMQ) `keys` (missing: none)."""
        group = offsets_group(client_id)
        out: dict[tuple[str, str], int] = {}
        for broker, lmq in keys:
            resp = await self.client.api.call(
                self.link.addr(broker), RequestCode.QUERY_CONSUMER_OFFSET,
                {"consumerGroup": group, "topic": lmq, "queueId": "0",
                 "setZeroIfNotFound": "false"},
                ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
            if resp.code == ResponseCode.SUCCESS:
                out[(broker, lmq)] = resp.ext_int("offset", 0)
        return out

    # -- sweep of sessions whose gateway vanished ------------------------------------------

    async def sweep_sessions(self, routes: Any) -> int:
        """End the persistent sessions whose gateway vanished and whose expiry passed
        (see the module doc); returns how many were ended."""
        if not routes.is_sweeper(self.sweep_prefix):
            return 0
        timeout = routes.config.orphan_timeout_s
        reads = SWEEP_READS
        ended = 0
        for owner in routes.table.persistent_owners():
            cid = owner[2:]
            if cid.startswith("sha256:"):
                continue  # a long client id, kept hashed: its record cannot be named
            known = self._owners.get(cid)
            if known is not None:
                away = routes.absent_for(known)
                if away is None or away < timeout:
                    continue  # its gateway is live (or not away for long): it decides
            clock = routes.clock()
            if clock < self._next_read.get(cid, clock):
                continue  # read lately; nothing due before then
            if reads <= 0:
                break
            reads -= 1
            stored = await self.fetch(cid)
            if stored is None:
                # No record (never written, or cut by retention): not judged.
                self._next_read[cid] = clock + timeout
                continue
            self._owners[cid] = stored.gateway
            routes.watch_gateways.add(stored.gateway)
            if stored.gateway == self.gateway_id:
                continue
            away = routes.absent_for(stored.gateway)
            if away is None or away < timeout:
                continue  # its gateway is live, or not gone long enough
            now = time.time() * 1000
            will_due = _will_due(stored.will)
            if stored.record is not None:
                exp = stored.record.get("exp")
                gone = stored.record.get("gone") or now - away * 1000
                if exp is None or now < gone + exp * 1000:
                    # Not expired; only a will whose delay ran out to send.
                    if will_due is None or now < will_due:
                        # Read again when something falls due (at most `timeout` on).
                        wait_ms = timeout * 1000
                        for due in (None if exp is None else gone + exp * 1000, will_due):
                            if due is not None:
                                wait_ms = min(wait_ms, max(0.0, due - now))
                        self._next_read[cid] = clock + wait_ms / 1000
                        continue
                    if self._doomed.get(cid) != stored.stamp:
                        self._doomed[cid] = stored.stamp  # confirmed next round
                        continue
                    del self._doomed[cid]
                    self._send_will(cid, stored)
                    self.post_raw({"c": cid, "g": stored.gateway, "r": stored.record,
                                   "s": stored.state})
                    continue
            if self._doomed.get(cid) != stored.stamp:
                # Confirmed next round with the same record: a record being written by
                # a gateway that resumed the session meanwhile lands first.
                self._doomed[cid] = stored.stamp
                continue
            del self._doomed[cid]
            if stored.record is not None:
                self._send_will(cid, stored)  # the session ends: its will goes now
                self.post_delete(cid)
                log.info("session %r of vanished gateway %s expired", cid[:64],
                         stored.gateway)
            for route in routes.table.owner_routes(owner):
                routes.post("remove", route)
            self._owners.pop(cid, None)
            self._next_read.pop(cid, None)
            ended += 1
        if len(self._owners) > 2 * len(routes.table.persistent_owners()) + 1000:
            self._owners.clear()  # sessions ended elsewhere: keep the memo bounded
            self._doomed.clear()
            self._next_read.clear()
        return ended

    def _send_will(self, client_id: str, stored: StoredSession) -> None:
        if stored.will is None or self.on_will is None:
            return
        try:
            will = will_from_record(stored.will)
        except Exception as exc:  # noqa: BLE001 - a malformed record, not ours to fix
            log.warning("will of session %r unreadable: %r", client_id[:64], exc)
            return
        log.info("will of session %r (gateway %s vanished) published", client_id[:64],
                 stored.gateway)
        self.on_will(client_id, will)

    # -- taking a session over from the cluster ---------------------------------------------

    async def adopt(self, registry: Any, client_id: str) -> None:
        """Before a CONNECT without clean start: if another gateway wrote a newer record
        of the session than this gateway holds, drop the local copy (its routes stay) and
        rebuild the session from the record and its committed positions."""
        try:
            stored = await self.fetch(client_id)
        except (MQClientError, RemotingError, OSError) as exc:
            log.warning("session %r not read from the cluster: %r", client_id[:64], exc)
            return
        if stored is None or stored.gateway == self.gateway_id:
            return
        local = registry.sessions.get(client_id)
        if local is not None and local.cluster_stamp >= stored.stamp:
            return
        while local is not None and local.conn is not None:
            await local.conn.kick(0x8E)
            local = registry.sessions.get(client_id)
        if local is not None:
            registry.forget(local)
        if stored.record is not None:
            await self._rebuild(registry, client_id, stored)

    async def _rebuild(self, registry: Any, client_id: str, stored: StoredSession) -> None:
        from gateway.mqtt.message import now_ms
        from gateway.mqtt.registry import route_owner
        from gateway.mqtt.session import Session, Subscription, restore_state
        from gateway.mqtt.topics import parse_shared_subscription
        from gateway.routing.route_table import Route

        rec = stored.record
        assert rec is not None
        link = self.link
        subs = []
        for raw in rec.get("subs", []):
            f, qos, nl, rap, rh, sid, lmq = raw
            subs.append(Subscription(f, qos, nl, rap, rh, sid, lmq))
        keys = [(b, s.lmq) for s in subs if parse_shared_subscription(s.filter) is None
                for b in link.brokers]
        found = await self.load_offsets(client_id, keys)
        offsets = {}
        for b, lmq in keys:
            off = found.get((b, lmq))
            if off is None:  # never committed there: start at the end (nothing twice)
                off = await link.max_offset(b, lmq)
            offsets[f"{b}\x00{lmq}"] = [off, off]
        for s in subs:  # a shared group new here starts at the end, as on SUBSCRIBE
            if parse_shared_subscription(s.filter) is not None and s.lmq not in registry.groups:
                for b in link.brokers:
                    key = f"{b}\x00{s.lmq}"
                    if key not in registry._group_offsets:
                        registry._group_offsets[key] = await link.max_offset(b, s.lmq)
        if client_id in registry.sessions:
            return  # another CONNECT of this id rebuilt it meanwhile
        sess = Session(client_id, rec.get("v", 4), rec.get("exp"))
        sess.cluster_stamp = stored.stamp
        routes = registry.gw.routes
        state = stored.state if isinstance(stored.state, dict) else None
        positions = state.get("pos") if state is not None else None
        inflight = state.get("inf") or [] if state is not None else []
        if isinstance(positions, dict):
            # Where its gateway left it (delivered up to `sent`), not the committed
            # positions: the unacknowledged ones are re-sent below, not delivered anew.
            for key, pair in positions.items():
                if key in offsets and isinstance(pair, list) and len(pair) == 2:
                    offsets[key] = [int(pair[0]), int(pair[1])]
            inflight = _drop_acknowledged(offsets, inflight, found)
        for sub in subs:
            shared = parse_shared_subscription(sub.filter)
            sub.route = Route("mqtt", shared.filter if shared is not None else sub.filter,
                              sub.lmq, owner=route_owner(client_id, None))
            registry._attach(sess, sub, offsets, None)
            if routes is not None and sub.route not in routes.table:
                routes.post("add", sub.route)
        if state is not None:
            try:
                restore_state(sess, offsets, inflight, state.get("q2") or [],
                              registry.gw.retained.get)
            except (ValueError, TypeError) as exc:
                log.warning("session %r: in-flight state not restored: %r", client_id[:64],
                            exc)
            sess.dirty = True
        sess.gone_at = trio.current_time()
        sess.gone_ms = now_ms()
        registry.sessions[client_id] = sess
        registry.stored.add(client_id)
        registry.gw.store.put_session(client_id, sess.record())
        log.info("session %r taken over from gateway %s (%d subscriptions)", client_id[:64],
                 stored.gateway, len(subs))


def _drop_acknowledged(offsets: dict, inflight: list,
                       committed: dict[tuple[str, str], int]) -> list:
    """A record's positions and in-flight entries brought up to the committed positions
    of the offset table, which may be newer (a record written while connected, then a
    crash): what was acknowledged since is neither re-sent nor delivered again."""
    done = {f"{b}\x00{lmq}": off for (b, lmq), off in committed.items()}
    for key, pair in offsets.items():
        c = done.get(key)
        if c is not None and c > pair[0]:
            offsets[key] = [c, max(pair[1], c)]
    out = []
    for item in inflight:
        try:
            refs = item[5]
            left = [r for r in refs if r[1] >= done.get(r[0], -1)]
        except (IndexError, TypeError):
            out.append(item)  # restore_state judges it
            continue
        if refs and not left:
            continue  # acknowledged after the record was written
        out.append([*item[:5], left, *item[6:]] if len(left) != len(refs) else item)
    return out


def will_record(will: Any, due_ms: int) -> dict:
    """A delayed will as kept in a session record (`due_ms`: wall clock it is due)."""
    from gateway.mqtt.properties import WILL, encode_properties

    return {"t": will.topic, "p": base64.b64encode(will.payload).decode("ascii"),
            "q": will.qos, "r": will.retain, "due": due_ms,
            "pr": base64.b64encode(encode_properties(will.properties, WILL)).decode("ascii")}


def will_from_record(d: dict) -> Any:
    """The Will of `will_record` (ValueError / KeyError / TypeError when malformed)."""
    from gateway.mqtt.packets import Will
    from gateway.mqtt.properties import WILL, decode_properties

    raw = base64.b64decode(d["pr"])
    props, _ = decode_properties(memoryview(raw), 0, len(raw), WILL)
    return Will(str(d["t"]), base64.b64decode(d["p"]), int(d["q"]), bool(d["r"]), props)


def _will_due(d: Any) -> float | None:
    try:
        return float(d["due"]) if isinstance(d, dict) else None
    except (KeyError, TypeError, ValueError):
        return None
