"""Delivery at arrival: a pop parked in process takes its message without waking its task
(docs/pop.md "Delivery at arrival").

A long-polling pop (`pop_held`) parks on an event that the dispatch of a message sets;
its task then wakes, pops, delivers, pops again (nothing left) and parks again. A caller
in the broker's process may park with a hand-off instead (`Parked`): a synchronous
function that pops and delivers on the spot (the AMQP gateway's consumer writes the
frames straight to its socket). The arrival never runs it inside the put (that is the
store's writer): it queues it in the `HandOffs` of the POP service when the put happens
inside a deferral window, and the window runs the queued hand-offs when it ends.

A window is the synchronous stretch of a store call (`deferring(coro)`): from the call
until its coroutine either returns or first suspends (a SYNC_FLUSH put waiting for its
flush, a replication wait). Since the event loop runs nothing else meanwhile, a hand-off
run when the window ends comes no later than the woken task would have run: never later
than before. A put outside any window (the revive timer, a requeue, a delayed or
replicated message) sets the event as it always did.

What a hand-off answers decides the parked pop's fate: `PARK` (done, or nothing left to
take: it stays parked, its task asleep), `WAKE` (wake the task, which pops as a woken
long poll does), `RETURN` (wake the task and end the held pop with nothing found: its
caller looks at its state again — it could not be done synchronously).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

import trio

__all__ = ["HandOffs", "Parked", "PARK", "RETURN", "WAKE", "deferring"]

log = logging.getLogger(__name__)

PARK = 0
WAKE = 1
RETURN = 2


class Parked:
    """A held pop that takes what arrives through a hand-off (module doc). Its `set`
    stands for the event's in the service's waiter sets: inside a deferral window it
    queues the hand-off, outside it wakes the task (a plain wake-up, `WAKE`)."""

    __slots__ = ("event", "hand_off", "topic", "outcome", "max_nums", "_pop", "_queue")

    def __init__(self, queue: HandOffs, topic: str, hand_off: Callable[..., int],
                 max_nums: int, pop: Callable[[int], Any]) -> None:
        self.event = trio.Event()
        self.hand_off = hand_off
        self.topic = topic
        self.outcome = WAKE
        #: At most this many messages for the parked pop when its task wakes (the
        #: hand-off sets it when its deliveries changed the room its caller had).
        self.max_nums = max_nums
        self._pop = pop
        self._queue = queue

    def set(self) -> None:
        queue = self._queue
        if queue.depth:
            queue.pending.append(self)
        else:
            self.event.set()

    def pop(self, max_nums: int):
        """The parked pop's `PopService.pop` (same group, queues, deadline, holder, init
        mode, order and volatility), now, for at most `max_nums` messages: a
        `PopBatch`."""
        return self._pop(max_nums)


class HandOffs:
    """The hand-offs queued by arrivals inside a deferral window, run when it ends."""

    def __init__(self, waiters: dict[str, set]) -> None:
        self._waiters = waiters  # the POP service's parked pops by topic
        self.depth = 0  # windows open (nested store calls)
        self.pending: list[Parked] = []
        #: Hand-offs run, and those that left their task asleep (tests, metrics).
        self.runs = 0
        self.parked = 0

    def run(self) -> None:
        """Run the queued hand-offs (at the end of the outermost window), then what they
        left to do once per run (a connection's socket write for all its consumers)."""
        after: dict[Any, Callable[[], None]] = {}
        while self.pending:
            pending, self.pending = self.pending, []
            for parked in pending:
                if parked.event.is_set():
                    continue  # woken meanwhile (its task runs anyway)
                self.runs += 1
                try:
                    outcome = parked.hand_off(parked, after)
                except Exception:
                    log.exception("POP hand-off failed (its consumer is woken instead)")
                    outcome = RETURN
                if outcome == PARK:
                    self.parked += 1
                    self._waiters.setdefault(parked.topic, set()).add(parked)
                else:
                    parked.outcome = outcome
                    parked.event.set()
        for fn in after.values():
            try:
                fn()
            except Exception:
                log.exception("POP hand-off completion failed")


class _Deferring:
    """Awaits `coro` as a deferral window of `handoffs` (see `deferring`)."""

    __slots__ = ("_coro", "_handoffs")

    def __init__(self, coro: Coroutine, handoffs: HandOffs) -> None:
        self._coro = coro
        self._handoffs = handoffs

    def __await__(self):
        coro, q = self._coro, self._handoffs
        value: Any = None
        error: BaseException | None = None
        while True:
            q.depth += 1
            try:
                signal = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                return stop.value
            finally:
                q.depth -= 1
                if not q.depth and q.pending:
                    q.run()  # the window ends: the call returned or is about to wait
            try:
                value, error = (yield signal), None
            except BaseException as exc:  # thrown into the awaiting task: pass it on
                value, error = None, exc


def deferring(broker: Any, coro: Coroutine):
    """Await `coro` (a store call) as a deferral window of `broker`'s POP service: the
    hand-offs its puts queue run when it returns or first suspends. `coro` itself when
    the broker has no POP service, or inside a window already (called from a store call
    awaited as one: that window covers it, and ends at the same suspensions)."""
    service = getattr(broker, "pop_service", None)
    if service is None or service.handoffs.depth:
        return coro
    return _Deferring(coro, service.handoffs)
