"""`PushConsumer`: the client pulls (long polling) and pushes messages into a listener.

Per owned queue one pull task fills a `ProcessQueue` (flow control, seed 001: at most
1000 messages / 100 MiB cached per queue and, for concurrent consumption, an offset span
of 2000). Then:

* concurrent: ``consume_concurrency`` workers call the listener with batches of
  ``consume_batch_size``; a failed batch goes back through CONSUMER_SEND_MSG_BACK
  (clustering) and the broker re-delivers it via ``%RETRY%<group>``, or to the DLQ after
  ``max_reconsume_times`` (16);
* orderly: one task per queue consumes it serially while holding the broker-side lock;
  a failed batch is retried locally after ``suspend_current_queue_time``.

A listener is ``listener(msgs, ctx)``, plain (run in a worker thread) or async; it returns
`ConsumeStatus.SUCCESS` (or None/True) or `ConsumeStatus.RECONSUME_LATER` (or False), and
an exception counts as RECONSUME_LATER.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Unpack

import trio

from core.client.consumer_base import ConsumerBase, ConsumerOptions
from core.client.instance import ClientInstance
from core.client.model import MessageQueue, PullStatus
from core.client.process_queue import ProcessQueue
from core.client.pull_consumer import BROKER_SUSPEND_MAX_MS, pull_or_pause
from core.common.message import MessageExt
from core.common.names import is_retry_topic
from core.common.properties import MessageConst

log = logging.getLogger(__name__)

#: Flow-control and back-off pauses (Java: 50 ms flow control, 3 s after a pull error,
#: 5 s before re-consuming a message whose send-back failed).
FLOW_CONTROL_PAUSE_S = 0.05
PULL_ERROR_PAUSE_S = 3.0
RESUBMIT_PAUSE_S = 5.0
#: Default maximum deliveries before the DLQ for concurrent listeners (Java: -1 -> 16).
DEFAULT_MAX_RECONSUME_TIMES = 16


class ConsumeStatus(Enum):
    SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"
    #: Orderly name for RECONSUME_LATER (Java SUSPEND_CURRENT_QUEUE_A_MOMENT).
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "RECONSUME_LATER"


@dataclass(slots=True)
class ConsumeContext:
    """Handed to the listener with each batch. A listener may set `delay_level` (concurrent:
    retry delay level, 0 = the broker's 3 + reconsume times, -1 = straight to the DLQ) or
    `suspend_time` (orderly: seconds before the batch is retried)."""

    mq: MessageQueue
    delay_level: int = 0
    suspend_time: float | None = None


Listener = Callable[[list[MessageExt], ConsumeContext], Any]


def _is_async(fn: Any) -> bool:
    call = type(fn).__call__ if not inspect.isroutine(fn) else None
    return inspect.iscoroutinefunction(fn) or (call is not None and inspect.iscoroutinefunction(call))


def _succeeded(ret: Any) -> bool:
    if ret is None or ret is True or ret is ConsumeStatus.SUCCESS:
        return True
    if isinstance(ret, str):
        return ret.upper() in ("CONSUME_SUCCESS", "SUCCESS")
    return False


@dataclass(slots=True)
class _ConsumeRequest:
    msgs: list[MessageExt]
    mq: MessageQueue
    pq: ProcessQueue


class PushConsumer(ConsumerBase):
    """Subscribe, then start; the listener is called with messages (module docstring)::

        consumer = PushConsumer(client, "CG", listener)
        consumer.subscribe("T", "A || B")
        async with consumer:
            ...

    `subscribe` / `unsubscribe` while running take effect at once (a rebalance follows).
    """

    def __init__(
        self,
        client: ClientInstance,
        group: str,
        listener: Listener,
        *,
        orderly: bool = False,
        consume_concurrency: int = 20,
        consume_batch_size: int = 1,
        pull_batch_size: int = 32,
        pull_threshold_for_queue: int = 1000,
        pull_threshold_size_for_queue: int = 100 * 1024 * 1024,
        consume_concurrently_max_span: int = 2000,
        max_reconsume_times: int = -1,
        suspend_current_queue_time: float = 1.0,
        pull_interval: float = 0.0,
        broker_suspend_max_ms: int = BROKER_SUSPEND_MAX_MS,
        shutdown_grace: float = 5.0,
        listener_in_thread: bool = True,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        super().__init__(client, group, orderly=orderly, **options)
        if consume_concurrency < 1 or consume_batch_size < 1 or pull_batch_size < 1:
            raise ValueError("consume_concurrency, consume_batch_size and pull_batch_size must be >= 1")
        self.listener = listener
        self.consume_concurrency = consume_concurrency
        self.consume_batch_size = consume_batch_size
        self.pull_batch_size = pull_batch_size
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.pull_threshold_size_for_queue = pull_threshold_size_for_queue
        self.consume_concurrently_max_span = consume_concurrently_max_span
        self.max_reconsume_times = max_reconsume_times
        self.suspend_current_queue_time = suspend_current_queue_time
        self.pull_interval = pull_interval
        self.broker_suspend_max_ms = broker_suspend_max_ms
        self.shutdown_grace = shutdown_grace
        self._async_listener = _is_async(listener)
        self._listener_in_thread = listener_in_thread
        self._limiter = trio.CapacityLimiter(consume_concurrency)
        self._send_ch, self._recv_ch = trio.open_memory_channel[_ConsumeRequest](math.inf)
        self._inflight = 0
        self._stopping = False

    @property
    def effective_max_reconsume_times(self) -> int:
        if self.max_reconsume_times >= 0:
            return self.max_reconsume_times
        return 1 << 31 if self.orderly else DEFAULT_MAX_RECONSUME_TIMES

    # -- lifetime -------------------------------------------------------------------

    async def start(self) -> None:
        self._stopping = False
        await super().start()

    def _on_started(self, nursery: trio.Nursery) -> None:
        super()._on_started(nursery)
        if not self.orderly:
            for _ in range(self.consume_concurrency):
                nursery.start_soon(self._worker)

    async def _before_shutdown(self) -> None:
        self._stopping = True
        for pq in self.pq_table.values():
            if pq.pull_scope is not None:
                pq.pull_scope.cancel()
        with trio.move_on_after(self.shutdown_grace):
            while self._inflight:
                await trio.sleep(0.01)

    # -- pulling --------------------------------------------------------------------

    def _start_queue(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        assert self.nursery is not None
        pq.pull_scope = trio.CancelScope()
        self.nursery.start_soon(self._pull_loop, mq, pq, offset)
        if self.orderly:
            self.nursery.start_soon(self._orderly_loop, mq, pq)

    def _flow_controlled(self, pq: ProcessQueue) -> bool:
        if pq.msg_count > self.pull_threshold_for_queue:
            return True
        if pq.msg_size > self.pull_threshold_size_for_queue:
            return True
        return not self.orderly and pq.max_span > self.consume_concurrently_max_span

    async def _pull_loop(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        next_offset = offset
        with pq.pull_scope:
            while self.running and not pq.dropped and not self._stopping:
                if self.pull_interval > 0:
                    await trio.sleep(self.pull_interval)
                if self._flow_controlled(pq):
                    await trio.sleep(FLOW_CONTROL_PAUSE_S)
                    continue
                if self.orderly and self.clustering and not pq.locked:
                    await trio.sleep(1.0)  # the renew loop or the consume task re-locks it
                    continue
                sub = self.subs.get(mq.topic)
                if sub is None:
                    await trio.sleep(PULL_ERROR_PAUSE_S)
                    continue
                commit = self.offset_store.read_memory(mq) if self.clustering else 0
                result = await pull_or_pause(
                    self.client, self.group, mq, sub, next_offset, self.pull_batch_size,
                    pause_s=PULL_ERROR_PAUSE_S, commit_offset=max(commit, 0),
                    suspend_ms=self.broker_suspend_max_ms)
                if result is None:
                    continue
                if pq.dropped:
                    return
                status = result.status
                if status is PullStatus.FOUND:
                    next_offset = result.next_begin_offset
                    self._deliver(mq, pq, result.messages)
                elif status in (PullStatus.NO_NEW_MSG, PullStatus.NO_MATCHED_MSG):
                    next_offset = result.next_begin_offset
                    if pq.is_empty():
                        # Nothing in flight: the filtered/empty range counts as consumed.
                        self.offset_store.update(mq, next_offset, increase_only=True)
                else:
                    log.warning("offset %d of %s is illegal, moving to %d", next_offset, mq,
                                result.next_begin_offset)
                    next_offset = result.next_begin_offset
                    if pq.is_empty():
                        self.offset_store.update(mq, next_offset)
                        try:
                            await self.offset_store.persist(mq)
                        except Exception as exc:
                            log.debug("persist after offset move failed: %r", exc)

    def _deliver(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        if is_retry_topic(mq.topic):
            for m in msgs:
                real = m.properties.get(MessageConst.RETRY_TOPIC)
                if real:
                    m.topic = real
        pq.put(msgs)
        if self.orderly:
            return  # the queue's orderly task takes them in order
        n = self.consume_batch_size
        for i in range(0, len(msgs), n):
            self._send_ch.send_nowait(_ConsumeRequest(msgs[i:i + n], mq, pq))

    # -- calling the listener -------------------------------------------------------------

    async def _call_listener(self, msgs: list[MessageExt], ctx: ConsumeContext) -> bool:
        try:
            if self._async_listener:
                ret = await self.listener(msgs, ctx)
            elif self._listener_in_thread:
                ret = await trio.to_thread.run_sync(self.listener, msgs, ctx, limiter=self._limiter)
            else:
                ret = self.listener(msgs, ctx)
        except Exception:
            log.exception("listener of %s raised on %d message(s) of %s; will retry",
                          self.group, len(msgs), ctx.mq)
            return False
        return _succeeded(ret)

    # -- concurrent consumption ---------------------------------------------------------

    async def _worker(self) -> None:
        async for req in self._recv_ch:
            if req.pq.dropped or self._stopping:
                continue
            self._inflight += 1
            try:
                await self._consume_concurrently(req)
            finally:
                self._inflight -= 1

    async def _consume_concurrently(self, req: _ConsumeRequest) -> None:
        ctx = ConsumeContext(req.mq)
        ok = await self._call_listener(req.msgs, ctx)
        if req.pq.dropped:
            return  # the queue moved on; its new owner re-delivers from the stored offset
        done = req.msgs
        if not ok:
            if self.clustering:
                retry_local = []
                for m in req.msgs:
                    if not await self._send_back(m, req.mq, ctx.delay_level):
                        retry_local.append(m)
                if retry_local:
                    done = [m for m in req.msgs if m not in retry_local]
                    self.nursery.start_soon(self._resubmit_later,
                                            _ConsumeRequest(retry_local, req.mq, req.pq))
            else:
                log.warning("broadcasting consumer %s drops %d failed message(s)",
                            self.group, len(req.msgs))
        offset = req.pq.remove(done)
        if offset >= 0 and not req.pq.dropped:
            self.offset_store.update(req.mq, offset, increase_only=True)

    async def _send_back(self, msg: MessageExt, mq: MessageQueue, delay_level: int) -> bool:
        try:
            addr = self.client.find_broker_addr(mq.broker_name) or msg.store_host
            await self.client.api.consumer_send_msg_back(
                addr, msg, self.group, delay_level, self.effective_max_reconsume_times)
            return True
        except Exception as exc:
            log.warning("send-back of %s failed: %r", msg.msg_id, exc)
            return False

    async def _resubmit_later(self, req: _ConsumeRequest) -> None:
        await trio.sleep(RESUBMIT_PAUSE_S)
        for m in req.msgs:
            m.reconsume_times += 1
        if not req.pq.dropped:
            self._send_ch.send_nowait(req)

    # -- orderly consumption ------------------------------------------------------------

    async def _orderly_loop(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        while self.running and not pq.dropped and not self._stopping:
            if not pq.has_pending:
                await pq.arrived.wait()
                continue
            if self.clustering and (not pq.locked or pq.lock_expired):
                if not await self._lock({mq}):
                    await trio.sleep(1.0)
                    continue
            ctx = ConsumeContext(mq)
            async with pq.consume_lock:
                if pq.dropped:
                    return
                msgs = pq.take(self.consume_batch_size)
                if not msgs:
                    continue
                # Counted in flight until the offset is recorded, so a shutdown waits for it.
                self._inflight += 1
                try:
                    ok = await self._call_listener(msgs, ctx)
                    if pq.dropped:
                        return
                    if not ok:
                        ok = await self._check_reconsume_times(mq, msgs)
                    if ok:
                        offset = pq.commit()
                        if offset >= 0:
                            self.offset_store.update(mq, offset)
                        continue
                finally:
                    self._inflight -= 1
                for m in msgs:
                    m.reconsume_times += 1
                pq.consume_again(msgs)
            pause = ctx.suspend_time if ctx.suspend_time is not None else self.suspend_current_queue_time
            await trio.sleep(max(0.0, pause))

    async def _check_reconsume_times(self, mq: MessageQueue, msgs: list[MessageExt]) -> bool:
        """True when every message of a failed orderly batch reached the limit and went to
        the DLQ (the batch then counts as done, Java checkReconsumeTimes)."""
        limit = self.effective_max_reconsume_times
        if any(m.reconsume_times < limit for m in msgs):
            return False
        for m in msgs:
            if not await self._send_back(m, mq, -1):
                return False
        return True

    # -- diagnostics ----------------------------------------------------------------

    async def seek_to(self, mq: MessageQueue, offset: int) -> None:
        """Restart one owned queue at `offset` (stored at the broker / local file)."""
        await self.reset_offsets(mq.topic, {mq: offset})

    async def queue_offsets(self) -> dict[MessageQueue, int]:
        """Current consume offsets (memory) of owned queues."""
        return {mq: self.offset_store.read_memory(mq) for mq in self.pq_table}
