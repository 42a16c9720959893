"""Send-side queue selection and latency fault tolerance (seeds 001/002, Java MQFaultStrategy).

Without fault tolerance a producer walks its topic's queues round robin and, on a retry,
skips the broker that just failed. With ``send_latency_fault_enable`` every send also
records its latency per broker: a slow answer keeps the broker out of the rotation for a
while (550 ms -> 30 s ... 15 s -> 10 min) and a failed one for the longest period (the
latency is counted as 30 s), so message B does not pay for the outage message A found.
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass

from core.client.model import MessageQueue, TopicRouteData

#: Latency thresholds (ms) and how long (ms) a broker that answered that slowly is avoided.
DEFAULT_LATENCY_MAX_MS = (50, 100, 550, 1000, 2000, 3000, 15000)
DEFAULT_NOT_AVAILABLE_MS = (0, 0, 30000, 60000, 120000, 180000, 600000)
#: Latency assumed for a failed send when computing its isolation time (Java: 30 s).
ISOLATION_LATENCY_MS = 30000


class TopicPublishInfo:
    """Writable queues of a topic, with the round-robin cursor (Java TopicPublishInfo)."""

    def __init__(self, topic: str, route: TopicRouteData, queues: list[MessageQueue] | None = None) -> None:
        self.topic = topic
        self.route = route
        self.queues = queues if queues is not None else route.publish_queues(topic)
        self.order_topic = bool(route.order_topic_conf)
        # Java starts at a random index so many producers do not all hit queue 0 first.
        self._cursor = itertools.count(random.randrange(1 << 16))

    def ok(self) -> bool:
        return bool(self.queues)

    def next_index(self) -> int:
        return next(self._cursor)

    def select(self, last_broker: str | None = None) -> MessageQueue:
        """Next queue round robin, skipping `last_broker` when another broker exists."""
        n = len(self.queues)
        if last_broker is not None:
            for _ in range(n):
                mq = self.queues[self.next_index() % n]
                if mq.broker_name != last_broker:
                    return mq
        return self.queues[self.next_index() % n]

    def write_queue_nums(self, broker_name: str) -> int:
        for q in self.route.queue_datas:
            if q.broker_name == broker_name:
                return q.write_queue_nums
        return 0


@dataclass(slots=True)
class _FaultItem:
    latency_ms: float
    available_at: float  # time.monotonic() seconds


class LatencyFaultTolerance:
    """Per-broker "avoid until" table (Java LatencyFaultToleranceImpl)."""

    def __init__(self) -> None:
        self._items: dict[str, _FaultItem] = {}

    def update(self, broker: str, latency_ms: float, not_available_ms: float) -> None:
        self._items[broker] = _FaultItem(latency_ms, time.monotonic() + not_available_ms / 1000)

    def is_available(self, broker: str) -> bool:
        item = self._items.get(broker)
        return item is None or time.monotonic() >= item.available_at

    def remove(self, broker: str) -> None:
        self._items.pop(broker, None)

    def pick_one_at_least(self) -> str | None:
        """The avoided broker that becomes usable first (lowest latency on ties)."""
        if not self._items:
            return None
        name, _ = min(self._items.items(), key=lambda kv: (kv[1].available_at, kv[1].latency_ms))
        return name

    def snapshot(self) -> dict[str, tuple[float, float]]:
        """broker -> (last latency ms, seconds until available) for diagnostics."""
        now = time.monotonic()
        return {k: (v.latency_ms, max(0.0, v.available_at - now)) for k, v in self._items.items()}


class MQFaultStrategy:
    """Chooses the queue of each send attempt (Java MQFaultStrategy)."""

    def __init__(self, enabled: bool = False,
                 latency_max_ms: tuple[int, ...] = DEFAULT_LATENCY_MAX_MS,
                 not_available_ms: tuple[int, ...] = DEFAULT_NOT_AVAILABLE_MS) -> None:
        if len(latency_max_ms) != len(not_available_ms):
            raise ValueError("latency_max_ms and not_available_ms must have the same length")
        self.enabled = enabled
        self.latency_max_ms = tuple(latency_max_ms)
        self.not_available_ms = tuple(not_available_ms)
        self.tolerance = LatencyFaultTolerance()

    def compute_not_available_ms(self, latency_ms: float) -> int:
        for limit, duration in zip(reversed(self.latency_max_ms), reversed(self.not_available_ms),
                                   strict=True):
            if latency_ms >= limit:
                return duration
        return 0

    def update_fault_item(self, broker: str, latency_ms: float, isolation: bool) -> None:
        """Record one send attempt: its latency, or a failure (`isolation`)."""
        if not self.enabled:
            return
        duration = self.compute_not_available_ms(ISOLATION_LATENCY_MS if isolation else latency_ms)
        self.tolerance.update(broker, latency_ms, duration)

    def select(self, info: TopicPublishInfo, last_broker: str | None) -> MessageQueue:
        if not self.enabled:
            return info.select(last_broker)
        n = len(info.queues)
        start = info.next_index()
        for i in range(n):
            mq = info.queues[(start + i) % n]
            if self.tolerance.is_available(mq.broker_name) and mq.broker_name != last_broker:
                return mq
        # Every broker is being avoided: take the one that recovers first.
        broker = self.tolerance.pick_one_at_least()
        if broker is not None:
            nums = info.write_queue_nums(broker)
            if nums > 0:
                return MessageQueue(info.topic, broker, info.next_index() % nums)
            self.tolerance.remove(broker)
        return info.select(last_broker)
