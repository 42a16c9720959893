"""`ProcessQueue`: a consumer's local buffer of pulled, not yet consumed messages of one queue.

It gives the consume offset to commit (the smallest offset still in flight, or one past the
largest pulled once all are done), the numbers flow control looks at (count, bytes, span,
seed 001) and, for orderly consumption, the broker lock state and the batch being consumed.
"""

from __future__ import annotations

import heapq
import time

import trio

from core.common.message import MessageExt

#: A lock older than this is treated as lost (Java REBALANCE_LOCK_MAX_LIVE_TIME); the broker
#: keeps locks 60 s and clients renew them every 20 s.
LOCK_MAX_LIVE_S = 30.0


class ProcessQueue:
    """Messages of one queue between pull and consume, ordered by queue offset."""

    def __init__(self) -> None:
        self._msgs: dict[int, MessageExt] = {}
        self._heap: list[int] = []
        self._consuming: dict[int, MessageExt] = {}  # orderly: batch handed to the listener
        self.msg_count = 0
        self.msg_size = 0
        self.queue_offset_max = -1
        self.dropped = False
        self.locked = False
        self.last_lock_time = 0.0
        self.last_pull_time = time.monotonic()
        #: Held while an orderly batch is consumed (rebalance waits for it before unlocking).
        self.consume_lock = trio.Lock()
        #: Set when messages arrive; orderly consume tasks wait on it.
        self.arrived = trio.Event()
        #: Cancel scope of the queue's pull task.
        self.pull_scope: trio.CancelScope | None = None

    # -- filling ----------------------------------------------------------------------

    def put(self, msgs: list[MessageExt]) -> None:
        for msg in msgs:
            off = msg.queue_offset
            if off in self._msgs or off in self._consuming:
                continue
            self._msgs[off] = msg
            heapq.heappush(self._heap, off)
            self.msg_count += 1
            self.msg_size += len(msg.body)
            if off > self.queue_offset_max:
                self.queue_offset_max = off
        if msgs:
            self.arrived.set()

    def _min_offset(self) -> int | None:
        heap = self._heap
        while heap and heap[0] not in self._msgs:
            heapq.heappop(heap)
        return heap[0] if heap else None

    @property
    def max_span(self) -> int:
        low = self._min_offset()
        return 0 if low is None else self.queue_offset_max - low

    @property
    def has_pending(self) -> bool:
        """Messages waiting to be taken (orderly)."""
        return bool(self._msgs)

    def is_empty(self) -> bool:
        return not self._msgs and not self._consuming

    # -- concurrent consumption ---------------------------------------------------------

    def remove(self, msgs: list[MessageExt]) -> int:
        """Forget consumed messages; return the offset to commit (-1 if nothing was pulled)."""
        for msg in msgs:
            if self._msgs.pop(msg.queue_offset, None) is not None:
                self.msg_count -= 1
                self.msg_size -= len(msg.body)
        if self.queue_offset_max < 0:
            return -1
        low = self._min_offset()
        return low if low is not None else self.queue_offset_max + 1

    # -- orderly consumption -------------------------------------------------------------

    def take(self, n: int) -> list[MessageExt]:
        """Move the `n` lowest-offset messages into the consuming batch and return them."""
        out = []
        while len(out) < n:
            low = self._min_offset()
            if low is None:
                break
            heapq.heappop(self._heap)
            msg = self._msgs.pop(low)
            self._consuming[low] = msg
            out.append(msg)
        if not self._msgs:
            self.arrived = trio.Event()
        return out

    def commit(self) -> int:
        """The consuming batch is done: return the offset after it (-1 if none)."""
        if not self._consuming:
            return -1
        last = max(self._consuming)
        for msg in self._consuming.values():
            self.msg_count -= 1
            self.msg_size -= len(msg.body)
        self._consuming.clear()
        return last + 1

    def consume_again(self, msgs: list[MessageExt]) -> None:
        """Put a failed orderly batch back, to be taken again first."""
        for msg in msgs:
            if self._consuming.pop(msg.queue_offset, None) is not None:
                self._msgs[msg.queue_offset] = msg
                heapq.heappush(self._heap, msg.queue_offset)
        if self._msgs:
            self.arrived.set()

    def clear(self) -> None:
        self._msgs.clear()
        self._heap.clear()
        self._consuming.clear()
        self.msg_count = 0
        self.msg_size = 0

    # -- locks ------------------------------------------------------------------------

    def set_locked(self, locked: bool) -> None:
        self.locked = locked
        if locked:
            self.last_lock_time = time.monotonic()

    @property
    def lock_expired(self) -> bool:
        return time.monotonic() - self.last_lock_time > LOCK_MAX_LIVE_S

    def drop(self) -> None:
        self.dropped = True
        self.arrived.set()  # wake an orderly consume task so it sees the flag
        if self.pull_scope is not None:
            self.pull_scope.cancel()
