"""Queue arguments applied: message TTL, length limits, dead-lettering, queue expiry
(docs/amqp.md "Queue arguments").

- **Expiry of messages** is checked when a message reaches the head of its queue, i.e.
  when a consumer or a Basic.Get pops it (as RabbitMQ does for per-message TTL): an
  expired message is not delivered; it is dead-lettered when the queue has a dead-letter
  exchange, dropped (acknowledged) otherwise, and the next one is taken.
- **Dead-lettering** republishes the message (one stored copy, multi-dispatched like any
  publish) to the queue's dead-letter exchange with the dead-letter routing key (or its
  own), with the `x-death` history added, and only then acknowledges the original: a
  failure in between delivers twice rather than loses (at least once).
- **Length limits** are counted from the broker (the queue's LMQ end minus its group's
  consumed offset) before a publish reaches a limited queue: `reject-publish` leaves that
  queue out (Basic.Nack under confirms), `drop-head` dead-letters or drops the oldest
  messages after the publish is stored.
- **x-expires**: a queue with no consumer, no Basic.Get and no redeclare for that long is
  deleted (one timer task per gateway, a heap of deadlines).
"""

from __future__ import annotations

import base64
import heapq
import logging
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import trio

from core.client.errors import MQClientError
from core.client.pop_consumer import PopClient, PopMessage, PopStatus
from core.remoting.errors import RemotingError
from gateway.amqp.broker import PROP_EXCHANGE, PROP_PROPERTIES, PROP_ROUTING_KEY, PROP_TTL
from gateway.amqp.errors import AmqpError
from gateway.amqp.mqtt_bridge import mqtt_envelope
from gateway.amqp.pop_compat import unsupported
from gateway.amqp.properties import EMPTY_PROPERTIES, BasicProperties, decode_properties
from gateway.amqp.queue_args import dead_letter_properties, is_cycle
from gateway.mqtt.message import K_EXPIRY, K_TOPIC
from gateway.routing import lmq_names

if TYPE_CHECKING:
    from gateway.amqp.broker import AmqpBroker, Queue

__all__ = ["QueuePolicy", "delivery_fault", "envelope", "MAX_TRIM"]

log = logging.getLogger(__name__)

K_TOPIC64 = K_TOPIC + "64"

_BROKER_ERRORS = (MQClientError, RemotingError, OSError, trio.TooSlowError)
#: Most messages one drop-head trim removes after a publish (a queue far over its limit,
#: e.g. after the limit was lowered by a redeclare elsewhere, shrinks over several
#: publishes rather than holding one publisher for long).
MAX_TRIM = 256


def envelope(m: PopMessage) -> tuple[str, str, bytes]:
    """Exchange, routing key and raw AMQP properties of a stored publish."""
    props = m.message.properties
    raw = props.get(PROP_PROPERTIES)
    if raw is None and (K_TOPIC in props or K_TOPIC64 in props):
        # Published by an MQTT client (amq.topic bridge): properties built from its own.
        bridged = mqtt_envelope(props, int(time.time() * 1000))
        if bridged is not None:
            return bridged
    return (unquote(props.get(PROP_EXCHANGE, ""), errors="surrogateescape"),
            unquote(props.get(PROP_ROUTING_KEY, ""), errors="surrogateescape"),
            base64.b64decode(raw) if raw else EMPTY_PROPERTIES)


def delivery_fault(queue: Queue, m: PopMessage, now_ms: int) -> str | None:
    """Why a popped message must not be delivered: "expired" (queue TTL or its own
    expiration), "delivery_limit" (returned more often than x-delivery-limit); None to
    deliver it."""
    ttl = queue.args.message_ttl
    mqtt_expiry = m.message.properties.get(K_EXPIRY)
    if mqtt_expiry is not None and 0 < len(mqtt_expiry) <= 19 and mqtt_expiry.isdigit() \
            and now_ms >= int(mqtt_expiry):
        return "expired"  # an MQTT publish past its Message Expiry Interval
    own = m.message.properties.get(PROP_TTL)
    if own is not None:
        try:
            own_ms = int(own)
        except ValueError:
            own_ms = None
        if own_ms is not None:
            ttl = own_ms if ttl is None else min(ttl, own_ms)
    if ttl is not None and now_ms - m.message.store_timestamp > ttl:
        return "expired"
    limit = queue.args.delivery_limit
    if limit is not None and m.delivery_count - 1 > limit:
        return "delivery_limit"
    return None


def _queue_name(lmq: str) -> str | None:
    decoded = lmq_names.decode(lmq)
    return decoded[1] if decoded is not None else None


