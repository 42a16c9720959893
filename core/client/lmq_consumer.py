"""`LmqConsumer`: reads one light message queue (`%LMQ%…`, docs/protocol.md §10) everywhere.

An LMQ has one queue (id 0) on every broker and no name-server route, so the broker list
comes from GET_BROKER_CLUSTER_INFO (refreshed every route-poll interval) and each broker's
queue is pulled directly, with its own offset stored at that broker under the consumer's
group. Messages keep their original topic; their position in the LMQ is
``msg.lmq_offsets()[lmq]``.

Two ways to read: pass a ``listener(msgs, ctx)`` (called serially per broker, so each
broker's part of the LMQ is consumed in order) or call ``await poll()``.
"""

from __future__ import annotations

import logging

import trio

from core.client.errors import MQClientError
from core.client.instance import ClientInstance
from core.client.model import ConsumeFromWhere, MessageQueue, PullStatus, SubscriptionData
from core.client.offset_store import RemoteOffsetStore
from core.client.pull_consumer import pull_or_pause
from core.client.push_consumer import ConsumeContext, _is_async, _succeeded
from core.common.message import MessageExt
from core.common.names import LMQ_QUEUE_ID, validate_group, validate_lmq

log = logging.getLogger(__name__)

PULL_ERROR_PAUSE_S = 1.0
#: A failed listener call is retried after this pause (the LMQ has no retry topic).
RETRY_PAUSE_S = 1.0


