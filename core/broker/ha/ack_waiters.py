"""SYNC_MASTER waits (docs/ha.md): sends and POP acks wait for the slaves' reports."""

from __future__ import annotations

import heapq
import itertools

import trio


class AckWaiters:
    """Tasks waiting until an acknowledged position reaches theirs. A heap by position,
    so a report wakes only the waiters it covers."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, trio.Event]] = []  # (position, seq, event)
        self._seq = itertools.count()

    async def wait(self, position: int, timeout_s: float) -> None:
        """Until `release` covers `position`, at most `timeout_s`."""
        ev = trio.Event()
        heapq.heappush(self._heap, (position, next(self._seq), ev))
        with trio.move_on_after(timeout_s):
            await ev.wait()

    def release(self, acked: int | None) -> None:
        """Wake the waiters at or below `acked`; None wakes every one."""
        heap = self._heap
        if acked is None:
            for _pos, _seq, ev in heap:
                ev.set()
            heap.clear()
            return
        while heap and heap[0][0] <= acked:
            heapq.heappop(heap)[2].set()
