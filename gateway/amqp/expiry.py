"""x-expires across the gateways of a cluster (docs/amqp.md "Single active consumer and
x-expires across gateways").

A queue with x-expires is deleted once it has had no consumer, no Basic.Get and no
redeclare for that long anywhere in the cluster. Every gateway that knows the queue (it
declared it or adopted it from the declaration log) runs the timer (`QueuePolicy`); the
uses are shared in the broker:

- **Last use.** A use on a gateway (declare, Basic.Get, a consumer's start and end) is
  written as the queue's last use, wall-clock milliseconds, in the consumer offset of
  group `USE_GROUP_PREFIX` + the queue's LMQ (topic `LMQ_AMQP_DECL`, queue 0;
  UPDATE_CONSUMER_OFFSET, an Apache code) by one writer task per gateway, each queue at
  most once per `USE_WRITE_GAP_S`. While a gateway has consumers of the queue it writes
  the use again every quarter of x-expires (at least every `MIN_REFRESH_S`, at most every
  `MAX_REFRESH_S`), so the others see it in use.
- **Deleting.** When a gateway's timer is due and it has no consumer of the queue, it
  reads the last use; if the queue was used more recently elsewhere it re-arms the timer
  for what is left. Otherwise it takes the queue's deletion lock (LOCK_BATCH_MQ, queue
  id 1 of `sac.LOCK_GROUP`), reads the last use again, writes "now" as the last use (a
  gateway that checks after it re-arms, and sees the deletion in the declaration log
  meanwhile) and deletes the queue; others that are due at the same moment find the
  lock taken and look again later. So an unused queue is deleted once.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import trio

from core.client.errors import MQClientError
from core.remoting.errors import RemotingError
from gateway.amqp.decl_log import DECL_TOPIC

if TYPE_CHECKING:
    from gateway.amqp.broker import AmqpBroker, Queue
    from gateway.amqp.sac import QueueLocks

__all__ = ["SharedExpiry", "DELETE_LOCK", "USE_GROUP_PREFIX", "USE_WRITE_GAP_S"]

log = logging.getLogger(__name__)

#: Consumer group (+ the queue's LMQ) whose offset is the queue's last use, in ms.
USE_GROUP_PREFIX = "GID_AMQP_EXP"
#: The writer task's pause between rounds: one queue's use is written at most this often.
USE_WRITE_GAP_S = 0.05
#: Bounds of the period at which a gateway with consumers writes a queue's use again.
MIN_REFRESH_S = 0.1
MAX_REFRESH_S = 60.0
#: Queue id of a queue's deletion lock (`sac.LOCK_GROUP`; also auto-delete, presence.py).
DELETE_LOCK = 1
_ERRORS = (MQClientError, RemotingError, OSError, trio.TooSlowError)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class SharedExpiry:
    """The shared last uses and deletion locks of one gateway process's queues."""

    def __init__(self, broker: AmqpBroker, locks: QueueLocks) -> None:
        self.broker = broker
        self.locks = locks
        self._dirty: dict[str, tuple[Queue, int]] = {}
        self._ready = trio.Event()
        self._alive: set[str] = set()  # LMQs whose keep-alive task runs
        self.deleted = 0  # queues this gateway deleted for x-expires

    def used(self, queue: Queue) -> None:
        """The queue was used here now (written by the writer task)."""
        self._dirty[queue.lmq] = (queue, now_ms())
        self._ready.set()

    def consuming(self, queue: Queue) -> None:
        """A local consumer started: keep the queue in use while there are any."""
        nursery = self.broker.nursery
        if queue.lmq not in self._alive and nursery is not None:
            self._alive.add(queue.lmq)
            nursery.start_soon(self._keep_alive, queue)

    async def _keep_alive(self, queue: Queue) -> None:
        period = min(max(queue.args.expires / 4000, MIN_REFRESH_S), MAX_REFRESH_S)
        try:
            while queue.consumers > 0 and queue.expires_at is not None:
                self.used(queue)
                await trio.sleep(period)
        finally:
            self._alive.discard(queue.lmq)

    async def run(self) -> None:
        """The writer task (in the broker's nursery)."""
        while True:
            await self._ready.wait()
            self._ready = trio.Event()
            batch, self._dirty = self._dirty, {}
            for queue, ms in batch.values():
                try:
                    await self._write(queue, ms)
                except _ERRORS as exc:
                    log.warning("AMQP last use of queue %r not shared: %r", queue.name, exc)
            await trio.sleep(USE_WRITE_GAP_S)

    async def _write(self, queue: Queue, ms: int) -> None:
        b = self.broker
        await b.client.api.update_consumer_offset(b.addr, USE_GROUP_PREFIX + queue.lmq,
                                                  DECL_TOPIC, 0, ms)

    async def _idle_ms(self, queue: Queue) -> int | None:
        """Milliseconds since the queue's last use anywhere (None: never written)."""
        b = self.broker
        last = await b.client.api.query_consumer_offset(b.addr, USE_GROUP_PREFIX + queue.lmq,
                                                        DECL_TOPIC, 0)
        return None if last < 0 else now_ms() - last

    async def may_delete(self, owner: AmqpBroker, queue: Queue) -> bool:
        """The queue's timer is due here: True (with its deletion lock held) when it was
        unused everywhere for its x-expires; else its timer is re-armed."""
        expires = queue.args.expires
        mq = self.locks.mq(queue.lmq, DELETE_LOCK)
        locked = False
        try:
            idle = await self._idle_ms(queue)
            if idle is None or idle >= expires:
                locked = mq in await self.locks.lock([mq])
                if not locked:  # another gateway is deleting it
                    self._rearm(owner, queue, expires)
                    return False
                idle = await self._idle_ms(queue)
            if idle is not None and idle < expires:
                self._rearm(owner, queue, expires - idle)
                if locked:
                    await self.locks.unlock([mq])
                return False
            await self._write(queue, now_ms())
            return True
        except _ERRORS as exc:
            log.warning("AMQP expiry check of queue %r failed: %r", queue.name, exc)
            self._rearm(owner, queue, expires)
            return False

    async def deleted_by_us(self, queue: Queue) -> None:
        self.deleted += 1
        try:
            await self.locks.unlock([self.locks.mq(queue.lmq, DELETE_LOCK)])
        except _ERRORS as exc:  # it lapses on the broker
            log.warning("AMQP expiry unlock of queue %r failed: %r", queue.name, exc)

    @staticmethod
    def _rearm(owner: AmqpBroker, queue: Queue, ms: int) -> None:
        queue.expires_at = trio.current_time() + ms / 1000
        owner.policy.schedule_expiry(queue)