class LmqConsumer:
    """Consume `%LMQ%name` from every master broker (optionally of one cluster)."""

    def __init__(
        self,
        client: ClientInstance,
        group: str,
        lmq: str,
        listener=None,
        *,
        cluster: str | None = None,
        expression: str = "*",
        consume_from_where: ConsumeFromWhere | str = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        pull_batch_size: int = 32,
        broker_suspend_max_ms: int = 15000,
        buffer_batches: int = 64,
        listener_in_thread: bool = True,
        shutdown_grace: float = 5.0,
    ) -> None:
        for reason in (validate_group(group), validate_lmq(lmq)):
            if reason:
                raise MQClientError(reason)
        self.client = client
        self.group = group
        self.lmq = lmq
        self.listener = listener
        self.cluster = cluster
        self.sub = SubscriptionData.build(lmq, expression)
        self.consume_from_where = (consume_from_where if isinstance(consume_from_where, ConsumeFromWhere)
                                   else ConsumeFromWhere["CONSUME_FROM_" + consume_from_where.upper()]
                                   if not consume_from_where.upper().startswith("CONSUME_FROM_")
                                   else ConsumeFromWhere[consume_from_where.upper()])
        self.pull_batch_size = pull_batch_size
        self.broker_suspend_max_ms = broker_suspend_max_ms
        self.offset_store = RemoteOffsetStore(client, group)
        self.shutdown_grace = shutdown_grace
        self._inflight = 0
        self.running = False
        self._async_listener = listener is not None and _is_async(listener)
        self._listener_in_thread = listener_in_thread
        self._scopes: dict[str, trio.CancelScope] = {}
        self._scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        # Bounded: a slow poller stops the pull tasks instead of buffering without end.
        self._send_ch, self._recv_ch = trio.open_memory_channel[tuple[MessageQueue, list, int]](
            buffer_batches if listener is None else 0)
        #: poll mode: per queue, the offset after the last batch handed to the application
        self._polled: dict[MessageQueue, int] = {}
        self._buffered: set[MessageQueue] = set()

    # -- lifetime -------------------------------------------------------------------

    async def start(self) -> None:
        if self.running:
            return
        await self.client._need_nursery().start(self._run)
        self.running = True
        await self.refresh_brokers()

    async def _run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._scope = nursery.cancel_scope
            task_status.started()
            while True:
                await trio.sleep(self.client.config.poll_namesrv_interval)
                try:
                    await self.refresh_brokers()
                except Exception as exc:
                    log.debug("cluster info refresh failed: %r", exc)
                await self._persist()

    async def shutdown(self) -> None:
        if not self.running:
            return
        self.running = False
        with trio.CancelScope(shield=True):
            for scope in self._scopes.values():
                scope.cancel()
            with trio.move_on_after(self.shutdown_grace):
                while self._inflight:
                    await trio.sleep(0.01)
            self._commit_pending()
            await self._persist()
            if self._scope is not None:
                self._scope.cancel()

    async def __aenter__(self) -> LmqConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def _persist(self) -> None:
        await self.offset_store.persist_all()

    # -- brokers --------------------------------------------------------------------

    async def refresh_brokers(self) -> list[MessageQueue]:
        """Start reading on brokers that joined; returns the queues read now."""
        info = await self.client.api.get_cluster_info()
        masters = info.master_addrs(self.cluster)
        if self.cluster and self.cluster not in info.clusters:
            raise MQClientError(f"cluster {self.cluster!r} is unknown to the name servers")
        self.client.pin_brokers({name: info.brokers[name].broker_addrs for name in masters})
        for name in sorted(masters):
            if name not in self._scopes and self._nursery is not None:
                mq = MessageQueue(self.lmq, name, LMQ_QUEUE_ID)
                scope = trio.CancelScope()
                self._scopes[name] = scope
                self._nursery.start_soon(self._pull_loop, mq, scope)
        return [MessageQueue(self.lmq, n, LMQ_QUEUE_ID) for n in sorted(self._scopes)]

    async def _start_offset(self, mq: MessageQueue) -> int:
        stored = await self.offset_store.read_store(mq)
        if stored >= 0:
            return stored
        if self.consume_from_where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
            return 0
        addr = self.client.find_broker_addr(mq.broker_name)
        return await self.client.api.get_max_offset(addr, mq.topic, mq.queue_id)

    # -- pulling --------------------------------------------------------------------

    async def _pull_loop(self, mq: MessageQueue, scope: trio.CancelScope) -> None:
        with scope:
            offset = -1
            while offset < 0:
                try:
                    offset = await self._start_offset(mq)
                except Exception as exc:
                    log.debug("start offset of %s: %r", mq, exc)
                    await trio.sleep(PULL_ERROR_PAUSE_S)
            self.offset_store.update(mq, offset)
            while self.running:
                result = await pull_or_pause(
                    self.client, self.group, mq, self.sub, offset, self.pull_batch_size,
                    pause_s=PULL_ERROR_PAUSE_S, suspend_ms=self.broker_suspend_max_ms)
                if result is None:
                    continue
                if result.status is PullStatus.FOUND and result.messages:
                    next_offset = result.next_begin_offset
                    if self.listener is not None:
                        # Shielded: a shutdown waits for the batch and its offset (it stops
                        # retrying a failing listener once `running` is off).
                        self._inflight += 1
                        try:
                            with trio.CancelScope(shield=True):
                                await self._consume(mq, result.messages)
                                self.offset_store.update(mq, next_offset, increase_only=True)
                        finally:
                            self._inflight -= 1
                    else:
                        self._buffered.add(mq)
                        await self._send_ch.send((mq, result.messages, next_offset))
                    offset = next_offset
                else:
                    offset = result.next_begin_offset
                    if self.listener is not None or mq not in self._buffered:
                        # Nothing of this queue is waiting to be consumed: the range read
                        # counts as consumed.
                        self.offset_store.update(
                            mq, offset, increase_only=result.status is not PullStatus.OFFSET_ILLEGAL)

    async def _consume(self, mq: MessageQueue, msgs: list[MessageExt]) -> None:
        ctx = ConsumeContext(mq)
        while self.running:
            try:
                if self._async_listener:
                    ret = await self.listener(msgs, ctx)
                elif self._listener_in_thread:
                    ret = await trio.to_thread.run_sync(self.listener, msgs, ctx)
                else:
                    ret = self.listener(msgs, ctx)
                if _succeeded(ret):
                    return
            except Exception:
                log.exception("LMQ listener of %s failed; retrying", self.group)
            await trio.sleep(ctx.suspend_time if ctx.suspend_time is not None else RETRY_PAUSE_S)

    # -- poll mode ------------------------------------------------------------------

    async def poll(self, timeout: float = 5.0) -> list[MessageExt]:
        """Next batch from any broker (commits the previous poll's batches)."""
        if self.listener is not None:
            raise MQClientError("poll() is for consumers created without a listener")
        self._commit_pending()
        with trio.move_on_after(timeout):
            mq, msgs, next_offset = await self._recv_ch.receive()
            self._polled[mq] = max(self._polled.get(mq, 0), next_offset)
            return msgs
        return []

    def _commit_pending(self) -> None:
        for mq, offset in self._polled.items():
            self.offset_store.update(mq, offset, increase_only=True)
        self._polled = {}

    async def commit(self) -> None:
        """Store the offsets of everything polled so far at the brokers now."""
        self._commit_pending()
        await self._persist()

    def queues(self) -> list[MessageQueue]:
        return [MessageQueue(self.lmq, n, LMQ_QUEUE_ID) for n in sorted(self._scopes)]

