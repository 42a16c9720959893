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
    BasicReject,
    BasicReturn,
    ConfirmSelect,
    ConfirmSelectOk,
    ExchangeDeclare,
    ExchangeDeclareOk,
    ExchangeDelete,
    ExchangeDeleteOk,
    QueueBind,
    QueueBindOk,
    QueueDeclare,
    QueueDeclareOk,
    QueueDelete,
    QueueDeleteOk,
    QueueUnbind,
    QueueUnbindOk,
)

__all__ = ["AmqpSession"]

log = logging.getLogger(__name__)

_connection_ids = itertools.count(1)


class _Channel:
    __slots__ = ("confirm", "next_publish_tag", "last_queue", "deliveries")

    def __init__(self, deliveries: Deliveries) -> None:
        self.confirm = False
        self.next_publish_tag = 1
        self.last_queue = ""  # "the current queue" of spec 1.7.2.1 (a "" queue name)
        self.deliveries = deliveries


async def _no_flush() -> None:
    return None


class AmqpSession:
    """The broker side of one connection."""

    def __init__(self, conn: ServerConnection, broker: AmqpBroker) -> None:
        self.conn = conn
        self.broker = broker
        self.id = next(_connection_ids)
        self.channels: dict[int, _Channel] = {}
        #: Writes what the connection has queued to the socket (set by the server).
        self.flush: Callable[[], Awaitable[None]] = _no_flush

    async def handle(self, event: Any) -> None:
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
                self.broker, channel, self.conn.frame_max, self.conn.send_raw, self._flush))
        try:
            if content is not None:
                await self._publish(channel, state, content)
            else:
                await self._method(channel, state, method)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise
        except AmqpError as exc:
            exc.channel = channel
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
            await state.deliveries.close()

    async def ended(self) -> None:
        """The connection is gone: its unacknowledged deliveries are requeued, its
        exclusive queues go."""
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
        if kind is QueueDeclare:
            queue = broker.queue_declare(
                method.queue, passive=method.passive, durable=method.durable,
                exclusive=method.exclusive, auto_delete=method.auto_delete,
                arguments=method.arguments or {}, owner=self.id)
            state.last_queue = queue.name
            if not method.nowait:
                send(channel, QueueDeclareOk(queue.name, 0, 0))
        elif kind is QueueBind:
            await broker.queue_bind(self._queue_name(state, method.queue), method.exchange,
                                    method.routing_key, method.arguments or {}, self.id)
            if not method.nowait:
                send(channel, QueueBindOk())
        elif kind is QueueUnbind:
            await broker.queue_unbind(self._queue_name(state, method.queue), method.exchange,
                                      method.routing_key, method.arguments or {}, self.id)
            send(channel, QueueUnbindOk())
        elif kind is ExchangeDeclare:
            broker.exchange_declare(
                method.exchange, method.exchange_type, passive=method.passive,
                durable=method.durable, auto_delete=method.auto_delete,
                internal=method.internal, arguments=method.arguments or {})
            if not method.nowait:
                send(channel, ExchangeDeclareOk())
        elif kind is ExchangeDelete:
            await broker.exchange_delete(method.exchange, method.if_unused)
            if not method.nowait:
                send(channel, ExchangeDeleteOk())
        elif kind is QueueDelete:
            count = await broker.queue_delete(self._queue_name(state, method.queue), self.id)
            if not method.nowait:
                send(channel, QueueDeleteOk(count))
        elif kind is BasicAck:
            await state.deliveries.ack(method.delivery_tag, method.multiple)
        elif kind is BasicNack:
            await state.deliveries.nack(method.delivery_tag, method.multiple, method.requeue)
        elif kind is BasicReject:
            await state.deliveries.nack(method.delivery_tag, False, method.requeue)
        elif kind is BasicQos:
            # prefetch_size is not limited (RabbitMQ ignores it too); the count covers
            # the channel's unacknowledged deliveries, global or not (docs/amqp.md).
            state.deliveries.prefetch = method.prefetch_count
            send(channel, BasicQosOk())
        elif kind is BasicConsume:
            queue = broker.consumable(self._queue_name(state, method.queue), self.id)
            tag = state.deliveries.consume(method.consumer_tag, queue.lmq,
                                           broker.queue_pop(queue), method.no_ack,
                                           self._tag_taken)
            if not method.nowait:
                send(channel, BasicConsumeOk(tag))
        elif kind is BasicCancel:
            state.deliveries.cancel(method.consumer_tag)
            if not method.nowait:
                send(channel, BasicCancelOk(method.consumer_tag))
        elif kind is BasicGet:
            queue = broker.consumable(self._queue_name(state, method.queue), self.id)
            await state.deliveries.get(broker.queue_pop(queue), queue.lmq, method.no_ack)
        elif kind is ConfirmSelect:
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
        props = content.properties
        lmqs = self.broker.route(method.exchange, method.routing_key, props.headers)
        stored = True
        if lmqs:
            stored = await self.broker.store(method.exchange, method.routing_key, props,
                                             content.raw_properties, content.body, lmqs)
        else:
            self.broker.stats["unroutable"] += 1
            if method.mandatory:
                # Basic.Return goes out before the confirm (RabbitMQ's order).
                self.conn.send_raw(encode_content(
                    channel, BasicReturn(errors.NO_ROUTE, "NO_ROUTE", method.exchange,
                                         method.routing_key),
                    content.raw_properties, content.body, self.conn.frame_max))
        if state.confirm and channel in self.channels:
            tag = state.next_publish_tag
            state.next_publish_tag += 1
            self.conn.send(channel, BasicAck(tag, False) if stored
                           else BasicNack(tag, False, False))
