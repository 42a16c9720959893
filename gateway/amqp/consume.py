"""Basic.Consume / Get / Ack / Nack / Reject / Qos / Cancel over the broker's POP
(docs/amqp.md "Consuming", docs/pop.md).

A queue's LMQ is popped by the consumer group of the queue (`AmqpBroker.queue_pop`), so
any gateway can serve any consumer and the acknowledgement state lives in the broker.
Every delivery is a POP delivery with an invisibility deadline; its AMQP delivery tag maps
to the POP receipt: ack → ACK_MESSAGE, nack/reject with requeue → change invisible time
0 (redelivered at once, `redelivered` set from the delivery count), reject without requeue
→ POP_DEAD_LETTER. Deliveries left unacknowledged when their channel closes are requeued
(change invisible time 0), as RabbitMQ does.
"""

from __future__ import annotations

import base64
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import trio

from core.client.errors import MQClientError
from core.client.pop_consumer import PopClient, PopMessage, PopRecord, PopStatus
from core.common.properties import MessageConst
from core.remoting.errors import RemotingError
from gateway.amqp import errors
from gateway.amqp.arrival import AtArrival, wire_of
from gateway.amqp.broker import (
    PROP_EXCHANGE,
    PROP_PROPERTIES,
    PROP_ROUTING_KEY,
    PROP_TTL,
    AmqpBroker,
    Queue,
)
from gateway.amqp.codec import (
    deliver_head,
    deliver_parts,
    deliver_tail,
    encode_content,
    encode_method_frame,
)
from gateway.amqp.dead_letter import delivery_fault, envelope, now_ms
from gateway.amqp.errors import AmqpError
from gateway.amqp.methods import BasicCancel, BasicGetEmpty, BasicGetOk
from gateway.amqp.properties import EMPTY_PROPERTIES
from gateway.mqtt.message import K_EXPIRY, K_TOPIC

__all__ = ["Consumer", "Deliveries", "RETRY_DELAY_S"]

log = logging.getLogger(__name__)

#: Pause after a failed POP before the consumer loop tries again.
RETRY_DELAY_S = 0.5
#: Expired messages one Basic.Get skips (dead-letters) before it answers Get-Empty.
MAX_GET_SKIPS = 64
_BROKER_ERRORS = (MQClientError, RemotingError, OSError, trio.TooSlowError)
_EX = PROP_EXCHANGE.encode()
_RK = PROP_ROUTING_KEY.encode()
_P = PROP_PROPERTIES.encode()
_TTL = PROP_TTL.encode()
_EXPIRY = K_EXPIRY.encode()
_MQTT_TOPIC = K_TOPIC.encode()
_MQTT_TOPIC64 = _MQTT_TOPIC + b"64"
#: Decoded (exchange, routing key, AMQP properties) by their stored octets: most
#: deliveries repeat those of earlier ones. Bounded; the memory starts over when full.
_ENVELOPE_CACHE_SIZE = 1024
_ENVELOPE_CACHE_MAX_BYTES = 1024  # stored properties + routing key of one entry
_ENVELOPES: dict[tuple, tuple[str, str, bytes, bytes]] = {}
#: The names a delivery reads: ours, and those of MQTT publishes (the amq.topic bridge).
_OURS = (b"AMQP_", b"MQTT_")
#: The pair the broker appends to a multi-dispatched record (its offset in each LMQ):
#: the only part of a stored publish's properties that changes from one message to the
#: next, so what comes before it keys a second cache, looked up before any split.
_QUEUE_OFFSET_PAIR = b"\x02" + MessageConst.INNER_MULTI_QUEUE_OFFSET.encode() + b"\x01"
_STORED_KEY_MAX_BYTES = 4096  # so that cache holds at most about 4 MiB of keys
_BY_STORED: dict[bytes, tuple[str, str, bytes, bool, bytes]] = {}
#: The envelopes of records fanned out to several queues (a comma in the offsets pair),
#: by the identity of their properties object: the pops of one such record share that
#: object (`core.client.pop_consumer`'s shared decode), so the 2nd to Nth deliveries are
#: one dict lookup, with no slice or hash of properties that list every queue. Each entry
#: keeps its object, so its id is not reused while cached. Bounded by entries and by the
#: octets those objects hold; starts over when full.
_FANNED_MAX_BYTES = 4 << 20
_FANNED: dict[int, tuple[bytes, tuple[str, str, bytes, bool, bytes]]] = {}
_fanned_bytes = 0


