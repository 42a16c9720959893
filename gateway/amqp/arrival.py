"""Delivery at arrival: a consumer parked in its pop gets a message without its task
waking (docs/amqp.md "Delivery at arrival"; the broker side is
core/broker/pop/handoff.py). A mixin of `Deliveries` (gateway/amqp/consume.py).

In process, a consumer loop parks its pop with a hand-off (`Consumer.take_arrival`).
When a store call that dispatched a message to the queue ends, the hand-off runs
`deliver_now`: the pop, the Basic.Deliver frames as the consumer loop builds them, and
the socket write straight from that call (`Wire.write_now`), once per connection for all
the hand-offs of that store. Whatever cannot be done there and then is left to the
consumer's task, which then runs as when a dispatch woke it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from core.broker.pop.handoff import PARK, RETURN, WAKE

__all__ = ["AtArrival", "wire_of"]


def wire_of(flush: Callable) -> Any:
    """The `Wire` behind a channel's `flush` (the session's `_flush`, which awaits the
    session's `flush`: its Wire's), when it can write without awaiting; else None (a
    stand-in of the tests)."""
    session = getattr(flush, "__self__", None)
    wire = getattr(getattr(session, "flush", None), "__self__", None)
    return wire if hasattr(wire, "write_now") else None


class AtArrival:
    """Deliveries at arrival of `Deliveries` (which provides `broker`, `closed`, `flush`,
    `send_parts`, `next_tag`, `unacked`, `_wire`, `_room_left`, `_frames`, and
    `_deferred_writes`: the connections whose write a consumer task put off to the end of
    its scheduler batch)."""

    def deliver_now(self, consumer: Any, parked: Any, after: dict) -> int:
        """The hand-off of `consumer`'s parked pop, run when the store call that
        dispatched to its queue ends. Pops what arrived and queues its frames, the socket
        write left to `after` (one per connection and run), without waking the
        consumer's task: PARK (it stays parked). Anything that cannot be done here and
        now answers RETURN before popping (the task looks again, as when it was woken):
        cancelled or closed, another writer on the socket, no prefetch room,
        x-single-active-consumer not active here. A message that must be dead-lettered
        is left with the rest of its pop to the task (`Consumer.stash`), and so is a
        pop whose frames failed (the exception goes on to `HandOffs.run`: RETURN)."""
        if consumer.cancelled or self.closed:
            return RETURN
        queue = consumer.queue
        broker = self.broker
        if queue.waiting and (queue.waiting[0] is not consumer or not broker.sac.active(queue)):
            return RETURN
        room = broker.config.pop_batch if consumer.no_ack else self._room_left()
        if room <= 0 or not self._wire.can_write_now():
            return RETURN
        batch = parked.pop(room)
        if not batch.count:
            return PARK  # taken by another consumer
        pop = consumer.pop
        result = pop.local_result(batch, consumer.queue_lmq, broker.config.invisible_ms)
        messages = result.messages
        parts: list = []
        first_tag = self.next_tag
        try:
            i, fault = self._frames(consumer, messages, 0, parts)
        except Exception:
            # Nothing went out: the tags it took are void, the pop is the task's (which
            # meets the same failure as after a pop of its own). Logged by the caller.
            for tag in range(first_tag, self.next_tag):
                self.unacked.pop(tag, None)
            self.next_tag = first_tag
            consumer.stash = messages
            raise
        if parts:
            self.send_parts(parts)
            after[self.flush] = self._write_now
        if consumer.no_ack:
            broker.ack_popped(pop, messages[:i])
        if fault is not None:
            consumer.stash = messages[i:]
            return RETURN
        left = broker.config.pop_batch if consumer.no_ack else self._room_left()
        if left <= 0:
            return RETURN  # the task waits for room (acks) as after a pop of its own
        parked.max_nums = left  # what its task may pop when it wakes
        if result.rest_num or batch.count >= room:
            return WAKE  # (maybe) more waiting: the task pops them, as after its own pop
        return PARK

    def _write_now(self) -> None:
        """The socket write of a run of hand-offs (`deliver_now`), for all the consumers
        of this connection it served."""
        if self.flush in self._deferred_writes:
            return  # a consumer task of this connection writes at the end of its batch
        try:
            if self._wire.write_now():
                return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.closed = True
            return
        nursery = self.broker.nursery
        if nursery is not None:  # the kernel took part of it: a task writes the rest
            nursery.start_soon(self._write_rest)

    async def _write_rest(self) -> None:
        try:
            await self.flush()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.closed = True
