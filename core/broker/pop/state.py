"""Per-message acknowledgement state of POP consumption (docs/pop.md).

One `QueueState` per (group, topic, queue): the pop cursor (`next_offset`, the first
offset never handed out) and the messages handed out and not yet acknowledged
(`inflight`). Every hand-out gets a fresh `pop_time` from `PopState.new_pop_time` —
strictly increasing per broker — which the receipt handle carries; an ACK or
CHANGE_INVISIBLETIME is honoured only when the handle's pop time is the entry's current
one, so a handle of an earlier delivery (the message was since redelivered to someone
else) never acks the newer delivery.

A message is visible again when its deadline passes or its invisible time is changed to
0; visible messages are handed out before new ones, lowest offset first. The group's
consumed offset is the lowest offset still in flight (or `next_offset` when none is):
acknowledged messages below the first outstanding one form the contiguous acked range.

Everything here is plain data touched from the event loop only; every operation is
O(log n) in the number of in-flight messages of one queue (heaps with lazy deletion).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

__all__ = ["Inflight", "QueueState", "PopState", "DEAD_LETTERING"]

#: `Inflight.deadline` of a message on its way to the dead-letter topic.
DEAD_LETTERING = -1


class Inflight:
    """One handed-out message. `deadline` 0 = visible again (waiting for redelivery),
    DEAD_LETTERING = being moved to the group's %DLQ% topic."""

    __slots__ = ("pop_time", "deadline", "deliveries", "holder")

    def __init__(self, pop_time: int, deadline: int, deliveries: int) -> None:
        self.pop_time = pop_time
        self.deadline = deadline
        self.deliveries = deliveries
        self.holder: str | None = None  # who holds it (POP holders, docs/pop.md)


