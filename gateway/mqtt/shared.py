"""Shared subscriptions `$share/<group>/<filter>` (MQTT 5.0 §4.8.2): competing consumers.

A shared subscription has its own LMQ (the encoded `$share/<group>/<filter>` string, fed
like any filter's LMQ) and one read position per broker held by the group, not by its
members. Members take messages when they have room (a free in-flight slot, or any time at
QoS 0), so every message goes to exactly one member and a busy member gets fewer. What a
member took and has not acknowledged is remembered with it; when the member leaves
(disconnects, unsubscribes, or its session ends) those messages go back to the group and
are handed to the next member that asks, first. The group's committed position (lowest
offset not acknowledged) is persisted, so a restart re-delivers nothing acknowledged.

With several gateways on one cluster (`link.foreign_writers`) a group is read by the
broker's POP instead (`use_pop`, docs/stateless-gateways.md): the POP consumer group
`MQTT_SHARE_<sha256(LMQ)>` is the same on every gateway, so members on all gateways
compete for the messages and the in-flight state lives in the broker. A gateway pops only
as many messages as its members have room for; a QoS 0 delivery is acknowledged (ACK) when
it is written, a QoS 1/2 one when its flow completes (PUBACK / PUBCOMP). While a gateway
holds a message (a member's unacknowledged delivery, or one waiting for room) its invisible
time is renewed every `SHARE_RENEW_S`. Messages a gateway holds when its last member
leaves are made visible again at once (invisible time 0); those of a gateway that died
come back after at most `SHARE_INVISIBLE_MS`.
"""

from __future__ import annotations

import hashlib
import logging
from collections import deque
from typing import TYPE_CHECKING

import trio

from core.client import PullStatus
from core.client.pop_consumer import INIT_MODE_MAX, PopClient, PopStatus
from gateway.mqtt.message import MqttMessage

if TYPE_CHECKING:
    from gateway.mqtt.broker_link import BrokerLink, LmqState
    from gateway.mqtt.session import Session

__all__ = ["SHARE_INVISIBLE_MS", "SHARE_REPOLL_S", "SharedGroup", "pop_group_name"]

log = logging.getLogger(__name__)

#: POP invisible time of a `$share` delivery (several gateways): a message popped by a
#: gateway that dies unacknowledged is handed out again after this long.
SHARE_INVISIBLE_MS = 60_000
#: A group with members pops again at least this often, even without a new write: it
#: finds messages other gateways released or let time out.
SHARE_REPOLL_S = 5.0
#: Answer time allowed for one POP / ACK request.
SHARE_REQUEST_TIMEOUT_S = 5.0
#: A message this gateway holds (a member's unacknowledged QoS 1/2 delivery, or one
#: waiting for a member's room) has its invisible time renewed to SHARE_INVISIBLE_MS
#: (CHANGE_MESSAGE_INVISIBLETIME) this long after it was popped or last renewed, so the
#: broker does not hand it to another gateway's member while it is held here.
SHARE_RENEW_S = 20.0


