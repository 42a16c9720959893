"""`LitePullConsumer`: a poll-style consumer (Java DefaultLitePullConsumer).

Either `subscribe` (queues are shared out by rebalance like a push consumer's) or `assign`
explicit queues; background tasks pull ahead into a bounded buffer and ``await poll()``
returns the next batch. Offsets: with ``auto_commit`` the batches handed out by one poll
are committed at the next poll (at-least-once: a crash re-delivers the last batch);
without it, `commit()` commits what has been polled so far.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Unpack

import trio

from core.client.consumer_base import ConsumerBase, ConsumerOptions
from core.client.errors import MQClientError
from core.client.instance import ClientInstance
from core.client.model import (
    ConsumeType,
    ExpressionType,
    MessageQueue,
    PullStatus,
    SubscriptionData,
)
from core.client.process_queue import ProcessQueue
from core.client.pull_consumer import broker_addr_for, pull_or_pause
from core.common.message import MessageExt

log = logging.getLogger(__name__)

PULL_ERROR_PAUSE_S = 1.0
FLOW_CONTROL_PAUSE_S = 0.05


@dataclass(slots=True)
class _Batch:
    mq: MessageQueue
    pq: ProcessQueue
    msgs: list[MessageExt]


class LitePullConsumer(ConsumerBase):
    """``await c.poll()`` -> list of messages (possibly empty after `timeout`)."""

    consume_type = ConsumeType.CONSUME_ACTIVELY

    def __init__(
        self,
        client: ClientInstance,
        group: str,
        *,
        auto_commit: bool = True,
        pull_batch_size: int = 10,
        pull_threshold_for_queue: int = 1000,
        poll_timeout: float = 5.0,
        broker_suspend_max_ms: int = 5000,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        if "orderly" in options:  # ConsumerBase's, for push consumers only
            raise TypeError("LitePullConsumer() got an unexpected keyword argument 'orderly'")
        super().__init__(client, group, **options)
        self.auto_commit = auto_commit
        self.pull_batch_size = pull_batch_size
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.poll_timeout = poll_timeout
        self.broker_suspend_max_ms = broker_suspend_max_ms
        self._assigned: set[MessageQueue] | None = None
        self._send_ch, self._recv_ch = trio.open_memory_channel[_Batch](math.inf)
        self._polled: dict[MessageQueue, tuple[ProcessQueue, list[MessageExt]]] = {}
        self._assign_expr: dict[str, SubscriptionData] = {}

    # -- assignment -----------------------------------------------------------------

    def assign(self, mqs: list[MessageQueue], expression: str = "*",
               expression_type: str = ExpressionType.TAG.value) -> None:
        """Consume exactly these queues (no rebalance). Call before `start`."""
        if self.running:
            raise MQClientError("assign() must be called before start()")
        self._assigned = set(mqs)
        for mq in mqs:
            self.subs.setdefault(mq.topic, SubscriptionData.build(mq.topic, expression, expression_type))

    def heartbeat_data(self) -> dict | None:
        # An assigning consumer is no group member: it must not shift others' queues.
        if self._assigned is not None:
            return None
        return super().heartbeat_data()

    async def do_rebalance(self) -> None:
        if not self.running:
            return
        if self._assigned is None:
            await super().do_rebalance()
            return
        async with self._rebalance_lock:
            for topic in {mq.topic for mq in self._assigned}:
                await self._update_pq_table(topic, {mq for mq in self._assigned if mq.topic == topic})

    # -- pulling --------------------------------------------------------------------

    def _start_queue(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        assert self.nursery is not None
        pq.pull_scope = trio.CancelScope()
        self.nursery.start_soon(self._pull_loop, mq, pq, offset)

    async def _pull_loop(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        next_offset = offset
        with pq.pull_scope:
            while self.running and not pq.dropped:
                if pq.msg_count > self.pull_threshold_for_queue:
                    await trio.sleep(FLOW_CONTROL_PAUSE_S)
                    continue
                sub = self.subs.get(mq.topic)
                if sub is None:
                    await trio.sleep(PULL_ERROR_PAUSE_S)
                    continue
                result = await pull_or_pause(
                    self.client, self.group, mq, sub, next_offset, self.pull_batch_size,
                    pause_s=PULL_ERROR_PAUSE_S, suspend_ms=self.broker_suspend_max_ms)
                if result is None:
                    continue
                if pq.dropped:
                    return
                next_offset = result.next_begin_offset
                if result.status is PullStatus.FOUND:
                    pq.put(result.messages)
                    self._send_ch.send_nowait(_Batch(mq, pq, result.messages))
                elif pq.is_empty() and result.status is not PullStatus.OFFSET_ILLEGAL:
                    self.offset_store.update(mq, next_offset, increase_only=True)
                elif result.status is PullStatus.OFFSET_ILLEGAL and pq.is_empty():
                    self.offset_store.update(mq, next_offset)

    # -- the application's side ---------------------------------------------------------

    async def poll(self, timeout: float | None = None) -> list[MessageExt]:
        """Next batch of messages, or [] when none arrives within `timeout` seconds."""
        self._check_running()
        if self.auto_commit:
            self._commit_polled()
        with trio.move_on_after(self.poll_timeout if timeout is None else timeout):
            while True:
                batch = await self._recv_ch.receive()
                if batch.pq.dropped:
                    continue
                pq_msgs = self._polled.setdefault(batch.mq, (batch.pq, []))
                if pq_msgs[0] is not batch.pq:
                    self._polled[batch.mq] = pq_msgs = (batch.pq, [])
                pq_msgs[1].extend(batch.msgs)
                return batch.msgs
        return []

    def _commit_polled(self) -> None:
        for mq, (pq, msgs) in self._polled.items():
            offset = pq.remove(msgs)
            if offset >= 0 and not pq.dropped:
                self.offset_store.update(mq, offset, increase_only=True)
        self._polled.clear()

    async def commit(self) -> None:
        """Commit everything polled so far and store it at the broker (or local file) now."""
        self._check_running()
        self._commit_polled()
        await self.offset_store.persist_all(set(self.pq_table))

    async def committed(self, mq: MessageQueue) -> int:
        """The offset stored for `mq` (-1 when none)."""
        return await self.offset_store.read_store(mq)

    async def seek(self, mq: MessageQueue, offset: int) -> None:
        """Continue `mq` at `offset` (buffered messages of it are discarded)."""
        self._check_running()
        if mq not in self.pq_table:
            raise MQClientError(f"{mq} is not consumed by this consumer")
        self._polled.pop(mq, None)
        await self.reset_offsets(mq.topic, {mq: offset})

    async def seek_to_begin(self, mq: MessageQueue) -> None:
        addr = await broker_addr_for(self.client, mq)
        await self.seek(mq, await self.client.api.get_min_offset(addr, mq.topic, mq.queue_id))

    async def seek_to_end(self, mq: MessageQueue) -> None:
        addr = await broker_addr_for(self.client, mq)
        await self.seek(mq, await self.client.api.get_max_offset(addr, mq.topic, mq.queue_id))

    def assignment(self) -> list[MessageQueue]:
        """Queues this consumer currently reads."""
        return sorted(self.pq_table)

    async def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        route = await self.client.update_route(topic)
        if route is None:
            raise MQClientError(f"no route info for topic {topic!r}", 17)
        return route.subscribe_queues(topic)