def _our_pairs(raw: bytes) -> dict[bytes, bytes]:
    """The pairs of encoded properties whose names start with AMQP_ or MQTT_ (one split at
    the pair separators, in C, then a look at each pair's name: a fanned-out record's
    properties list every queue it went to, so a substring search per value would scan
    them each time); the last non-empty value of a name wins, as in
    `decode_properties`."""
    out: dict[bytes, bytes] = {}
    for item in raw.split(b"\x02"):
        if item.startswith(_OURS):
            name, sep, value = item.partition(b"\x01")
            if sep and value:
                out[name] = value
    return out


def _text(raw: bytes | None) -> str:
    return unquote(raw.decode("utf-8", "replace"), errors="surrogateescape") if raw else ""


def _full_envelope(m: PopMessage, own_ttl: bool) -> tuple[str, str, bytes, bool, bytes]:
    exchange, key, raw = envelope(m)
    return exchange, key, raw, own_ttl, deliver_tail(exchange, key)


def _envelope(m: PopMessage) -> tuple[str, str, bytes, bool, bytes]:
    """`dead_letter.envelope`, whether the message may carry its own expiration (AMQP
    expiration or MQTT message expiry), and Basic.Deliver's encoded exchange and routing
    key (`deliver_tail`), read out of a light record's encoded properties instead of
    decoding them all."""
    rec = m.message
    if type(rec) is not PopRecord:
        props = rec.properties
        return _full_envelope(m, PROP_TTL in props or K_EXPIRY in props)
    raw_props = rec.raw_properties
    fanned = _FANNED.get(id(raw_props))
    if fanned is not None and fanned[0] is raw_props:
        return fanned[1]
    cut = raw_props.rfind(_QUEUE_OFFSET_PAIR)
    stored = None
    if 0 < cut <= _STORED_KEY_MAX_BYTES and \
            raw_props.find(b"\x02", cut + len(_QUEUE_OFFSET_PAIR)) < 0:
        stored = raw_props[:cut]  # the offsets pair is the last one: the rest is constant
        hit = _BY_STORED.get(stored)
        if hit is not None:
            if raw_props.find(b",", cut) > 0:
                _remember_fanned(raw_props, hit)
            return hit
    pairs = _our_pairs(raw_props)
    own_ttl = _TTL in pairs or _EXPIRY in pairs
    props = pairs.get(_P)
    if props is None and (_MQTT_TOPIC in pairs or _MQTT_TOPIC64 in pairs):
        return _full_envelope(m, own_ttl)  # an MQTT publish: its properties mapped there
    key = (pairs.get(_EX), pairs.get(_RK), props)
    found = _ENVELOPES.get(key)
    if found is None:
        exchange, routing_key = _text(key[0]), _text(key[1])
        found = (exchange, routing_key, base64.b64decode(props) if props else EMPTY_PROPERTIES,
                 deliver_tail(exchange, routing_key))
        if len(props or b"") + len(key[1] or b"") <= _ENVELOPE_CACHE_MAX_BYTES:
            if len(_ENVELOPES) >= _ENVELOPE_CACHE_SIZE:
                _ENVELOPES.clear()
            _ENVELOPES[key] = found
        else:
            stored = None
    out = found[0], found[1], found[2], own_ttl, found[3]
    if stored is not None:
        if len(_BY_STORED) >= _ENVELOPE_CACHE_SIZE:
            _BY_STORED.clear()
        _BY_STORED[stored] = out
    if cut > 0 and raw_props.find(b",", cut) > 0:
        _remember_fanned(raw_props, out)
    return out


def _remember_fanned(raw_props: bytes, out: tuple[str, str, bytes, bool, bytes]) -> None:
    global _fanned_bytes
    size = len(raw_props)
    if size > _FANNED_MAX_BYTES:
        return
    if len(_FANNED) >= _ENVELOPE_CACHE_SIZE or _fanned_bytes + size > _FANNED_MAX_BYTES:
        _FANNED.clear()
        _fanned_bytes = 0
    _FANNED[id(raw_props)] = (raw_props, out)
    _fanned_bytes += size