def pop_group_name(lmq: str) -> str:
    """The POP consumer group of a shared subscription's LMQ (same on every gateway)."""
    return "MQTT_SHARE_" + hashlib.sha256(lmq.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def _mark(st: LmqState) -> tuple[int, int]:
    """What "nothing new since" is judged by: the LMQ state's version and its known end.
    Both count: readers of an LMQ other gateways write learn of new entries by `top` alone
    (lmq_watch.py raises it without moving the version)."""
    return st.version, st.top


class _Part:
    """The group's position in its LMQ on one broker."""

    __slots__ = ("st", "next", "sent", "buf", "unacked", "back", "end_version", "handles",
                 "renew_at")

    def __init__(self, st: LmqState, offset: int) -> None:
        self.st = st
        self.next = offset
        self.sent = offset
        self.buf: deque[tuple[int, MqttMessage]] = deque()
        #: offset -> member holding it unacknowledged
        self.unacked: dict[int, Session] = {}
        #: returned by members that left, handed out first
        self.back: deque[tuple[int, MqttMessage]] = deque()
        #: _mark() of the LMQ state when this part last found nothing new (-1: unknown)
        self.end_version: tuple[int, int] | int = -1
        #: POP mode: offset -> (client, popped message) not yet acknowledged
        self.handles: dict[int, tuple] = {}
        #: POP mode: offset -> trio time its invisible time is renewed (SHARE_RENEW_S)
        self.renew_at: dict[int, float] = {}

    @property
    def committed(self) -> int:
        low = self.sent
        if self.unacked:
            low = min(low, min(self.unacked))
        if self.back:
            low = min(low, min(o for o, _ in self.back))
        return low


class SharedGroup:
    """One `$share/<group>/<filter>` subscription across its members."""

    def __init__(self, lmq: str, share_name: str, topic_filter: str) -> None:
        self.lmq = lmq
        self.share_name = share_name
        self.topic_filter = topic_filter
        self.parts: dict[str, _Part] = {}
        self.members: list[Session] = []
        self.holders = 0  # sessions (online or not) subscribed: the filter stays live
        self._filling: trio.Event | None = None
        self.dirty = False
        #: POP mode (several gateways): the link and the POP client per broker
        self.link: BrokerLink | None = None
        self._pop_clients: dict[str, PopClient] = {}
        self._acks: list[tuple[PopClient, object]] = []
        self._nacks: list[tuple[PopClient, object]] = []
        self._work = trio.Event()
        self.closed = False

    def key(self, broker: str) -> str:
        return f"{broker}\x00{self.lmq}"

    def part(self, link: BrokerLink, broker: str, offset: int) -> _Part:
        part = self.parts.get(broker)
        if part is None:
            part = self.parts[broker] = _Part(link.state(broker, self.lmq), offset)
        return part

    # -- membership -------------------------------------------------------------------------

    def join(self, session: Session, link: BrokerLink) -> None:
        if session not in self.members:
            self.members.append(session)
        for broker, part in self.parts.items():
            st = link.state(broker, self.lmq)  # released while nobody read it?
            if st is not part.st:
                part.st = st
                part.end_version = -1  # versions of the old state mean nothing here
            st.watchers.add(session)
            if self.link is not None:
                part.end_version = -1  # room for more: pop again

    def leave(self, session: Session, link: BrokerLink) -> None:
        """`session` is gone: what it holds unacknowledged goes back to the group."""
        if session in self.members:
            self.members.remove(session)
        for part in self.parts.values():
            part.st.watchers.discard(session)
            if not part.st.watchers:
                link.release(part.st)
        returned = 0
        for pid, entry in list(session.inflight.items()):
            if entry.group is not None and entry.group[0] is self:
                _, broker, offset = entry.group
                part = self.parts.get(broker)
                del session.inflight[pid]
                if part is not None and part.unacked.pop(offset, None) is not None:
                    part.back.append((offset, entry.msg))
                    returned += 1
        kept = deque()
        for item in session.direct:
            group = item[4]
            if group is not None and group[0] is self:
                _, broker, offset = group
                part = self.parts.get(broker)
                if part is not None and part.unacked.pop(offset, None) is not None:
                    part.back.append((offset, item[0]))
                    returned += 1
            else:
                kept.append(item)
        session.direct = kept
        if self.link is not None and not self.members:
            self._release_held()  # nobody here takes them: visible to other gateways
            return
        if returned:
            for part in self.parts.values():
                if len(part.back) > 1:
                    part.back = deque(sorted(part.back, key=lambda x: x[0]))
            self.wake_members()

    def wake_members(self) -> None:
        for m in self.members:
            m.wake()

    # -- reading ---------------------------------------------------------------------------

    async def fill(self, link: BrokerLink, batch: int) -> None:
        """Read the next entries of every part whose buffer ran dry (one reader at a time)."""
        if self._filling is not None:
            await self._filling.wait()  # another member is reading for the group
            return
        self._filling = trio.Event()
        try:
            if self.link is not None:
                await self._fill_pop(batch)
                return
            got = False
            for broker, part in list(self.parts.items()):
                if part.buf or part.back:
                    continue
                st = part.st
                recent = st.recent
                if part.next in recent:
                    n = part.next
                    while n in recent and len(part.buf) < batch:
                        part.buf.append((n, recent[n]))
                        n += 1
                    part.next = n
                    got = True
                    continue
                if st.pending or part.end_version == _mark(st):
                    continue
                if st.tail == part.next:
                    part.end_version = _mark(st)
                    continue
                v0 = _mark(st)
                result = await link.pull(st, part.next)
                if result.status is PullStatus.FOUND:
                    for msg in result.messages:
                        pos = msg.lmq_offsets.get(self.lmq)
                        if pos is not None and pos >= part.next:
                            part.buf.append((pos, msg))
                            got = True
                    part.next = max(part.next, result.next_begin_offset)
                    if result.next_begin_offset >= result.max_offset:
                        part.end_version = v0
                elif result.status is PullStatus.NO_NEW_MSG:
                    part.end_version = v0
                elif result.status is PullStatus.NO_MATCHED_MSG:
                    part.next = max(part.next, result.next_begin_offset)
                else:
                    log.warning("shared group %s@%s skips from %d to %d", self.lmq, broker,
                                part.next, result.next_begin_offset)
                    part.buf.clear()
                    part.next = part.sent = result.next_begin_offset
                    part.unacked = {o: s for o, s in part.unacked.items() if o >= part.next}
                if not part.buf and not part.unacked and not part.back:
                    part.sent = max(part.sent, part.next)
            if got:
                self.wake_members()
        finally:
            self._filling.set()
            self._filling = None

    def needs_pull(self) -> bool:
        if self.link is not None:
            if self.closed or not self._room(1):
                return False
            return any(not p.buf and not p.back and p.end_version != _mark(p.st)
                       for p in self.parts.values())
        for part in self.parts.values():
            st = part.st
            if (not part.buf and not part.back and not st.pending
                    and part.end_version != _mark(st) and st.tail != part.next):
                return True
        return False

    def take(self, session: Session) -> tuple[MqttMessage, str, int] | None:
        """The next message for `session` to deliver (it now holds it), or None."""
        for broker, part in self.parts.items():
            if part.back:
                offset, msg = part.back.popleft()
            elif part.buf:
                offset, msg = part.buf.popleft()
                part.sent = offset + 1
            else:
                continue
            part.unacked[offset] = session
            self.dirty = self.link is None
            return msg, broker, offset
        return None

    def ack(self, broker: str, offset: int) -> None:
        part = self.parts.get(broker)
        if part is not None and part.unacked.pop(offset, None) is not None:
            if self.link is None:
                self.dirty = True
                return
            held = part.handles.pop(offset, None)
            if held is not None:
                self._acks.append(held)
                self._work.set()

    # -- POP mode (several gateways) ---------------------------------------------------------

    def use_pop(self, link: BrokerLink, nursery: trio.Nursery) -> None:
        """Read this group by POP from now on (before any member took a message)."""
        self.link = link
        nursery.start_soon(self._pop_loop)

    def close(self) -> None:
        """The last holder left: release what this gateway holds and stop."""
        if self.link is not None and not self.closed:
            self.closed = True
            self._release_held()

    def _client(self, broker: str) -> PopClient:
        link = self.link
        addr = link.addr(broker)
        pc = self._pop_clients.get(broker)
        if pc is None or pc.broker_addr != addr:
            pc = self._pop_clients[broker] = PopClient(
                link.client.api.remoting, addr, broker, pop_group_name(self.lmq),
                timeout_s=SHARE_REQUEST_TIMEOUT_S)
        return pc

    def _room(self, batch: int) -> int:
        """How many messages the connected members can take now (at most `batch`)."""
        room = 0
        for m in self.members:
            conn = m.conn
            if conn is not None:
                room += max(0, conn.inflight_limit - len(m.inflight))
                if room >= batch:
                    return batch
        return room

    async def _fill_pop(self, batch: int) -> None:
        link = self.link
        got = False
        for broker, part in list(self.parts.items()):
            if self.closed:
                return
            st = part.st
            if part.buf or part.back or part.end_version == _mark(st):
                continue
            room = self._room(batch)
            if not room:
                return
            if st.watchers and link.foreign_writers:
                link._watch(st)  # wakes the members when any gateway writes the LMQ
            v0 = _mark(st)
            pc = self._client(broker)
            # Not cancelled half-way (a member's connection closing): messages the broker
            # handed out must reach this group, or be released (bounded by the timeout).
            with trio.CancelScope(shield=True):
                result = await pc.pop(self.lmq, max_nums=room,
                                      invisible_ms=SHARE_INVISIBLE_MS, init_mode=INIT_MODE_MAX)
            if result.status != PopStatus.FOUND:
                part.end_version = v0  # nothing visible: the next write or repoll
                continue
            if self.closed or not self.members or self.parts.get(broker) is not part:
                self._nacks.extend((pc, pm) for pm in result.messages)
                self._work.set()
                continue
            for pm in result.messages:
                msg = link.decode(pm.message, broker)
                if msg is None:  # not a gateway's record: nobody here can deliver it
                    self._acks.append((pc, pm))
                    self._work.set()
                    continue
                part.handles[pm.queue_offset] = (pc, pm)
                part.renew_at[pm.queue_offset] = trio.current_time() + SHARE_RENEW_S
                part.buf.append((pm.queue_offset, msg))
                got = True
            if result.rest_num <= 0:
                part.end_version = v0
        if got:
            self.wake_members()

    def _release_held(self) -> None:
        """Make every message this gateway holds and no member has visible again."""
        for part in self.parts.values():
            for offset, _ in list(part.buf) + list(part.back):
                held = part.handles.pop(offset, None)
                if held is not None:
                    self._nacks.append(held)
            part.buf.clear()
            part.back.clear()
            part.end_version = -1
        self._work.set()

    async def _pop_loop(self) -> None:
        """Send the acknowledgements and releases; renew what is held; repoll now and
        then."""
        while True:
            with trio.move_on_after(SHARE_REPOLL_S):
                await self._work.wait()
            self._work = trio.Event()
            await self._renew_held()
            acks, self._acks = self._acks, []
            nacks, self._nacks = self._nacks, []
            if not acks and not nacks:
                if self.members and not self.closed:
                    for part in self.parts.values():
                        part.end_version = -1
                    self.wake_members()
                continue
            by_client: dict[int, tuple[PopClient, list]] = {}
            for pc, pm in acks:
                by_client.setdefault(id(pc), (pc, []))[1].append(pm)
            for pc, pms in by_client.values():
                for start in range(0, len(pms), 32):
                    try:
                        await pc.batch_ack(pms[start:start + 32])
                    except Exception as exc:  # noqa: BLE001 - the gateway keeps running
                        # Unacknowledged: handed out again after the invisible time.
                        log.warning("ack of %d $share message(s) of %s failed: %r",
                                    len(pms), self.lmq, exc)
            for pc, pm in nacks:
                try:
                    await pc.nack(pm)
                except Exception as exc:  # noqa: BLE001 - it times out instead
                    log.debug("release of a $share message of %s failed: %r", self.lmq, exc)
            if self.closed and not self._acks and not self._nacks:
                return

    async def _renew_held(self) -> None:
        """Extend the invisible time of the messages held here whose renewal is due (in
        this task, so an ack sent later carries the renewed handle)."""
        now = trio.current_time()
        for part in self.parts.values():
            for offset, due in list(part.renew_at.items()):
                held = part.handles.get(offset)
                if held is None:
                    del part.renew_at[offset]  # acknowledged or released meanwhile
                    continue
                if now < due or self.closed:
                    continue
                pc, pm = held
                try:
                    current = await pc.change_invisible(pm, SHARE_INVISIBLE_MS)
                except Exception as exc:  # noqa: BLE001 - tried again at the next round
                    log.debug("renewal of a $share message of %s failed: %r", self.lmq, exc)
                    continue
                if current:
                    part.renew_at[offset] = trio.current_time() + SHARE_RENEW_S
                else:
                    part.renew_at.pop(offset, None)  # handed out again already