class QueuePolicy:
    """The argument-driven behaviour of the queues of one `AmqpBroker`."""

    def __init__(self, broker: AmqpBroker) -> None:
        self.broker = broker
        self._expiry: list[tuple[float, int, Queue]] = []
        self._expiry_wake = trio.Event()
        self._seq = 0
        self.stats = {"expired": 0, "dead_lettered": 0, "dropped": 0, "rejected": 0}

    # ------------------------------------------------------------------ dead-lettering
    async def republish(self, queue: Queue, exchange: str, routing_key: str,
                        props: BasicProperties, body: bytes, reason: str) -> bool:
        """Store a dead-lettered copy through `queue`'s dead-letter exchange. True when
        stored, or when there is nothing to store (no DLX, no route, a cycle: RabbitMQ
        drops the message then); False when the store failed."""
        broker, args = self.broker, queue.args
        if args.dlx is None:
            return True
        new_props, new_raw = dead_letter_properties(props, reason, queue.name, exchange,
                                                    [routing_key])
        key = args.dlrk if args.dlrk is not None else routing_key
        try:
            lmqs = broker.route(args.dlx, key, new_props.headers)
        except AmqpError:  # the DLX is gone or internal: dropped, as RabbitMQ does
            lmqs = []
        deaths = new_props.headers["x-death"]
        lmqs = [lmq for lmq in lmqs
                if not is_cycle(broker.plain(_queue_name(lmq) or ""), deaths)]
        if not lmqs:
            self.stats["dropped"] += 1
            return True
        pb = broker.stored_properties(args.dlx, key, new_props, new_raw, lmqs)
        qid = hash(queue.lmq) % broker.config.store_queues
        ok = await broker.store_batch(qid, [(pb, body)])
        if ok:
            self.stats["dead_lettered"] += 1
        return bool(ok)

    async def dead_letter(self, queue: Queue, pop: PopClient, m: PopMessage,
                          reason: str) -> None:
        """Dead-letter (or drop) a popped message, then acknowledge it."""
        if queue.args.dlx is None and reason == "rejected" and self.broker.extensions:
            # No DLX: the broker parks it in the group's %DLQ% (never delivered again).
            try:
                await pop.reject(m)
                return
            except _BROKER_ERRORS as exc:
                if not unsupported(exc):
                    log.warning("AMQP dead-letter settle failed: %r", exc)
                    return
                self.broker.apache_mode(exc)
            # An Apache broker has no such request: dropped below, as RabbitMQ does.
        if queue.args.dlx is not None:
            exchange, key, raw = envelope(m)
            try:
                props = decode_properties(raw)
            except AmqpError:
                props = BasicProperties()
            if not await self.republish(queue, exchange, key, props, m.body, reason):
                await self._settle(pop.nack, m)  # try again later
                return
        else:
            self.stats["dropped"] += 1
        if reason == "expired":
            self.stats["expired"] += 1
        await self._settle(pop.ack, m)

    async def _settle(self, how: Any, m: PopMessage) -> None:
        try:
            await how(m)
        except _BROKER_ERRORS as exc:
            log.warning("AMQP dead-letter settle failed: %r", exc)

    # ------------------------------------------------------------------ length limits
    async def over_limit(self, queue: Queue, incoming: int = 1) -> int:
        """How many messages the queue holds beyond x-max-length once `incoming` more
        arrive (0 when within it)."""
        limit = queue.args.max_length
        if limit is None:
            return 0
        count = await self.broker.message_count(queue)
        return max(0, count + incoming - limit)

    async def trim(self, queue: Queue) -> None:
        """drop-head: dead-letter (or drop) the oldest messages beyond x-max-length."""
        excess = min(await self.over_limit(queue, 0), MAX_TRIM)
        pop = self.broker.queue_pop(queue)
        cfg = self.broker.config
        while excess > 0:
            try:
                result = await pop.pop(queue.lmq, max_nums=min(excess, cfg.pop_batch),
                                       invisible_ms=cfg.invisible_ms, poll_ms=0,
                                       volatile=not queue.durable)
            except _BROKER_ERRORS as exc:
                log.warning("AMQP drop-head of %r failed: %r", queue.name, exc)
                return
            if result.status is not PopStatus.FOUND or not result.messages:
                return
            for m in result.messages:
                await self.dead_letter(queue, pop, m, "maxlen")
            excess -= len(result.messages)

    # ------------------------------------------------------------------ x-expires
    def schedule_expiry(self, queue: Queue) -> None:
        """(Re)arm the x-expires timer of a queue (after `queue.touch()`)."""
        if queue.expires_at is None:
            return
        self._seq += 1
        heapq.heappush(self._expiry, (queue.expires_at, self._seq, queue))
        self._expiry_wake.set()

    async def expiry_loop(self) -> None:
        """Delete queues unused for their x-expires (runs in the broker's nursery)."""
        broker = self.broker
        while True:
            heap = self._expiry
            if not heap:
                await self._expiry_wake.wait()
                self._expiry_wake = trio.Event()
                continue
            due, _, queue = heap[0]
            now = trio.current_time()
            if due > now:
                with trio.move_on_after(due - now):
                    await self._expiry_wake.wait()
                self._expiry_wake = trio.Event()
                continue
            heapq.heappop(heap)
            if broker.queues.get(queue.name) is not queue:
                continue  # deleted meanwhile
            if queue.consumers > 0 or queue.expires_at is None:
                continue  # in use: re-armed when its last consumer goes
            if queue.expires_at > now:
                self.schedule_expiry(queue)  # touched since: a later deadline
                continue
            try:
                await broker.delete_expired(queue)
            except Exception:
                log.exception("AMQP expiry of queue %r failed", queue.name)


def now_ms() -> int:
    return time.time_ns() // 1_000_000
