"""The channel side of one AMQP connection: exchange, queue, basic.publish and confirm
methods turned into `AmqpBroker` calls (docs/amqp.md, "Exchanges, queues, publish").

`AmqpSession.handle(event)` is awaited by the server for every `MethodReceived` /
`ContentReceived` of its connection, in order; answers go out through the
`ServerConnection` (`send`, `close_channel`, `close`). A publish is stored before the next
method of the connection is read, so publisher confirms go out in publish order.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from gateway.amqp import errors
from gateway.amqp.broker import AmqpBroker
from gateway.amqp.codec import encode_content
from gateway.amqp.connection import (
    ChannelClosed,
    ContentReceived,
    MethodReceived,
    ServerConnection,
)
from gateway.amqp.consume import Deliveries
from gateway.amqp.errors import AmqpError
from gateway.amqp.methods import (
    BasicAck,
    BasicCancel,
    BasicCancelOk,
    BasicConsume,
    BasicConsumeOk,
    BasicGet,
    BasicNack,
    BasicPublish,
    BasicQos,
    BasicQosOk,
    BasicRecover,
    BasicRecoverAsync,
    BasicRecoverOk,
    BasicReject,
    BasicReturn,
    ConfirmSelect,
    ConfirmSelectOk,
    ExchangeBind,
    ExchangeBindOk,
    ExchangeDeclare,
    ExchangeDeclareOk,
    ExchangeDelete,
    ExchangeDeleteOk,
    ExchangeUnbind,
    ExchangeUnbindOk,
    QueueBind,
    QueueBindOk,
    QueueDeclare,
    QueueDeclareOk,
    QueueDelete,
    QueueDeleteOk,
    QueuePurge,
    QueuePurgeOk,
    QueueUnbind,
    QueueUnbindOk,
    TxCommit,
    TxCommitOk,
    TxRollback,
    TxRollbackOk,
    TxSelect,
    TxSelectOk,
)
from gateway.amqp.publish_store import PublishStore
from gateway.amqp.queue_args import parse_expiration
from gateway.routing.route_table import BRIDGE_EXCHANGE

__all__ = ["AmqpSession"]

#: Methods that need not wait for the connection's earlier publishes to be stored.
_NO_BARRIER = frozenset({BasicAck, BasicNack, BasicReject, BasicQos})

log = logging.getLogger(__name__)

_connection_ids = itertools.count(1)
#: Permission answers one connection caches ((kind, resource) -> allowed).
_ALLOWED_CACHE = 1024


class _Channel:
    __slots__ = ("confirm", "next_publish_tag", "confirms", "last_queue", "deliveries",
                 "tx_pubs")

    def __init__(self, deliveries: Deliveries) -> None:
        self.confirm = False
        self.next_publish_tag = 1
        self.confirms: deque[list] = deque()  # [tag, None | stored?] in publish order
        self.last_queue = ""  # "the current queue" of spec 1.7.2.1 (a "" queue name)
        self.deliveries = deliveries
        self.tx_pubs: list[tuple[bytes, bytes]] | None = None  # tx mode: held publishes


async def _no_flush() -> None:
    return None


class AmqpSession(PublishStore):
    """The broker side of one connection."""

    def __init__(self, conn: ServerConnection, broker: AmqpBroker) -> None:
        self.conn = conn
        self.broker = broker
        self.id = next(_connection_ids)
        self.channels: dict[int, _Channel] = {}
        #: Writes what the connection has queued to the socket (set by the server).
        self.flush: Callable[[], Awaitable[None]] = _no_flush
        self._init_store()  # publishes not yet stored (publish_store.py)
        self.username = ""
        self.vhost = "/"
        #: The user's permissions on the vhost (gateway/amqp/users.py); None: all allowed.
        self.permissions: Any = None
        self._allowed: dict[tuple[str, str, str], bool] = {}
        #: (exchange, routing key, raw properties, stored properties) of the last publish
        #: `publish_now` took, valid until this task awaits (`handle`, `store_queued`):
        #: the publishes of one read that repeat it skip routing and the properties cache.
        self._last_route: tuple | None = None
        #: Basic.Acks taken while one read is handled, (POP client, delivery) pairs: the
        #: server applies them at the end of the read (`apply_acks`), one broker call.
        self.read_acks: list[tuple] = []

    def opened(self, username: str, vhost: str, permissions: Any) -> None:
        """Connection.Open-Ok went out: the vhost's broker side and the user's rights."""
        self.username, self.vhost, self.permissions = username, vhost, permissions
        self.broker = self.broker.for_vhost(vhost)

    def _allow(self, kind: str, what: str, name: str) -> None:
        """403 ACCESS_REFUSED unless the user's `kind` pattern matches `name` (RabbitMQ's
        check; answers cached per connection, at most `_ALLOWED_CACHE` of them)."""
        perms = self.permissions
        if perms is None:
            return
        if what == "exchange" and name == "":
            name = "amq.default"
        key = (kind, what, name)
        ok = self._allowed.get(key)
        if ok is None:
            ok = perms.allows(kind, name)
            if len(self._allowed) >= _ALLOWED_CACHE:
                self._allowed.clear()
            self._allowed[key] = ok
        if not ok:
            raise AmqpError(errors.ACCESS_REFUSED, f"ACCESS_REFUSED - {kind} access to "
                            f"{what} '{name}' in vhost '{self.vhost}' refused for user "
                            f"'{self.username}'")

    def publish_now(self, content: Any) -> bool:
        """Take the common publish without awaiting (the server tries it before `handle`):
        an open channel without a transaction, a plain publish routed to queues without
        x-max-length, write permission already known, room in the publish backlog. False:
        nothing was done, `handle` takes the publish (and answers its errors)."""
        state = self.channels.get(content.channel)
        method = content.method
        broker = self.broker
        if state is None or state.tx_pubs is not None or type(method) is not BasicPublish \
                or method.immediate or content.properties.expiration is not None \
                or self._pub_bytes > broker.config.max_publish_backlog_bytes \
                or broker.nursery is None:
            return False
        if self.permissions is not None and self._allowed.get(
                ("write", "exchange", method.exchange or "amq.default")) is not True:
            return False
        raw = content.raw_properties
        last = self._last_route
        if last is not None and last[0] == method.exchange and \
                last[1] == method.routing_key and last[2] == raw:
            pb = last[3]  # as the previous publish of this read (nothing awaited since)
        else:
            try:
                lmqs = broker.route(method.exchange, method.routing_key,
                                    content.properties.headers)
                if not lmqs or (broker.limited and not broker.limited.keys().isdisjoint(lmqs)):
                    return False
                pb = broker.stored_properties(method.exchange, method.routing_key,
                                              content.properties, raw, lmqs)
            except Exception:  # `handle` meets it again and answers it
                return False
            if method.exchange != BRIDGE_EXCHANGE:  # (whose properties carry a clock)
                self._last_route = (method.exchange, method.routing_key, raw, pb)
        entry: list | None = None
        if state.confirm:
            entry = [state.next_publish_tag, None]
            state.next_publish_tag += 1
            state.confirms.append(entry)
        body = content.body  # (_queue_pubs of one, start=False, inlined)
        self._pubs.append((pb, body, entry, content.channel, state))
        self._pub_bytes += len(pb) + len(body)
        return True

    def ack_now(self, event: MethodReceived) -> bool:
        """Take a Basic.Ack without awaiting (the server tries it before `handle`): its
        deliveries join `read_acks`. False: nothing was done, `handle` takes the method
        (anything but an ack, a channel without deliveries, an unknown tag's 406)."""
        method = event.method
        if type(method) is not BasicAck:
            return False
        state = self.channels.get(event.channel)
        if state is None:
            return False
        try:
            self.read_acks += state.deliveries.ack(method.delivery_tag, method.multiple)
        except AmqpError:
            return False  # nothing was taken: `handle` meets it again and closes the channel
        return True

    def apply_acks(self) -> None:
        """Apply `read_acks` (the server calls this at the end of each read that took some):
        in process one LocalPop.ack for all of them, no ack task wake-up."""
        acks, self.read_acks = self.read_acks, []
        self.broker.apply_acks(acks)

    async def handle(self, event: Any) -> None:
        self._last_route = None  # routes may change while this awaits
        if self._pubs and not self._storing:
            try:  # what publish_now queued goes first (barriers wait on it)
                self._start_storing()
            except AmqpError as exc:  # the broker side stopped
                self.conn.close(exc.reply_code, exc.text)
                return
        kind = type(event)
        if kind is ChannelClosed:
            await self._drop_channel(event.channel)
            return
        if kind is ContentReceived:
            content = event.content
            channel, method = content.channel, content.method
        elif kind is MethodReceived:
            channel, method, content = event.channel, event.method, None
        else:
            return
        state = self.channels.get(channel)
        if state is None:
            state = self.channels[channel] = _Channel(Deliveries(
                self.broker, channel, self.conn.frame_max, self.conn.send_raw, self._flush,
                self.conn.send_parts))
        try:
            if content is not None:
                await self._publish(channel, state, content)
            else:
                if self._pub_bytes and type(method) not in _NO_BARRIER:
                    # Publishes before this method take effect first (a get after a
                    # publish on the connection sees the message, as with RabbitMQ).
                    while self._pub_bytes:
                        await self._pub_space.wait()
                await self._method(channel, state, method)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise
        except AmqpError as exc:
            exc.channel = channel
            if self.vhost != "/":
                exc.text = exc.text.replace("in vhost '/'", f"in vhost '{self.vhost}'")
            if exc.class_id == 0:
                exc.class_id, exc.method_id = method.CLASS_ID, method.METHOD_ID
            if exc.connection_level:
                self.conn.close(exc.reply_code, exc.text, exc.class_id, exc.method_id)
            else:
                self.conn.close_channel(channel, exc.reply_code, exc.text, exc.class_id,
                                        exc.method_id)
                await self._drop_channel(channel)
        except Exception:
            # A bug must cost this connection only, never the server and its other clients.
            log.exception("AMQP %s on channel %d failed", method.NAME, channel)
            self.conn.close(errors.INTERNAL_ERROR, "INTERNAL_ERROR", method.CLASS_ID,
                            method.METHOD_ID)

    async def _flush(self) -> None:
        await self.flush()

    async def _drop_channel(self, channel: int) -> None:
        state = self.channels.pop(channel, None)
        if state is not None:
            for consumer in await state.deliveries.close():
                await self.broker.consumer_gone(consumer.queue)

    async def ended(self) -> None:
        """The connection is gone: its unacknowledged deliveries are requeued, its
        exclusive queues go."""
        # Publishes already received are stored (bounded by the caller's deadline).
        self._ended = True
        if self.read_acks:  # taken by a read that did not finish (a broken socket)
            self.apply_acks()
        if self._pubs and not self._storing:  # queued by publish_now, not yet taken
            self._begin_storing()
            await self._store()
        if self._storing:
            await self._stores_done.wait()
        for channel in list(self.channels):
            await self._drop_channel(channel)
        await self.broker.connection_ended(self.id)

    def _tag_taken(self, tag: str) -> bool:
        return any(tag in c.deliveries.consumers for c in self.channels.values())

    # ------------------------------------------------------------------ methods
    def _queue_name(self, state: _Channel, name: str) -> str:
        if name:
            return name
        if not state.last_queue:
            # RabbitMQ: 404 NOT_FOUND when no queue was declared on the channel.
            raise AmqpError(errors.NOT_FOUND, "NOT_FOUND - no previously declared queue")
        return state.last_queue

    async def _method(self, channel: int, state: _Channel, method: Any) -> None:
        broker, send = self.broker, self.conn.send
        kind = type(method)
        allow = self._allow
        if kind is QueueDeclare:
            if not method.passive and method.queue:
                allow("configure", "queue", method.queue)
            queue = broker.queue_declare(
                method.queue, passive=method.passive, durable=method.durable,
                exclusive=method.exclusive, auto_delete=method.auto_delete,
                arguments=method.arguments or {}, owner=self.id)
            if not method.passive and not method.queue and self.permissions is not None:
                try:  # RabbitMQ checks the server-generated name
                    allow("configure", "queue", queue.name)
                except AmqpError:
                    await broker.queue_delete(queue.name, self.id)
                    raise
            state.last_queue = queue.name
            if not method.nowait:
                count = await broker.message_count(queue)
                send(channel, QueueDeclareOk(queue.name, count,
                                             broker.presence.count(broker, queue)))
        elif kind is QueueBind:
            allow("write", "queue", self._queue_name(state, method.queue))
            allow("read", "exchange", method.exchange)
            await broker.queue_bind(self._queue_name(state, method.queue), method.exchange,
                                    method.routing_key, method.arguments or {}, self.id)
            if not method.nowait:
                send(channel, QueueBindOk())
        elif kind is QueueUnbind:
            allow("write", "queue", self._queue_name(state, method.queue))
            allow("read", "exchange", method.exchange)
            await broker.queue_unbind(self._queue_name(state, method.queue), method.exchange,
                                      method.routing_key, method.arguments or {}, self.id)
            send(channel, QueueUnbindOk())
        elif kind is ExchangeDeclare:
            if not method.passive:
                allow("configure", "exchange", method.exchange)
            broker.exchange_declare(
                method.exchange, method.exchange_type, passive=method.passive,
                durable=method.durable, auto_delete=method.auto_delete,
                internal=method.internal, arguments=method.arguments or {})
            if not method.nowait:
                send(channel, ExchangeDeclareOk())
        elif kind is ExchangeDelete:
            allow("configure", "exchange", method.exchange)
            await broker.exchange_delete(method.exchange, method.if_unused)
            if not method.nowait:
                send(channel, ExchangeDeleteOk())
        elif kind is QueueDelete:
            allow("configure", "queue", self._queue_name(state, method.queue))
            count = await broker.queue_delete(self._queue_name(state, method.queue), self.id,
                                              method.if_unused, method.if_empty)
            if not method.nowait:
                send(channel, QueueDeleteOk(count))
        elif kind is QueuePurge:
            allow("read", "queue", self._queue_name(state, method.queue))
            count = await broker.queue_purge(self._queue_name(state, method.queue), self.id)
            if not method.nowait:
                send(channel, QueuePurgeOk(count))
        elif kind is ExchangeBind or kind is ExchangeUnbind:
            allow("write", "exchange", method.destination)
            allow("read", "exchange", method.source)
            await broker.exchange_bind(method.destination, method.source, method.routing_key,
                                       method.arguments or {}, kind is ExchangeBind)
            if not method.nowait:
                send(channel, ExchangeBindOk() if kind is ExchangeBind else ExchangeUnbindOk())
        elif kind is BasicAck:
            self.read_acks += state.deliveries.ack(method.delivery_tag, method.multiple)
        elif kind is BasicNack:
            await state.deliveries.nack(method.delivery_tag, method.multiple, method.requeue)
        elif kind is BasicReject:
            await state.deliveries.nack(method.delivery_tag, False, method.requeue)
        elif kind is BasicQos:
            # prefetch_size is not limited (RabbitMQ ignores it too); the count covers
            # the channel's unacknowledged deliveries, global or not (docs/amqp.md).
            state.deliveries.set_prefetch(method.prefetch_count)
            send(channel, BasicQosOk())
        elif kind is BasicConsume:
            allow("read", "queue", self._queue_name(state, method.queue))
            queue = broker.consumable(self._queue_name(state, method.queue), self.id)
            async with broker.presence.consuming(broker, queue, method.exclusive):
                tag = state.deliveries.consume(method.consumer_tag, queue,
                                               broker.queue_pop(queue), method.no_ack,
                                               self._tag_taken, method.exclusive)
            if not method.nowait:
                send(channel, BasicConsumeOk(tag))
        elif kind is BasicCancel:
            consumer = state.deliveries.cancel(method.consumer_tag)
            if not method.nowait:
                send(channel, BasicCancelOk(method.consumer_tag))
            if consumer is not None:
                await broker.consumer_gone(consumer.queue)
        elif kind is BasicRecover or kind is BasicRecoverAsync:
            if not method.requeue:
                # RabbitMQ does not implement redelivery to the same consumer either.
                raise AmqpError(errors.NOT_IMPLEMENTED, "NOT_IMPLEMENTED - requeue=false")
            await state.deliveries.recover()
            if kind is BasicRecover:
                send(channel, BasicRecoverOk())
        elif kind is BasicGet:
            allow("read", "queue", self._queue_name(state, method.queue))
            queue = broker.consumable(self._queue_name(state, method.queue), self.id)
            await state.deliveries.get(broker.queue_pop(queue), queue, method.no_ack)
        elif kind is TxSelect:
            if state.confirm:
                raise AmqpError(errors.PRECONDITION_FAILED, "PRECONDITION_FAILED - cannot "
                                "switch from confirm to tx mode")
            if state.tx_pubs is None:
                state.tx_pubs = []
                state.deliveries.tx = []
            send(channel, TxSelectOk())
        elif kind is TxCommit or kind is TxRollback:
            if state.tx_pubs is None:
                raise AmqpError(errors.PRECONDITION_FAILED, "PRECONDITION_FAILED - channel "
                                "is not transactional")
            pubs, state.tx_pubs = state.tx_pubs, []
            if kind is TxCommit:
                if pubs:
                    await self._enqueue([(pb, body, None, channel, state)
                                         for pb, body in pubs])
                    while self._pub_bytes:  # stored before Commit-Ok
                        await self._pub_space.wait()
                await state.deliveries.commit()
                send(channel, TxCommitOk())
            else:
                state.deliveries.rollback()
                send(channel, TxRollbackOk())
        elif kind is ConfirmSelect:
            if state.tx_pubs is not None:
                raise AmqpError(errors.PRECONDITION_FAILED, "PRECONDITION_FAILED - cannot "
                                "switch from tx to confirm mode")
            state.confirm = True
            if not method.nowait:
                send(channel, ConfirmSelectOk())
        else:
            # The next slices (consume, get, ack, qos, tx, ...).
            raise AmqpError(errors.NOT_IMPLEMENTED, f"NOT_IMPLEMENTED - {method.NAME} is not "
                            "supported yet", 0, method.CLASS_ID, method.METHOD_ID)

    async def _publish(self, channel: int, state: _Channel, content: Any) -> None:
        method = content.method
        if type(method) is not BasicPublish:
            raise AmqpError(errors.COMMAND_INVALID, f"COMMAND_INVALID - {method.NAME} "
                            "from a client", 0, method.CLASS_ID, method.METHOD_ID)
        if method.immediate:
            # RabbitMQ 3+ refuses immediate with a connection error.
            raise AmqpError(errors.NOT_IMPLEMENTED, "NOT_IMPLEMENTED - immediate=true", 0,
                            60, 40)
        broker = self.broker
        if self.permissions is not None:
            self._allow("write", "exchange", method.exchange)
        props = content.properties
        if props.expiration is not None:
            parse_expiration(props.expiration)  # 406 for a malformed one, as RabbitMQ
        lmqs = broker.route(method.exchange, method.routing_key, props.headers)
        entry: list | None = None
        if state.confirm:
            entry = [state.next_publish_tag, None]
            state.next_publish_tag += 1
            state.confirms.append(entry)
        trim: list = []
        rejected = False
        if broker.limited and state.tx_pubs is None:
            limited = [q for lmq in lmqs if (q := broker.limited.get(lmq)) is not None]
            if limited:
                lmqs, trim, rejected = await self._admit(method, content, lmqs, limited)
        if not lmqs:
            broker.stats["unroutable"] += 1
            if method.mandatory:
                # Basic.Return goes out before the confirm (RabbitMQ's order).
                self.conn.send_raw(encode_content(
                    channel, BasicReturn(errors.NO_ROUTE, "NO_ROUTE", method.exchange,
                                         method.routing_key),
                    content.raw_properties, content.body, self.conn.frame_max))
            if entry is not None:
                entry[1] = not rejected
                self._confirm(channel, state)
            return
        pb = broker.stored_properties(method.exchange, method.routing_key, props,
                                      content.raw_properties, lmqs)
        if state.tx_pubs is not None:
            size = sum(len(p) + len(b) for p, b in state.tx_pubs)
            if size + len(pb) + len(content.body) > broker.config.max_publish_backlog_bytes:
                raise AmqpError(errors.PRECONDITION_FAILED, "PRECONDITION_FAILED - "
                                "transaction larger than max_publish_backlog_bytes")
            state.tx_pubs.append((pb, content.body))
            return
        if rejected and entry is not None:
            entry.append("rejected")  # stored, but a queue refused it: Basic.Nack
        await self._enqueue([(pb, content.body, entry, channel, state)])
        if trim:
            while self._pub_bytes:  # stored first, then the oldest go
                await self._pub_space.wait()
            for queue in trim:
                await broker.policy.trim(queue)

    async def _admit(self, method: Any, content: Any, lmqs: list[str],
                     limited: list) -> tuple[list[str], list, bool]:
        """x-max-length: the LMQs the publish may reach, the drop-head queues to trim
        after it is stored, and whether a reject-publish queue refused it."""
        while self._pub_bytes:  # count with this connection's earlier publishes stored
            await self._pub_space.wait()
        policy = self.broker.policy
        refused: set[str] = set()
        trim = []
        for queue in limited:
            mode = queue.args.overflow
            if mode == "drop-head":
                trim.append(queue)
            elif await policy.over_limit(queue):
                refused.add(queue.lmq)
                policy.stats["rejected"] += 1
                if mode == "reject-publish-dlx":
                    await policy.republish(queue, method.exchange, method.routing_key,
                                           content.properties, content.body, "maxlen")
        if refused:
            lmqs = [lmq for lmq in lmqs if lmq not in refused]
        return lmqs, trim, bool(refused)
