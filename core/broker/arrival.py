"""Message arrival: who is told when the store dispatches a message to a queue.

The store calls `on_dispatch(topic, queue_id, new_max_offset)` for each queue a put wrote
a unit to, and `on_dispatch_lmqs(names, max_offsets)` once per put or batch for all the
LMQs it multi-dispatched to (MessageStore.lmq_dispatch_listener): a message sent to 100
AMQP queues or MQTT subscriptions is one call here, not 100. Both run in the writer's
call stack, so listeners only set events. Held pulls are woken first
(PullRequestHoldService), then the listeners gateways and the POP service registered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from core.broker.long_polling import PullRequestHoldService

log = logging.getLogger(__name__)

QueueListener = Callable[[str, int, int], None]
LmqListener = Callable[[Iterable[str], Mapping[str, int]], None]


class ArrivalNotifier:
    """The store's dispatch listeners, fanned out to held pulls and registered listeners."""

    def __init__(self, hold: PullRequestHoldService) -> None:
        self.hold = hold
        self.lmq_listeners: list[LmqListener] = []  # the LMQs of a put, in one call
        # Listeners of the queues on_dispatch is told about (a put's own queue), paired
        # with an LMQ listener that takes the multi-dispatched LMQs.
        self.other_listeners: list[QueueListener] = []

    def add_lmq(self, fn: LmqListener, other_queues: QueueListener | None = None) -> None:
        """Call `fn(names, max_offsets)` once per put with every LMQ it multi-dispatched
        to, and `other_queues(topic, queue_id, new_max_offset)` for every other dispatch:
        every arrival, without one call per multi-dispatched LMQ."""
        self.lmq_listeners.append(fn)
        if other_queues is not None:
            self.other_listeners.append(other_queues)

    def remove(self, fn: Callable[..., None]) -> None:
        for listeners in (self.lmq_listeners, self.other_listeners):
            if fn in listeners:
                listeners.remove(fn)

    def on_dispatch(self, topic: str, queue_id: int, max_offset: int) -> None:
        self.hold.notify(topic, queue_id, max_offset)
        for fn in self.other_listeners:
            try:
                fn(topic, queue_id, max_offset)
            except Exception:
                log.exception("dispatch listener %r failed", fn)

    def on_dispatch_lmqs(self, names: Iterable[str], max_offsets: Mapping[str, int]) -> None:
        """on_dispatch for the LMQs of one put, in one pass: held pulls, then the LMQ
        listeners (one call each)."""
        self.hold.notify_lmqs(names, max_offsets)
        for fn in self.lmq_listeners:
            try:
                fn(names, max_offsets)
            except Exception:
                log.exception("LMQ dispatch listener %r failed", fn)