class QueueState:
    """Acknowledgement state of one (group, topic, queue)."""

    __slots__ = ("next_offset", "inflight", "_ready", "_deadlines", "_low", "journal")

    def __init__(self, next_offset: int, journal=None) -> None:
        self.next_offset = next_offset
        #: Where this state's records go: the broker's `PopJournal`, or `DISCARD` for a
        #: volatile state (journal.py, docs/pop.md "Volatile states").
        self.journal = journal
        self.inflight: dict[int, Inflight] = {}
        self._ready: list[int] = []  # heap of offsets visible again
        self._deadlines: list[tuple[int, int, int]] = []  # (deadline, offset, pop_time)
        self._low: list[int] = []  # heap of in-flight offsets (lazy)

    # ------------------------------------------------------------------ queries
    def committed(self) -> int:
        """The consumed offset: everything below it is acknowledged."""
        low = self._low
        inflight = self.inflight
        while low and low[0] not in inflight:
            heapq.heappop(low)
        return low[0] if low else self.next_offset

    def next_deadline(self) -> int | None:
        """The earliest pending deadline (ms), None when nothing is invisible."""
        dl = self._deadlines
        inflight = self.inflight
        while dl:
            deadline, offset, pop_time = dl[0]
            entry = inflight.get(offset)
            if entry is not None and entry.pop_time == pop_time and entry.deadline == deadline:
                return deadline
            heapq.heappop(dl)
        return None

    def has_visible(self, now_ms: int) -> bool:
        self.expire(now_ms)
        ready = self._ready
        inflight = self.inflight
        while ready:
            entry = inflight.get(ready[0])
            if entry is not None and entry.deadline == 0:
                return True
            heapq.heappop(ready)
        return False

    # ------------------------------------------------------------------ changes
    def expire(self, now_ms: int, limit: int = 1 << 30,
               out: list[tuple[int, Inflight]] | None = None) -> int:
        """Make messages whose deadline passed visible again (at most `limit`); append
        them to `out` when given."""
        dl = self._deadlines
        inflight = self.inflight
        done = 0
        while dl and dl[0][0] <= now_ms and done < limit:
            deadline, offset, pop_time = heapq.heappop(dl)
            entry = inflight.get(offset)
            if entry is not None and entry.pop_time == pop_time and entry.deadline == deadline:
                entry.deadline = 0
                heapq.heappush(self._ready, offset)
                done += 1
                if out is not None:
                    out.append((offset, entry))
        return done

    def park(self, entry: Inflight) -> None:
        """Take a message out of circulation (being dead-lettered): neither visible nor
        timed; `drop` or `make_visible` ends it."""
        entry.deadline = DEAD_LETTERING

    def take_visible(self, now_ms: int, max_count: int) -> Iterator[tuple[int, Inflight]]:
        """Visible (redeliverable) messages, lowest offset first; the caller re-hands
        each one out with `redeliver` (or leaves it visible by not doing so)."""
        self.expire(now_ms)
        ready = self._ready
        inflight = self.inflight
        taken = 0
        while ready and taken < max_count:
            offset = ready[0]
            entry = inflight.get(offset)
            if entry is None or entry.deadline != 0:
                heapq.heappop(ready)
                continue
            heapq.heappop(ready)
            taken += 1
            yield offset, entry

    def hand_out(self, offset: int, pop_time: int, invisible_ms: int) -> Inflight:
        """First delivery of `offset` (the cursor moves past it)."""
        deadline = pop_time + invisible_ms
        entry = Inflight(pop_time, deadline, 1)
        self.inflight[offset] = entry
        heapq.heappush(self._low, offset)
        heapq.heappush(self._deadlines, (deadline, offset, pop_time))
        if offset >= self.next_offset:
            self.next_offset = offset + 1
        return entry

    def restore(self, offset: int, pop_time: int, deadline: int, deliveries: int) -> Inflight:
        """An in-flight message read back from the journal."""
        entry = Inflight(pop_time, deadline, deliveries)
        self.inflight[offset] = entry
        heapq.heappush(self._low, offset)
        if deadline <= 0:
            self.make_visible(offset, entry)
        else:
            heapq.heappush(self._deadlines, (deadline, offset, pop_time))
        return entry

    def redeliver(self, offset: int, entry: Inflight, pop_time: int, invisible_ms: int) -> None:
        entry.pop_time = pop_time
        entry.deadline = pop_time + invisible_ms
        entry.deliveries += 1
        heapq.heappush(self._deadlines, (entry.deadline, offset, pop_time))

    def make_visible(self, offset: int, entry: Inflight) -> None:
        """Put a taken message back (it could not be sent, or it was nacked)."""
        entry.deadline = 0
        heapq.heappush(self._ready, offset)

    def ack(self, offset: int, pop_time: int) -> bool:
        """Acknowledge; False when the handle is not the message's current one."""
        entry = self.inflight.get(offset)
        if entry is None or entry.pop_time != pop_time or entry.deadline == DEAD_LETTERING:
            return False
        del self.inflight[offset]
        self._maybe_compact()
        return True

    def _maybe_compact(self) -> None:
        """Rebuild the heaps when stale entries (acked messages, old deadlines) outnumber
        the live ones, so memory stays O(in-flight) whatever the invisible times."""
        limit = 2 * len(self.inflight) + 64
        if len(self._deadlines) <= limit and len(self._low) <= limit and len(self._ready) <= limit:
            return
        inflight = self.inflight
        self._low = list(inflight)
        heapq.heapify(self._low)
        self._deadlines = [(e.deadline, o, e.pop_time) for o, e in inflight.items() if e.deadline > 0]
        heapq.heapify(self._deadlines)
        self._ready = [o for o, e in inflight.items() if e.deadline == 0]
        heapq.heapify(self._ready)

    def change(self, offset: int, pop_time: int, new_pop_time: int, invisible_ms: int) -> bool:
        """New deadline `new_pop_time + invisible_ms` (0 ms: visible at once)."""
        entry = self.inflight.get(offset)
        if entry is None or entry.pop_time != pop_time or entry.deadline == DEAD_LETTERING:
            return False
        entry.pop_time = new_pop_time
        if invisible_ms <= 0:
            self.make_visible(offset, entry)
        else:
            entry.deadline = new_pop_time + invisible_ms
            heapq.heappush(self._deadlines, (entry.deadline, offset, new_pop_time))
        return True

    def drop(self, offset: int) -> None:
        """Forget a message for good (dead-lettered, or gone from the store)."""
        self.inflight.pop(offset, None)
        self._maybe_compact()


class PopState:
    """All queue states of a broker, and the pop-time clock."""

    def __init__(self) -> None:
        self.queues: dict[tuple[str, str, int], QueueState] = {}
        self._last_pop_time = 0

    def new_pop_time(self, now_ms: int) -> int:
        """A pop time unique on this broker (the generation of a delivery)."""
        t = now_ms if now_ms > self._last_pop_time else self._last_pop_time + 1
        self._last_pop_time = t
        return t

    def get(self, group: str, topic: str, queue_id: int) -> QueueState | None:
        return self.queues.get((group, topic, queue_id))

    def get_or_create(self, group: str, topic: str, queue_id: int, start: int,
                      journal=None) -> QueueState:
        key = (group, topic, queue_id)
        qs = self.queues.get(key)
        if qs is None:
            qs = self.queues[key] = QueueState(start, journal)
        return qs

    def inflight_count(self) -> int:
        return sum(len(q.inflight) for q in self.queues.values())

    def journaled_records(self) -> int:
        """Records a snapshot of the durable states would hold (journal compaction)."""
        return sum(len(q.inflight) + 1 for q in self.queues.values()
                   if q.journal is None or not q.journal.volatile)