#: Consumers per connection (by the connection's flush callable, shared by its channels),
#: and the connections whose socket write a consumer put off to the end of the current
#: scheduler batch (`Deliveries._write`): with several consumers on one connection, the
#: ones a dispatch woke together send their deliveries with one write.
_CONSUMERS: dict[Callable, int] = {}
_DEFERRED: set[Callable] = set()


class Consumer:
    __slots__ = ("tag", "queue", "queue_lmq", "pop", "no_ack", "cancelled", "deliveries",
                 "head", "stash")

    def __init__(self, tag: str, queue: Queue, pop: PopClient, no_ack: bool,
                 deliveries: Deliveries) -> None:
        self.deliveries = deliveries
        self.tag = tag
        self.queue = queue
        self.queue_lmq = queue.lmq
        self.pop = pop
        self.no_ack = no_ack
        self.cancelled = False
        self.head = deliver_head(tag)  # Basic.Deliver's first fields, encoded once
        #: Messages a hand-off popped and left to the consumer's task (a delivery fault).
        self.stash: list[PopMessage] | None = None

    def take_arrival(self, parked: Any, after: dict) -> int:
        """The hand-off of its parked pop (core/broker/pop/handoff.py)."""
        return self.deliveries.deliver_now(self, parked, after)


class Deliveries(AtArrival):
    """The deliveries of one channel: tags, unacknowledged messages, prefetch, consumers.

    `send(frames)` queues octets on the connection (`send_parts` a list of pieces, joined
    when written); `flush()` writes them to the socket.
    """

    _deferred_writes = _DEFERRED  # (AtArrival)

    def __init__(self, broker: AmqpBroker, channel: int, frame_max: int,
                 send: Callable[[bytes], None], flush: Callable[[], Awaitable[None]],
                 send_parts: Callable[[list], None] | None = None) -> None:
        self.broker = broker
        self.channel = channel
        self.frame_max = frame_max
        self.send = send
        self.send_parts = send_parts or (lambda parts: send(b"".join(parts)))
        self.flush = flush
        self.prefetch = 0  # 0 = unlimited
        self.next_tag = 1
        self.unacked: dict[int, tuple[PopClient, PopMessage, Queue]] = {}
        self.consumers: dict[str, Consumer] = {}
        self.closed = False
        #: In tx mode (Tx.Select): settlements held until commit (tag, pop, message, how).
        self.tx: list | None = None
        self._room = trio.Event()
        self._room_waiters = 0  # consumer loops waiting on `_room`
        self._wire = wire_of(flush)  # for deliveries at arrival (arrival.py)

    # ------------------------------------------------------------------ consumers
    def consume(self, tag: str, queue: Queue, pop: PopClient, no_ack: bool,
                taken: Callable[[str], bool], exclusive: bool = False) -> str:
        if not tag:
            tag = "amq.ctag-" + base64.urlsafe_b64encode(secrets.token_bytes(16)).decode()[:22]
        elif tag in self.consumers or taken(tag):
            # RabbitMQ: 530 NOT_ALLOWED, a connection error.
            raise AmqpError(errors.NOT_ALLOWED, f"NOT_ALLOWED - attempt to reuse consumer "
                            f"tag '{tag}'")
        if queue.exclusive_consumer or (exclusive and queue.consumers):
            raise AmqpError(errors.ACCESS_REFUSED, f"ACCESS_REFUSED - queue '{queue.name}' in "
                            "vhost '/' in exclusive use")
        consumer = self.consumers[tag] = Consumer(tag, queue, pop, no_ack, self)
        _CONSUMERS[self.flush] = _CONSUMERS.get(self.flush, 0) + 1
        queue.consumers += 1
        queue.subscribers.add(consumer)
        if queue.args.single_active:
            queue.waiting.append(consumer)
            self.broker.sac.consuming(queue)  # single across gateways (sac.py)
        if queue.args.expires is not None:
            self.broker.expiry.consuming(queue)  # in use for the others (expiry.py)
        queue.exclusive_consumer = exclusive
        nursery = self.broker.nursery
        if nursery is None:
            raise AmqpError(errors.INTERNAL_ERROR, "INTERNAL_ERROR - broker side not running")
        nursery.start_soon(self._consume_loop, consumer)
        return tag

    def cancel(self, tag: str) -> Consumer | None:
        consumer = self.consumers.pop(tag, None)
        if consumer is None:
            return None
        consumer.cancelled = True
        self._forget_consumer()
        queue = consumer.queue
        queue.consumers -= 1
        queue.exclusive_consumer = False
        queue.subscribers.discard(consumer)
        if consumer in queue.waiting:
            # x-single-active-consumer: the next in line takes over (all waiters wake, so
            # this consumer's loop ends too).
            queue.waiting.remove(consumer)
            queue.active_changed.set()
            queue.active_changed = trio.Event()
        self._wake()
        return consumer

    async def cancel_by_server(self, tag: str) -> None:
        """The queue is gone: stop the consumer and tell the client (Basic.Cancel, the
        `consumer_cancel_notify` capability)."""
        if self.cancel(tag) is None or self.closed:
            return
        self.send(encode_method_frame(self.channel, BasicCancel(tag, True)))
        try:
            await self.flush()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.closed = True

    def _wake(self) -> None:
        """Room may have come (acks, a cancel): wake the consumer loops waiting for it,
        if any (an event is made again only when one waited)."""
        if self._room_waiters:
            self._room.set()
            self._room = trio.Event()

    def set_prefetch(self, count: int) -> None:
        """Basic.Qos: the channel's prefetch count (0 = unlimited); consumers waiting for
        room look again at once (a raised count frees room without an ack)."""
        self.prefetch = count
        self._wake()

    def _room_left(self) -> int:
        batch = self.broker.config.pop_batch
        if not self.prefetch:
            return batch
        return min(batch, self.prefetch - len(self.unacked))

    async def _consume_loop(self, consumer: Consumer) -> None:
        try:
            await self._consume(consumer)
        except Exception:
            # Runs in the broker's nursery: a bug stops this consumer, not the gateway.
            log.exception("AMQP consumer %s failed", consumer.tag)
            if self.consumers.pop(consumer.tag, None) is not None:
                self._forget_consumer()

    def _forget_consumer(self) -> None:
        left = _CONSUMERS.get(self.flush, 0) - 1
        if left > 0:
            _CONSUMERS[self.flush] = left
        else:
            _CONSUMERS.pop(self.flush, None)

    async def _write(self) -> None:
        """Write the deliveries queued on the connection. When it has other consumers
        (which a fan-out's dispatch wakes in the same scheduler batch), the first of them
        to get here yields once, to the end of that batch, and then writes for all; the
        others leave their frames to it: one socket write instead of one each. (trio's
        count of runnable tasks does not include the rest of the batch being run, so it
        cannot tell whether others follow: the yield is paid per pop of such a
        connection's consumers, a scheduler pass, less than the write it may save.)"""
        flush = self.flush
        if flush in _DEFERRED:
            return  # queued: written by the consumer that deferred this connection's write
        if _CONSUMERS.get(flush, 0) > 1:
            _DEFERRED.add(flush)
            try:
                await trio.lowlevel.checkpoint()
            finally:
                _DEFERRED.discard(flush)
        await flush()

    async def _consume(self, consumer: Consumer) -> None:
        cfg = self.broker.config
        queue = consumer.queue
        # Deliveries at arrival (deliver_now) when the socket can be written at once.
        hand_off = consumer.take_arrival if self._wire is not None else None
        while not consumer.cancelled and not self.closed:
            messages = consumer.stash
            if messages is not None:  # popped by a hand-off, left to this task
                consumer.stash = None
            else:
                if queue.waiting and (queue.waiting[0] is not consumer
                                      or not self.broker.sac.active(queue)):
                    # x-single-active-consumer: wait until the consumers before it are
                    # gone, here and on the other gateways (the queue's lock, sac.py).
                    await queue.active_changed.wait()
                    continue
                room = batch = self._room_left()
                if consumer.no_ack:
                    room = batch = cfg.pop_batch
                if room <= 0:
                    self._room_waiters += 1
                    try:
                        await self._room.wait()
                    finally:
                        self._room_waiters -= 1
                    continue
                try:
                    result = await consumer.pop.pop(consumer.queue_lmq, max_nums=batch,
                                                    invisible_ms=cfg.invisible_ms,
                                                    poll_ms=cfg.poll_ms, light=True,
                                                    volatile=not queue.durable,
                                                    hand_off=hand_off)
                except _BROKER_ERRORS as exc:
                    log.warning("AMQP consumer pop failed: %r", exc)
                    await trio.sleep(RETRY_DELAY_S)
                    await self.broker.register_holder()
                    continue
                if result.status is not PopStatus.FOUND:
                    if result.status == PopStatus.POLLING_FULL:
                        await trio.sleep(RETRY_DELAY_S)
                    continue
                messages = result.messages
            lost = bool(queue.waiting) and not self.broker.sac.active(queue)
            if consumer.cancelled or self.closed or lost:
                # Popped after the cancel, or after this gateway lost the queue's
                # single-active lock (sac.py): give them back at once.
                for m in messages:
                    await self._requeue(consumer.pop, m)
                if lost:
                    continue
                return
            parts: list = []
            i = 0
            while True:
                i, fault = self._frames(consumer, messages, i, parts)
                if fault is None:
                    break
                if parts:  # out before anything else can take a tag
                    self.send_parts(parts)
                    parts = []
                await self.broker.policy.dead_letter(queue, consumer.pop, messages[i], fault)
                i += 1
            self.send_parts(parts)
            try:
                await self._write()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.closed = True
            if consumer.no_ack:
                self.broker.ack_popped(consumer.pop, messages)
        stash, consumer.stash = consumer.stash, None
        for m in stash or ():  # (a hand-off's, cancelled before this task took it)
            await self._requeue(consumer.pop, m)

    def _frames(self, consumer: Consumer, messages: list[PopMessage], start: int,
                parts: list) -> tuple[int, str | None]:
        """Add the Basic.Deliver frames of `messages[start:]` to `parts` (each takes a
        delivery tag) until one must be dead-lettered instead (expired): (its index, why),
        or (len(messages), None)."""
        queue = consumer.queue
        checks = queue.args.checks_delivery
        channel, frame_max, head = self.channel, self.frame_max, consumer.head
        unacked = None if consumer.no_ack else self.unacked
        now = 0
        for i in range(start, len(messages)):
            m = messages[i]
            _, _, raw, own_ttl, tail = _envelope(m)
            if checks or own_ttl:
                now = now or now_ms()
                fault = delivery_fault(queue, m, now)
                if fault is not None:
                    return i, fault
            tag = self.next_tag
            self.next_tag += 1
            if unacked is not None:
                unacked[tag] = (consumer.pop, m, queue)
            deliver_parts(parts, channel, head, tag, m.redelivered, tail, raw, m.body,
                          frame_max)
        return len(messages), None

    # ------------------------------------------------------------------ get
    async def get(self, pop: PopClient, queue: Queue, no_ack: bool) -> None:
        checks = queue.args.checks_delivery
        for _ in range(MAX_GET_SKIPS):
            try:
                result = await pop.pop(queue.lmq, max_nums=1,
                                       invisible_ms=self.broker.config.invisible_ms,
                                       poll_ms=0, light=True, volatile=not queue.durable)
            except _BROKER_ERRORS as exc:
                raise AmqpError(errors.INTERNAL_ERROR, f"INTERNAL_ERROR - {exc}") from None
            if result.status is not PopStatus.FOUND or not result.messages:
                break
            m = result.messages[0]
            exchange, key, raw, own_ttl, _ = _envelope(m)
            if checks or own_ttl:
                fault = delivery_fault(queue, m, now_ms())
                if fault is not None:  # expired: the next one (bounded)
                    await self.broker.policy.dead_letter(queue, pop, m, fault)
                    continue
            break
        else:
            result = None
        if result is None or result.status is not PopStatus.FOUND or not result.messages:
            self.send(encode_method_frame(self.channel, BasicGetEmpty("")))
            return
        tag = self.next_tag
        self.next_tag += 1
        if no_ack:
            await self._settle(pop.ack, m)
        else:
            self.unacked[tag] = (pop, m, queue)
        self.send(encode_content(self.channel, BasicGetOk(tag, m.redelivered, exchange, key,
                                                          result.rest_num),
                                 raw, m.body, self.frame_max))

    # ------------------------------------------------------------------ settling
    def _take(self, tag: int, multiple: bool) -> list[tuple[int, PopClient, PopMessage, Queue]]:
        if multiple:
            unacked = self.unacked
            if not tag:
                tags = list(unacked)
            else:
                # The dict is in tag order (tags grow; rollback sorts it again): stop at
                # the first one past `tag` instead of reading the whole prefetch window.
                tags = []
                for t in unacked:
                    if t > tag:
                        break
                    tags.append(t)
            return [(t, *unacked.pop(t)) for t in tags]
        entry = self.unacked.pop(tag, None)
        if entry is None:
            # RabbitMQ: 406 on the channel.
            raise AmqpError(errors.PRECONDITION_FAILED, f"PRECONDITION_FAILED - unknown "
                            f"delivery tag {tag}")
        return [(tag, *entry)]

    def ack(self, tag: int, multiple: bool) -> list[tuple[PopClient, PopMessage]]:
        """Basic.Ack: the (POP client, delivery) pairs to acknowledge in the broker, which
        the caller applies (`AmqpSession.read_acks`: once per read of the connection);
        none in tx mode (held until commit). 406 for an unknown tag."""
        taken = self._take(tag, multiple)
        if self.tx is not None:
            self.tx.extend((t, pop, m, q, "ack") for t, pop, m, q in taken)
            return []
        self._wake()
        if len(taken) == 1:
            return [(taken[0][1], taken[0][2])]
        return [(pop, m) for _, pop, m, _ in taken]

    async def nack(self, tag: int, multiple: bool, requeue: bool) -> None:
        taken = self._take(tag, multiple)
        if self.tx is not None:
            how = "requeue" if requeue else "reject"
            self.tx.extend((t, pop, m, q, how) for t, pop, m, q in taken)
            return
        for _, pop, m, queue in taken:
            if requeue:
                await self._settle(pop.nack, m)
            else:
                await self.broker.policy.dead_letter(queue, pop, m, "rejected")
        self._wake()

    async def commit(self) -> None:
        """Tx.Commit: apply the acks, nacks and rejects of the transaction; returns once
        they are applied."""
        pending, self.tx = self.tx or [], []
        for _, pop, m, queue, how in pending:
            if how == "ack":
                self.broker.ack_later(pop, m)
            elif how == "requeue":
                await self._settle(pop.nack, m)
            else:
                await self.broker.policy.dead_letter(queue, pop, m, "rejected")
        self._wake()
        await self.broker.acks_settled()  # commit-ok: the acks hold (as RabbitMQ)

    def rollback(self) -> None:
        """Tx.Rollback: the settled deliveries are unacknowledged again."""
        pending, self.tx = self.tx or [], []
        for tag, pop, m, queue, _ in pending:
            self.unacked[tag] = (pop, m, queue)
        self.unacked = dict(sorted(self.unacked.items()))

    async def _settle(self, how: Callable[[PopMessage], Awaitable[bool]], m: PopMessage) -> None:
        try:
            await how(m)  # False: no longer current (redelivered since): nothing to do
        except _BROKER_ERRORS as exc:
            log.warning("AMQP settle failed: %r", exc)

    async def _requeue(self, pop: PopClient, m: PopMessage) -> None:
        await self._settle(pop.nack, m)

    async def recover(self) -> None:
        """Basic.Recover with requeue: every unacknowledged delivery back to its queue."""
        pending, self.unacked = list(self.unacked.values()), {}
        for pop, m, _ in pending:
            await self._requeue(pop, m)
        self._wake()

    async def close(self) -> list[Consumer]:
        """The channel is gone: stop its consumers (returned), requeue what it left
        unacknowledged."""
        self.closed = True
        self.rollback()  # an open transaction's settlements are void
        cancelled = [c for c in map(self.cancel, list(self.consumers)) if c is not None]
        await self.recover()
        return cancelled

