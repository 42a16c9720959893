"""Held pulls (long polling, docs/protocol.md §5.2).

A pull that finds no new message (code 19) and carries the SUSPEND bit waits here until
the store dispatches a message to that (topic, queue) or the suspend time is up; then the
pull processor runs the read again and answers. Waiters are kept per queue, so a dispatch
costs one dict lookup when nobody waits and wakes only the pulls of its own queue — there
is no polling loop (Java's PullRequestHoldService re-checks every 5 s; we need not).
"""

from __future__ import annotations

import trio


class _Waiter:
    __slots__ = ("offset", "event")

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.event = trio.Event()


class PullRequestHoldService:
    """Per-queue waiter sets woken by `notify` (the store's dispatch listener)."""

    def __init__(self) -> None:
        self._waiters: dict[tuple[str, int], set[_Waiter]] = {}

    @property
    def held(self) -> int:
        """Number of pulls currently held (for runtime info)."""
        return sum(len(s) for s in self._waiters.values())

    def notify(self, topic: str, queue_id: int, max_offset: int) -> None:
        """A message was dispatched: `max_offset` is the queue's new next offset. Wake every
        pull of that queue waiting for an offset below it. Runs in the writer's call
        stack, so it only sets events."""
        waiters = self._waiters.get((topic, queue_id))
        if not waiters:
            return
        woken = [w for w in waiters if w.offset < max_offset]
        for w in woken:
            w.event.set()
            waiters.discard(w)
        if not waiters:
            del self._waiters[(topic, queue_id)]

    def notify_lmqs(self, names, max_offsets) -> None:
        """notify() for the LMQs (queue 0) of one put, `max_offsets[name]` their new max
        offsets: nothing but one truth test when no pull is held."""
        waiters = self._waiters
        if waiters:
            for name in names:
                if (name, 0) in waiters:
                    self.notify(name, 0, max_offsets[name])

    async def wait(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        """Wait until (topic, queue_id) has a message at `offset` or beyond; False on
        timeout. The caller checked the queue without awaiting since, so no dispatch can
        have been missed."""
        key = (topic, queue_id)
        waiter = _Waiter(offset)
        waiters = self._waiters.get(key)
        if waiters is None:
            waiters = self._waiters[key] = set()
        waiters.add(waiter)
        try:
            with trio.move_on_after(max(0.0, timeout_s)):
                await waiter.event.wait()
        finally:
            current = self._waiters.get(key)
            if current is not None:
                current.discard(waiter)
                if not current:
                    del self._waiters[key]
        return waiter.event.is_set()

    def wake_all(self) -> None:
        """Release every held pull (shutdown): they answer with what they have."""
        for waiters in self._waiters.values():
            for w in waiters:
                w.event.set()
        self._waiters.clear()
