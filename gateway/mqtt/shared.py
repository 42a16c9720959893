"""Shared subscriptions `$share/<group>/<filter>` (MQTT 5.0 §4.8.2): competing consumers.

A shared subscription has its own LMQ (the encoded `$share/<group>/<filter>` string, fed
like any filter's LMQ) and one read position per broker held by the group, not by its
members. Members take messages when they have room (a free in-flight slot, or any time at
QoS 0), so every message goes to exactly one member and a busy member gets fewer. What a
member took and has not acknowledged is remembered with it; when the member leaves
(disconnects, unsubscribes, or its session ends) those messages go back to the group and
are handed to the next member that asks, first. The group's committed position (lowest
offset not acknowledged) is persisted, so a restart re-delivers nothing acknowledged.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

import trio

from core.client import PullStatus
from gateway.mqtt.message import MqttMessage

if TYPE_CHECKING:
    from gateway.mqtt.broker_link import BrokerLink, LmqState
    from gateway.mqtt.session import Session

__all__ = ["SharedGroup"]

log = logging.getLogger(__name__)


class _Part:
    """The group's position in its LMQ on one broker."""

    __slots__ = ("st", "next", "sent", "buf", "unacked", "back", "end_version")

    def __init__(self, st: LmqState, offset: int) -> None:
        self.st = st
        self.next = offset
        self.sent = offset
        self.buf: deque[tuple[int, MqttMessage]] = deque()
        #: offset -> member holding it unacknowledged
        self.unacked: dict[int, Session] = {}
        #: returned by members that left, handed out first
        self.back: deque[tuple[int, MqttMessage]] = deque()
        self.end_version = -1

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
                if st.pending or part.end_version == st.version:
                    continue
                if st.tail == part.next:
                    part.end_version = st.version
                    continue
                v0 = st.version
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
        for part in self.parts.values():
            st = part.st
            if (not part.buf and not part.back and not st.pending
                    and part.end_version != st.version and st.tail != part.next):
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
            self.dirty = True
            return msg, broker, offset
        return None

    def ack(self, broker: str, offset: int) -> None:
        part = self.parts.get(broker)
        if part is not None and part.unacked.pop(offset, None) is not None:
            self.dirty = True
