"""What push and poll-style consumers share: subscriptions, offsets, rebalance, queue locks.

Rebalance (seed 000, Java RebalanceImpl): for each subscribed topic take its readable
queues and, in clustering mode, the group's member ids from a broker; sort both, run the
allocation strategy, then drop the queues this member no longer owns (offset persisted
first, lock released) and start the new ones at the offset computed from the stored one or
from ``consume_from_where``. Orderly consumers first lock a queue at the broker
(LOCK_BATCH_MQ) and renew all locks every 20 s.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import TypedDict

import trio

from core.client.allocate import AllocateStrategy, resolve_strategy
from core.client.errors import ClientStateError, MQClientError
from core.client.instance import ClientInstance
from core.client.model import (
    ConsumeFromWhere,
    ConsumeType,
    ExpressionType,
    MessageModel,
    MessageQueue,
    SubscriptionData,
    TopicRouteData,
)
from core.client.offset_store import LocalFileOffsetStore, OffsetStore, RemoteOffsetStore
from core.client.process_queue import ProcessQueue
from core.client.pull_consumer import broker_addr_for
from core.common.names import is_retry_topic, retry_topic, validate_group, validate_topic

log = logging.getLogger(__name__)

#: Orderly consumers renew their broker-side queue locks this often (Java: 20 s).
LOCK_RENEW_INTERVAL_S = 20.0
#: How long a rebalance waits for an orderly batch to finish before unlocking its queue.
UNLOCK_WAIT_S = 1.0


class ConsumerOptions(TypedDict, total=False):
    """The keyword options every consumer takes (`ConsumerBase`, defaults there); the
    subclasses pass them on as ``**options``."""

    message_model: MessageModel | str
    allocate: str | AllocateStrategy
    consume_from_where: ConsumeFromWhere | str
    consume_timestamp_ms: int | None


class ConsumerBase:
    """Base of `PushConsumer` and `LitePullConsumer`; subclasses start the per-queue work
    in `_start_queue` and may veto removals in `_before_remove`."""

    consume_type = ConsumeType.CONSUME_PASSIVELY

    def __init__(
        self,
        client: ClientInstance,
        group: str,
        *,
        message_model: MessageModel | str = MessageModel.CLUSTERING,
        allocate: str | AllocateStrategy = "averagely",
        consume_from_where: ConsumeFromWhere | str = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        consume_timestamp_ms: int | None = None,
        orderly: bool = False,
    ) -> None:
        reason = validate_group(group)
        if reason:
            raise MQClientError(reason)
        self.client = client
        self.group = group
        self.message_model = _enum(MessageModel, message_model)
        self.allocate = resolve_strategy(allocate)
        self.consume_from_where = _enum(ConsumeFromWhere, consume_from_where)
        # Java's default consumeTimestamp: half an hour ago.
        self.consume_timestamp_ms = (consume_timestamp_ms if consume_timestamp_ms is not None
                                     else int(time.time() * 1000) - 30 * 60 * 1000)
        self.orderly = orderly
        self.subs: dict[str, SubscriptionData] = {}
        self.topic_queues: dict[str, list[MessageQueue]] = {}
        self.pq_table: dict[MessageQueue, ProcessQueue] = {}
        self.offset_store: OffsetStore = (
            RemoteOffsetStore(client, group) if self.clustering else LocalFileOffsetStore(client, group)
        )
        self.running = False
        self.nursery: trio.Nursery | None = None
        self._scope: trio.CancelScope | None = None
        self._rebalance_lock = trio.Lock()

    @property
    def clustering(self) -> bool:
        return self.message_model is MessageModel.CLUSTERING

    # -- subscriptions ----------------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*",
                  expression_type: str = ExpressionType.TAG.value) -> None:
        """Subscribe to `topic` with a tag expression ("*", "A || B") or an SQL92 one."""
        reason = validate_topic(topic)
        if reason:
            raise MQClientError(reason)
        self.subs[topic] = SubscriptionData.build(topic, expression, expression_type)
        if self.running:
            self.client.nursery.start_soon(self._after_subscription_change, topic)

    def unsubscribe(self, topic: str) -> None:
        self.subs.pop(topic, None)
        if self.running:
            self.client.rebalance_immediately()

    async def _after_subscription_change(self, topic: str) -> None:
        try:
            await self.client.update_route(topic)
        except Exception as exc:
            log.debug("route of %s: %r", topic, exc)
        await self.client.send_heartbeats()
        self.client.rebalance_immediately()

    def subscriptions(self) -> list[SubscriptionData]:
        return list(self.subs.values())

    def on_route(self, topic: str, route: TopicRouteData) -> None:
        if topic in self.subs:
            self.topic_queues[topic] = route.subscribe_queues(topic)

    # -- lifetime -------------------------------------------------------------------

    async def start(self) -> None:
        if self.running:
            return
        if not self.subs:
            raise MQClientError(f"consumer {self.group!r} has no subscription (call subscribe())")
        if self.clustering and self.consume_type is ConsumeType.CONSUME_PASSIVELY:
            # Messages sent back for retry come from %RETRY%<group> (docs/protocol.md §5.10).
            rt = retry_topic(self.group)
            self.subs.setdefault(rt, SubscriptionData.build(rt, "*"))
        await self.offset_store.load()
        self.client.register_consumer(self)
        try:
            await self.client._need_nursery().start(self._run)
        except BaseException:
            self.client.consumers.pop(self.group, None)
            raise
        self.running = True
        for topic in list(self.subs):
            try:
                route = await self.client.update_route(topic)
                if route is not None:
                    self.on_route(topic, route)
            except Exception as exc:
                log.warning("no route for %s yet: %r", topic, exc)
        await self.client.send_heartbeats()
        self.client.rebalance_immediately()

    async def _run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            self._scope = nursery.cancel_scope
            self._on_started(nursery)
            task_status.started()
            await trio.sleep_forever()

    def _on_started(self, nursery: trio.Nursery) -> None:
        if self.orderly and self.clustering:
            nursery.start_soon(self._lock_renew_loop)

    async def shutdown(self) -> None:
        """Stop pulling, let in-flight work finish briefly, persist offsets, release locks,
        unregister from the brokers."""
        if not self.running:
            return
        self.running = False
        with trio.CancelScope(shield=True):
            await self._before_shutdown()
            mqs = set(self.pq_table)
            for pq in self.pq_table.values():
                pq.drop()
            try:
                await self.offset_store.persist_all(mqs)
            except Exception as exc:
                log.warning("persisting offsets of %s at shutdown failed: %r", self.group, exc)
            if self.orderly and self.clustering:
                await self._unlock_all(mqs)
            self.pq_table.clear()
            if self._scope is not None:
                self._scope.cancel()
            await self.client.unregister(consumer_group=self.group)

    async def _before_shutdown(self) -> None:
        """Hook: wait for in-flight consumption (push consumer)."""

    async def __aenter__(self):
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def _check_running(self) -> None:
        if not self.running:
            raise ClientStateError(f"consumer {self.group!r} is not running")

    # -- heartbeat and diagnostics ----------------------------------------------------------

    def heartbeat_data(self) -> dict | None:
        return {
            "groupName": self.group,
            "consumeType": self.consume_type.name,
            "messageModel": self.message_model.name,
            "consumeFromWhere": self.consume_from_where.name,
            "unitMode": False,
            "subscriptionDataSet": [s.to_json() for s in self.subs.values()],
        }

    def running_info(self) -> dict:
        return {
            "properties": {
                "consumeType": self.consume_type.name,
                "messageModel": self.message_model.name,
                "consumeFromWhere": self.consume_from_where.name,
                "consumeOrderly": str(self.orderly).lower(),
            },
            "subscriptionSet": [s.to_json() for s in self.subs.values()],
            "mqTable": [
                dict(mq.to_json(), cachedMsgCount=pq.msg_count, cachedMsgSizeInMiB=pq.msg_size >> 20,
                     locked=pq.locked, consumeOffset=self.offset_store.read_memory(mq))
                for mq, pq in sorted(self.pq_table.items())
            ],
        }

    # -- offsets ----------------------------------------------------------------------

    async def persist_offsets(self) -> None:
        if self.running:
            await self.offset_store.persist_all(set(self.pq_table))

    async def compute_pull_from_where(self, mq: MessageQueue) -> int:
        """Stored offset, else per `consume_from_where` (Java computePullFromWhere)."""
        last = await self.offset_store.read_store(mq)
        if last >= 0:
            return last
        where = self.consume_from_where
        addr = await broker_addr_for(self.client, mq)
        if where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
            return 0
        if where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP and not is_retry_topic(mq.topic):
            return await self.client.api.search_offset(addr, mq.topic, mq.queue_id,
                                                       self.consume_timestamp_ms)
        if is_retry_topic(mq.topic) and where is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET:
            return 0
        return await self.client.api.get_max_offset(addr, mq.topic, mq.queue_id)

    async def reset_offsets(self, topic: str, offsets: dict[MessageQueue, int]) -> None:
        """Apply offsets pushed by RESET_CONSUMER_CLIENT_OFFSET: drop the queues, store the
        offsets, persist, and let a rebalance restart them there."""
        async with self._rebalance_lock:
            for mq, offset in offsets.items():
                pq = self.pq_table.pop(mq, None)
                if pq is not None:
                    pq.drop()
                self.offset_store.update(mq, offset)
            await self.offset_store.persist_all(set(offsets))
        self.client.rebalance_immediately()

    # -- rebalance --------------------------------------------------------------------

    async def do_rebalance(self) -> None:
        if not self.running:
            return
        async with self._rebalance_lock:
            for topic, _sub in list(self.subs.items()):
                try:
                    await self._rebalance_topic(topic)
                except Exception as exc:
                    log.warning("rebalance of %s/%s failed: %r", self.group, topic, exc)
            # Queues of topics no longer subscribed.
            for mq in [mq for mq in self.pq_table if mq.topic not in self.subs]:
                await self._remove_queue(mq)

    async def _rebalance_topic(self, topic: str) -> None:
        mqs = self.topic_queues.get(topic)
        if not mqs:
            route = await self.client.update_route(topic)
            if route is not None:
                self.on_route(topic, route)
            mqs = self.topic_queues.get(topic)
            if not mqs:
                return
        if self.clustering:
            addr = self.client.find_broker_addr_by_topic(topic)
            if addr is None:
                return
            cids = await self.client.api.get_consumer_id_list(addr, self.group)
            if not cids:
                return
            allocated = set(self.allocate(self.group, self.client.client_id, sorted(mqs), sorted(cids)))
        else:
            allocated = set(mqs)
        await self._update_pq_table(topic, allocated)

    async def _update_pq_table(self, topic: str, allocated: set[MessageQueue]) -> bool:
        changed = False
        for mq in [mq for mq in self.pq_table if mq.topic == topic and mq not in allocated]:
            if await self._remove_queue(mq):
                changed = True
        for mq in sorted(allocated - set(self.pq_table)):
            if not self.running:
                break
            if self.orderly and self.clustering and not await self._lock({mq}):
                continue
            self.offset_store.remove(mq)  # forget a stale memory offset of an earlier stint
            try:
                offset = await self.compute_pull_from_where(mq)
            except Exception as exc:
                log.warning("cannot compute the start offset of %s: %r", mq, exc)
                continue
            if offset < 0 or not self.running:
                continue
            pq = ProcessQueue()
            if self.orderly and self.clustering:
                pq.set_locked(True)
            self.pq_table[mq] = pq
            self.offset_store.update(mq, offset)
            self._start_queue(mq, pq, offset)
            changed = True
        return changed

    async def _remove_queue(self, mq: MessageQueue) -> bool:
        pq = self.pq_table.get(mq)
        if pq is None:
            return False
        pq.drop()
        if self.orderly and self.clustering:
            # Do not hand the queue over in the middle of an ordered batch.
            with trio.move_on_after(UNLOCK_WAIT_S) as scope:
                await pq.consume_lock.acquire()
            if scope.cancelled_caught:
                return False
            try:
                await self._persist_and_forget(mq)
                await self._unlock_all({mq})
            finally:
                pq.consume_lock.release()
        else:
            await self._persist_and_forget(mq)
        self.pq_table.pop(mq, None)
        return True

    async def _persist_and_forget(self, mq: MessageQueue) -> None:
        try:
            await self.offset_store.persist(mq)
        except Exception as exc:
            log.warning("persisting the offset of released %s failed: %r", mq, exc)
        self.offset_store.remove(mq)

    def _start_queue(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        raise NotImplementedError

    # -- broker-side locks (orderly) ---------------------------------------------------------

    async def _lock(self, mqs: set[MessageQueue]) -> bool:
        """LOCK_BATCH_MQ per broker; mark the process queues; True if all got locked."""
        by_broker: dict[str, set[MessageQueue]] = defaultdict(set)
        for mq in mqs:
            by_broker[mq.broker_name].add(mq)
        all_locked = True
        for broker, group in by_broker.items():
            addr = self.client.find_broker_addr(broker)
            locked: set[MessageQueue] = set()
            if addr is not None:
                try:
                    locked = await self.client.api.lock_batch_mq(addr, self.group, self.client.client_id, group)
                except Exception as exc:
                    log.debug("lock of %s at %s failed: %r", group, addr, exc)
            for mq in group:
                pq = self.pq_table.get(mq)
                if pq is not None:
                    pq.set_locked(mq in locked)
                if mq not in locked:
                    all_locked = False
        return all_locked

    async def _unlock_all(self, mqs: set[MessageQueue]) -> None:
        by_broker: dict[str, set[MessageQueue]] = defaultdict(set)
        for mq in mqs:
            by_broker[mq.broker_name].add(mq)
        for broker, group in by_broker.items():
            addr = self.client.find_broker_addr(broker)
            if addr is None:
                continue
            try:
                await self.client.api.unlock_batch_mq(addr, self.group, self.client.client_id, group)
            except Exception as exc:
                log.debug("unlock of %s at %s failed: %r", group, addr, exc)
            for mq in group:
                pq = self.pq_table.get(mq)
                if pq is not None:
                    pq.set_locked(False)

    async def _lock_renew_loop(self) -> None:
        while True:
            await trio.sleep(LOCK_RENEW_INTERVAL_S)
            mqs = {mq for mq, pq in self.pq_table.items() if not pq.dropped}
            if mqs:
                await self._lock(mqs)


def _enum(cls, value):
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        name = value.upper()
        for member in cls:
            if member.name == name or member.name.endswith("_" + name) or member.name == "CONSUME_FROM_" + name:
                return member
        raise ValueError(f"unknown {cls.__name__} {value!r}")
    return cls(value)
