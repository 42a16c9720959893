"""Session state: subscriptions, LMQ read positions, in-flight messages, packet ids.

A session outlives its connections (MQTT 5.0 §4.1). Its subscriptions are filters whose
LMQs the gateway multi-dispatches into; what it has read is a position per (broker, LMQ)
(`Cursor`), so offline queueing costs nothing but the LMQ index entries. Positions:

    acknowledged ... committed ... [unacked in flight] ... sent ... [buffered] ... next

* `next`  - next LMQ offset to fetch into `buf`;
* `sent`  - offset after the last entry handed to the connection (or skipped);
* `committed` - lowest offset not yet acknowledged (= min(unacked) or `sent`): a restart
  resumes there, so nothing unacknowledged is lost (QoS 0 counts as acknowledged once
  written to the socket).

`Inflight` entries are the outbound QoS 1/2 messages awaiting PUBACK / PUBREC / PUBCOMP;
each remembers the cursor positions it holds (one per overlapping subscription).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from gateway.mqtt.message import MqttMessage
from gateway.mqtt.topics import filter_matcher

if TYPE_CHECKING:
    from gateway.mqtt.broker_link import LmqState
    from gateway.mqtt.packets import Will

__all__ = ["Cursor", "Inflight", "Session", "Subscription", "compile_filter", "restore_state"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Subscription:
    """One subscription of a session (the filter as the client wrote it)."""

    filter: str
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    sub_id: int | None = None
    lmq: str = ""
    group: str | None = None  # share name of a `$share/<group>/<filter>` subscription
    topic_filter: str = ""  # the filter matched against topics (without `$share/g/`)
    route: Any = None  # its Route in the shared routing table, once added

    def record(self) -> list:
        return [self.filter, self.qos, self.no_local, self.retain_as_published,
                self.retain_handling, self.sub_id, self.lmq]


def compile_filter(topic_filter: str) -> Callable[[str], bool]:
    """A matcher for one (valid, non-shared) filter, built once: equality for a plain name,
    a prefix test for `a/b/#`, the general level walk otherwise."""
    if "+" not in topic_filter and "#" not in topic_filter:
        return topic_filter.__eq__
    if topic_filter == "#":
        return lambda topic: not topic.startswith("$")
    if topic_filter.endswith("/#") and "+" not in topic_filter and "#" not in topic_filter[:-2]:
        parent = topic_filter[:-2]
        prefix = parent + "/"
        return lambda topic: topic == parent or topic.startswith(prefix)
    return filter_matcher(topic_filter)


class Cursor:
    """A session's read position in one LMQ on one broker (see the module doc)."""

    __slots__ = ("st", "sub", "next", "sent", "unacked", "buf", "end_version", "gap_logged",
                 "retry_at", "dropped", "match", "mismatched")

    def __init__(self, st: LmqState, sub: Subscription, offset: int) -> None:
        self.st = st
        self.sub = sub
        self.next = offset
        self.sent = offset
        self.unacked: set[int] = set()
        #: fetched entries not yet handed out: (offset, message)
        self.buf: deque[tuple[int, MqttMessage]] = deque()
        #: LmqState.version at which a read found the end of the LMQ (-1: unknown)
        self.end_version = -1
        self.gap_logged = False
        self.retry_at = 0.0  # trio time before which a failed pull is not repeated
        #: QoS 0 messages skipped in the current over-max_queued_messages episode
        #: (-1: no episode)
        self.dropped = -1
        #: does a topic match the filter? (defence in depth: entries of the LMQ that do
        #: not are skipped and counted, see delivery.py)
        self.match = compile_filter(sub.topic_filter or sub.filter)
        self.mismatched = 0

    @property
    def key(self) -> str:
        return f"{self.st.broker}\x00{self.st.lmq}"

    @property
    def committed(self) -> int:
        return min(self.unacked) if self.unacked else self.sent

    def caught_up(self) -> bool:
        """Nothing more to read now: empty buffer, end seen since the last write."""
        st = self.st
        return (not self.buf and not st.pending
                and (self.end_version == st.version or st.tail == self.next))

    def reset_to(self, offset: int) -> None:
        """Restart reading at `offset` (retention moved the LMQ minimum, or lag cut)."""
        self.buf.clear()
        self.next = self.sent = offset
        self.unacked = {o for o in self.unacked if o >= offset}
        self.end_version = -1


class Inflight:
    """An outbound QoS 1/2 PUBLISH awaiting its acknowledgement flow."""

    __slots__ = ("pid", "qos", "state", "msg", "refs", "retain", "sub_ids", "retained_topic",
                 "group", "where")

    def __init__(self, pid: int, qos: int, msg: MqttMessage | None, refs: list[tuple[Cursor, int]],
                 retain: bool, sub_ids: tuple[int, ...]) -> None:
        self.pid = pid
        self.qos = qos
        self.state = "p"  # "p": PUBLISH sent; "r": PUBREC received, PUBREL sent
        self.msg = msg
        self.refs = refs
        self.retain = retain
        self.sub_ids = sub_ids
        self.retained_topic: str | None = None
        self.group: Any = None  # (SharedGroup, broker, offset) for shared subscriptions
        #: (broker, commitlog offset) of a message not loaded yet (after a restart)
        self.where: tuple[str, int] | None = None


