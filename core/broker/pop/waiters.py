"""The long polls of the POP service (`PopService`'s wake-ups; docs/pop.md "Model" and
"Delivery at arrival").

A held pop parks in `wait` on an event (or a `Parked`, which takes what arrives through
a hand-off, handoff.py) under its topic; a dispatch to the topic (`on_dispatch`, or
`on_dispatch_lmqs` for the LMQs of one multi-dispatched put) sets all of them once and
forgets them; `wake_all` sets every one.
"""

from __future__ import annotations

import trio

from core.broker.pop.handoff import HandOffs, Parked

__all__ = ["PopWaiters"]


class PopWaiters:
    """A mixin of `PopService`: its parked pops by topic, their hand-offs and count."""

    def _init_waiters(self) -> None:
        self._waiters: dict[str, set[trio.Event | Parked]] = {}
        self.handoffs = HandOffs(self._waiters)  # delivery at arrival (handoff.py)
        self.polling = 0  # pops held in `wait` now

    def on_dispatch(self, topic: str, queue_id: int, max_offset: int) -> None:
        waiters = self._waiters.pop(topic, None)
        if waiters:
            for ev in waiters:
                ev.set()

    def on_dispatch_lmqs(self, names, max_offsets) -> None:
        """The LMQs one put multi-dispatched to, in one call (core/broker/arrival.py):
        each name's waiters woken once."""
        waiters = self._waiters
        if not waiters:
            return
        for name in names:
            found = waiters.pop(name, None)
            if found:
                for ev in found:
                    ev.set()

    def wake_all(self) -> None:
        for waiters in self._waiters.values():
            for ev in waiters:
                ev.set()
        self._waiters.clear()

    async def wait(self, topic: str, timeout_s: float, parked: Parked | None = None) -> None:
        """Until something may be visible in `topic`, or `timeout_s` passed; `parked`
        takes what arrives meanwhile through its hand-off (handoff.py)."""
        ev = trio.Event() if parked is None else parked
        waiters = self._waiters.setdefault(topic, set())
        waiters.add(ev)
        self.polling += 1
        try:
            with trio.move_on_after(max(0.0, timeout_s)):
                await (ev if parked is None else parked.event).wait()
        finally:
            self.polling -= 1
            current = self._waiters.get(topic)
            if current is not None:
                current.discard(ev)
                if not current:
                    del self._waiters[topic]
