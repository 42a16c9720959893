"""x-single-active-consumer across the gateways of a cluster (docs/amqp.md "Single active
consumer and x-expires across gateways").

One consumer of a SAC queue receives, cluster-wide. The broker arbitrates with the queue
locks of RocketMQ's orderly consumers (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ, Apache codes):
a gateway with local consumers of a SAC queue asks for the lock of `(LOCK_GROUP, the
queue's LMQ)` under its gateway id; the gateway holding it lets its first local consumer
pop (the others wait in line, `Queue.waiting`), the others keep asking every
`sac_retry_s`. The holder renews every `sac_renew_s` and counts the lock as its own for
`sac_lease_s` after a request it sent (below the broker's `lock_max_live_s`, 60 s as in
Apache, so it stops popping before the broker could give the lock to another). When its
last local consumer goes it unlocks, and a waiting gateway takes over at its next try.

A gateway killed with -9 cannot unlock. Its broker connection closes, so the broker drops
it from the gateways' group (the route log's HEART_BEAT membership): a waiting gateway
that saw it as a member before (here or in the route log's last read of the group) and
finds it gone unlocks the queue on its behalf
(UNLOCK_BATCH_MQ names the owner's client id) and takes it. Otherwise the lock lapses
after the broker's `lock_max_live_s`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from core.client import MessageQueue
from core.client.errors import MQClientError
from core.remoting.errors import RemotingError

if TYPE_CHECKING:
    from gateway.amqp.broker import AmqpBroker, Queue

__all__ = ["QueueLocks", "SingleActive", "LOCK_GROUP"]

log = logging.getLogger(__name__)

#: The lock group of the AMQP gateways' queue leases (queue id 0: single active consumer,
#: 1: x-expires deletion, gateway/amqp/expiry.py).
LOCK_GROUP = "GID_AMQP_LEASE"
_ERRORS = (MQClientError, RemotingError, OSError, trio.TooSlowError)


def wake(queue: Queue) -> None:
    """Wake the consumer loops of `queue` that wait for their turn."""
    queue.active_changed.set()
    queue.active_changed = trio.Event()


class QueueLocks:
    """Broker queue locks taken under this gateway's id, and the take-over of the locks
    of gateways that left the cluster."""

    def __init__(self, broker: AmqpBroker) -> None:
        self.broker = broker
        #: Gateway ids seen in the gateways' group: one missing later has gone.
        self.seen: set[str] = set()

    @property
    def client_id(self) -> str:
        return self.broker.routes.gateway_id

    def mq(self, lmq: str, kind: int) -> MessageQueue:
        return MessageQueue(lmq, self.broker.broker_name, kind)

    async def lock(self, mqs: list[MessageQueue]) -> set[MessageQueue]:
        """The subset of `mqs` this gateway holds now (renewed or newly taken); when some
        are held by others, the locks of gateways that left are released and tried again."""
        api, addr = self.broker.client.api, self.broker.addr
        got = await api.lock_batch_mq(addr, LOCK_GROUP, self.client_id, mqs)
        missing = [mq for mq in mqs if mq not in got]
        if missing and await self._unlock_gone(missing):
            got |= await api.lock_batch_mq(addr, LOCK_GROUP, self.client_id, missing)
        return got

    async def unlock(self, mqs: list[MessageQueue]) -> None:
        await self.broker.client.api.unlock_batch_mq(self.broker.addr, LOCK_GROUP,
                                                     self.client_id, mqs)

    async def _unlock_gone(self, mqs: list[MessageQueue]) -> bool:
        """Unlock `mqs` for every gateway seen in the group before and missing now (killed,
        or its broker connection lost); True when there was one."""
        api, addr = self.broker.client.api, self.broker.addr
        routes = self.broker.routes
        live = set(await api.get_consumer_id_list(addr, routes.config.group))
        # Members seen before: by this check, and by the route log's own reads.
        gone = (self.seen | routes.members) - live - {self.client_id}
        self.seen = live
        for gateway in gone:
            log.info("AMQP gateway %s left the cluster: releasing its locks of %d queue(s)",
                     gateway, len(mqs))
            await api.unlock_batch_mq(addr, LOCK_GROUP, gateway, mqs)
        return bool(gone)


class SingleActive:
    """The SAC leases of one gateway process (shared by its virtual hosts)."""

    def __init__(self, broker: AmqpBroker) -> None:
        self.broker = broker
        self.locks = QueueLocks(broker)
        cfg = broker.config
        self.lease_s = cfg.sac_lease_s
        # Renewed at least twice per lease, whatever the settings say.
        self.renew_s = min(cfg.sac_renew_s, cfg.sac_lease_s / 2)
        self.retry_s = cfg.sac_retry_s
        #: SAC queues with local consumers, by LMQ.
        self.wanted: dict[str, Queue] = {}
        #: LMQ -> trio time until which this gateway counts the lock as its own.
        self.held: dict[str, float] = {}
        self._release: list[str] = []
        self._changed = trio.Event()

    def active(self, queue: Queue) -> bool:
        """May this gateway's first consumer of `queue` pop?"""
        until = self.held.get(queue.lmq)
        return until is not None and trio.current_time() < until

    def consuming(self, queue: Queue) -> None:
        """A local consumer of a SAC queue started: ask for the lock at once."""
        if queue.lmq not in self.wanted:
            self.wanted[queue.lmq] = queue
            self._changed.set()

    def idle(self, queue: Queue) -> None:
        """The queue's last local consumer went (or the queue): give the lock back."""
        if self.wanted.pop(queue.lmq, None) is not None:
            if self.held.pop(queue.lmq, None) is not None:
                self._release.append(queue.lmq)
            self._changed.set()

    async def run(self) -> None:
        """Take, renew and give back locks (in the broker's nursery)."""
        failed = False
        while True:
            # Soon while a lock is wanted and not held, or after a failed round (a broker
            # that restarted has forgotten its locks: take them back before another does).
            soon = failed or any(lmq not in self.held for lmq in self.wanted)
            with trio.move_on_after(self.retry_s if soon else self.renew_s):
                await self._changed.wait()
            self._changed = trio.Event()
            try:
                await self._round()
                failed = False
            except _ERRORS as exc:
                log.warning("AMQP single-active-consumer locks: %r", exc)
                failed = True

    async def _round(self) -> None:
        release, self._release = self._release, []
        if release:
            await self.locks.unlock([self.locks.mq(lmq, 0) for lmq in release])
        wanted = dict(self.wanted)
        if not wanted:
            return
        sent = trio.current_time()
        got = await self.locks.lock([self.locks.mq(lmq, 0) for lmq in wanted])
        mine = {mq.topic for mq in got}
        for lmq, queue in wanted.items():
            if self.wanted.get(lmq) is not queue:
                if lmq in mine:  # its consumers went while we asked
                    await self.locks.unlock([self.locks.mq(lmq, 0)])
                continue
            before = self.active(queue)
            if lmq in mine:
                self.held[lmq] = sent + self.lease_s
            else:
                self.held.pop(lmq, None)
            if before != (lmq in mine):
                wake(queue)