class Session:
    """One MQTT session (see the module doc)."""

    def __init__(self, client_id: str, version: int, expiry: int | None) -> None:
        self.client_id = client_id
        self.version = version
        #: Session Expiry Interval in seconds; None = never (3.1.1 persistent session)
        self.expiry = expiry
        self.subs: dict[str, Subscription] = {}
        self.cursors: dict[tuple[str, str], Cursor] = {}
        self.inflight: dict[int, Inflight] = {}
        self.inbound_qos2: set[int] = set()
        #: messages handed to this session directly (retained on subscribe, shared
        #: subscriptions): (message, qos, retain flag, subscription ids, group ref)
        self.direct: deque[tuple[MqttMessage, int, bool, tuple[int, ...], Any]] = deque()
        self.conn: Any = None
        self.will: Will | None = None
        self.will_due: float | None = None
        self.gone_at: float | None = None  # trio time the client disconnected
        self.gone_ms: int | None = None  # wall clock of the same, persisted
        self.dirty = False
        self.ended = False
        #: commitlog offset of this session's newest record in the cluster (-1: none
        #: written by this gateway; cluster_sessions.py)
        self.cluster_stamp = -1
        self._next_pid = 1
        self._wake: trio.Event | None = None
        self._woken = False

    @property
    def persistent(self) -> bool:
        return self.expiry is None or self.expiry > 0

    # -- pump wake-ups ---------------------------------------------------------------------

    def wake(self) -> None:
        """Something changed (new LMQ data, an ack, a subscription): pump again."""
        self._woken = True
        ev = self._wake
        if ev is not None:
            ev.set()

    def deliver_now(self) -> bool:
        """Deliver what is new in the calling task, when the pump is idle and it is
        simple (delivery.Pump.deliver_now); False: wake() the pump instead."""
        conn = self.conn
        pump = conn._pump if conn is not None else None
        return pump is not None and pump.deliver_now()

    def wake_or_deliver(self) -> None:
        """Something to deliver: here and now if possible, else by the pump."""
        if not self.deliver_now():
            self.wake()

    async def wait(self) -> None:
        """Sleep until `wake()`; returns at once if woken since the last wait."""
        if not self._woken:
            ev = self._wake = trio.Event()
            await ev.wait()
            self._wake = None
        self._woken = False

    # -- packet ids ------------------------------------------------------------------------

    def next_packet_id(self) -> int:
        """A packet id not in flight (1..65535, cycling)."""
        pid = self._next_pid
        inflight = self.inflight
        for _ in range(65535):
            if pid not in inflight:
                break
            pid = pid + 1 if pid < 65535 else 1
        else:
            raise RuntimeError("no free packet identifier")
        self._next_pid = pid + 1 if pid < 65535 else 1
        return pid

    # -- acknowledgements ------------------------------------------------------------------

    def release(self, entry: Inflight) -> None:
        """The flow of `entry` is finished (acknowledged, refused or discarded)."""
        for cursor, offset in entry.refs:
            cursor.unacked.discard(offset)
        if entry.group is not None:
            group, broker, offset = entry.group
            group.ack(broker, offset)
        self.dirty = True

    def complete(self, pid: int) -> Inflight | None:
        entry = self.inflight.pop(pid, None)
        if entry is not None:
            self.release(entry)
            self.wake()
        return entry

    def complete_run(self, pids: list[int]) -> None:
        """complete() of a run of PUBACKs: each id whose flow is QoS 1 ends (others are
        ignored, as a stray PUBACK is); what the window lets out now goes out in the
        calling task if it can (deliver_now), else the pump is woken once."""
        inflight = self.inflight
        release = self.release
        ended = False
        for pid in pids:
            entry = inflight.get(pid)
            if entry is not None and entry.qos == 1:
                del inflight[pid]
                release(entry)
                ended = True
        if ended:
            self.wake_or_deliver()

    # -- persistence -------------------------------------------------------------------------

    def record(self) -> dict:
        return {"v": self.version, "exp": self.expiry,
                "subs": [s.record() for s in self.subs.values()], "gone": self.gone_ms}

    def offsets_record(self) -> dict:
        return {c.key: [c.committed, c.sent] for c in self.cursors.values()}

    def inflight_record(self) -> list:
        out = []
        for e in self.inflight.values():
            msg = e.msg
            broker, clog = (msg.broker, msg.commitlog_offset) if msg is not None else (
                e.where or ("", -1))
            out.append([
                e.pid, e.qos, e.state, broker, clog,
                [[c.key, o] for c, o in e.refs],
                e.retained_topic, e.retain, list(e.sub_ids),
            ])
        return out


def restore_state(sess: Session, offsets: dict, inflight: list, qos2: list,
                  retained: Any) -> None:
    """Put back a session's in-flight messages, inbound QoS 2 ids and positions, as
    `offsets_record` / `inflight_record` wrote them (after a restart, or from the
    session's record in the cluster). `retained(topic)` finds a retained message; other
    in-flight messages are read back when re-sent (`Inflight.where`)."""
    sess.inbound_qos2 = set(qos2)
    by_key = {c.key: c for c in sess.cursors.values()}
    for item in inflight:
        pid, qos, state, broker, clog, refs, rtopic, retain, sub_ids = item
        msg = None
        if clog < 0:
            msg = None if rtopic is None else retained(rtopic)
            if msg is None:
                continue
        ref_list = []
        for key, offset in refs:
            c = by_key.get(key)
            if c is not None:
                ref_list.append((c, offset))
                c.unacked.add(offset)
        entry = Inflight(pid, qos, msg, ref_list, retain, tuple(sub_ids))
        entry.state = state
        entry.retained_topic = rtopic
        if msg is None:
            entry.where = (broker, clog)  # read back by load_inflight_message
        sess.inflight[pid] = entry
    # Positions without an in-flight entry restart at the committed offset.
    for c in sess.cursors.values():
        pair = offsets.get(c.key)
        if pair is not None and not c.unacked:
            c.next = c.sent = pair[0]
