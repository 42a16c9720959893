"""Queue locks of orderly consumers (docs/protocol.md §5.11).

An orderly push consumer locks each queue it was allocated before pulling it, so that two
members of a group never consume one queue at the same time during a rebalance. A lock
belongs to one client id per (group, queue) and lapses `lock_max_live_s` (Java's
`rebalance.lockMaxLiveTime`, 60 s) after it was last taken or renewed; clients renew every
20 s. Locks live in memory only, as in Java: after a broker restart clients re-lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import trio

__all__ = ["MessageQueue", "RebalanceLockManager", "DEFAULT_LOCK_MAX_LIVE_S"]

DEFAULT_LOCK_MAX_LIVE_S = 60.0


@dataclass(frozen=True, slots=True)
class MessageQueue:
    """A queue as clients name it: `{"topic", "brokerName", "queueId"}` (docs/protocol.md §6.4)."""

    topic: str
    broker_name: str
    queue_id: int

    @classmethod
    def from_json(cls, data: Any) -> MessageQueue:
        """Parse one MessageQueue object; ValueError/TypeError when malformed."""
        if not isinstance(data, dict):
            raise TypeError("MessageQueue must be a JSON object")
        topic = data.get("topic")
        broker_name = data.get("brokerName")
        queue_id = data.get("queueId")
        if not isinstance(topic, str) or not isinstance(broker_name, str):
            raise ValueError("MessageQueue needs string topic and brokerName")
        if isinstance(queue_id, bool) or queue_id is None:
            raise ValueError("MessageQueue needs an integer queueId")
        return cls(topic, broker_name, int(queue_id))

    def to_json(self) -> dict[str, Any]:
        return {"brokerName": self.broker_name, "queueId": self.queue_id, "topic": self.topic}


class _Lock:
    __slots__ = ("client_id", "last_update")

    def __init__(self, client_id: str, now: float) -> None:
        self.client_id = client_id
        self.last_update = now


class RebalanceLockManager:
    """Per (group, MessageQueue) lock owner with expiry.

    `RebalanceLockManager(broker)` reads `broker.config.lock_max_live_s`; tests may pass
    `lock_max_live_s` and a `clock` (seconds, monotonic) directly.
    """

    def __init__(
        self,
        broker: Any = None,
        *,
        lock_max_live_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if lock_max_live_s is None:
            config = getattr(broker, "config", None)
            lock_max_live_s = float(
                getattr(config, "lock_max_live_s", DEFAULT_LOCK_MAX_LIVE_S)
            )
        self.lock_max_live_s = lock_max_live_s
        self._clock = clock
        self._table: dict[str, dict[MessageQueue, _Lock]] = {}

    # The service interface shared with the other broker services.
    def load(self) -> None:
        """Nothing to read: locks are not persisted."""

    def persist(self) -> None:
        """Nothing to write: locks are not persisted."""

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Drop expired locks now and then, so groups that went away free their memory."""
        task_status.started()
        while True:
            await trio.sleep(max(self.lock_max_live_s, 1.0))
            self.purge_expired()

    # ------------------------------------------------------------------ queries
    def _expired(self, lock: _Lock, now: float) -> bool:
        return now - lock.last_update > self.lock_max_live_s

    def is_locked(self, group: str, mq: MessageQueue, client_id: str) -> bool:
        """True when `client_id` holds a live lock on `mq`; renews it (Java does too)."""
        lock = self._table.get(group, {}).get(mq)
        if lock is None or lock.client_id != client_id:
            return False
        now = self._clock()
        if self._expired(lock, now):
            return False
        lock.last_update = now
        return True

    def owner(self, group: str, mq: MessageQueue) -> str | None:
        """The client id holding a live lock on `mq`, or None."""
        lock = self._table.get(group, {}).get(mq)
        if lock is None or self._expired(lock, self._clock()):
            return None
        return lock.client_id

    # ------------------------------------------------------------------ changes
    def try_lock_batch(
        self, group: str, mqs: Iterable[MessageQueue], client_id: str
    ) -> list[MessageQueue]:
        """Lock (or renew) each queue that is free, expired or already ours; return the
        queues `client_id` holds afterwards, in request order."""
        now = self._clock()
        table = self._table.setdefault(group, {})
        locked: list[MessageQueue] = []
        seen: set[MessageQueue] = set()
        for mq in mqs:
            if mq in seen:
                continue
            seen.add(mq)
            lock = table.get(mq)
            if lock is None:
                table[mq] = _Lock(client_id, now)
            elif lock.client_id == client_id or self._expired(lock, now):
                lock.client_id = client_id
                lock.last_update = now
            else:
                continue
            locked.append(mq)
        if not table:
            del self._table[group]
        return locked

    def unlock_batch(self, group: str, mqs: Iterable[MessageQueue], client_id: str) -> None:
        """Release the queues that `client_id` holds; other owners' locks stay."""
        table = self._table.get(group)
        if not table:
            return
        for mq in mqs:
            lock = table.get(mq)
            if lock is not None and lock.client_id == client_id:
                del table[mq]
        if not table:
            del self._table[group]

    def purge_expired(self) -> int:
        """Remove expired locks; returns how many."""
        now = self._clock()
        removed = 0
        for group in list(self._table):
            table = self._table[group]
            for mq in [mq for mq, lock in table.items() if self._expired(lock, now)]:
                del table[mq]
                removed += 1
            if not table:
                del self._table[group]
        return removed

    def lock_count(self) -> int:
        return sum(len(t) for t in self._table.values())
