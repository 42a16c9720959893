"""The AMQP gateway's traffic with the broker for publishes and acknowledgements (a mixin
of `AmqpBroker`, gateway/amqp/broker.py): the stored properties of a publish, the store
request of a batch of publishes, the acknowledgements of one read applied in process
(`apply_acks`) and the task that sends the others as BATCH_ACK requests (docs/amqp.md,
"Exchanges, queues, publish", "Consuming" and "The connection side of a lone message")."""

from __future__ import annotations

import base64
import logging
import time
from typing import Any

import trio

from core.broker.processors.send import SendHeader
from core.client import MessageQueue
from core.client.errors import MQClientError
from core.client.pop_consumer import PopClient
from core.common.properties import MessageConst, encode_properties
from core.remoting.errors import RemotingError
from gateway.amqp.model import quote_text
from gateway.amqp.mqtt_bridge import add_mqtt_properties
from gateway.amqp.queue_args import parse_expiration
from gateway.mqtt.store_request import batch_body
from gateway.routing.route_table import BRIDGE_EXCHANGE

log = logging.getLogger("gateway.amqp.broker")

#: Message properties of a stored AMQP message: exchange, routing key (both percent-quoted,
#: so no RocketMQ property separator can appear) and the AMQP content properties as
#: received on the wire (base64), delivered again without re-encoding.
PROP_EXCHANGE = "AMQP_EX"
PROP_ROUTING_KEY = "AMQP_RK"
PROP_PROPERTIES = "AMQP_P"
#: The per-message TTL (the `expiration` property, ms) of a stored publish, when it has one.
PROP_TTL = "AMQP_TTL"
#: Readable copies of a few AMQP properties, for native (RocketMQ) consumers.
_READABLE = (("content_type", "AMQP_CONTENT_TYPE"), ("correlation_id", "AMQP_CORRELATION_ID"),
             ("message_id", "AMQP_MESSAGE_ID"))
#: The default topic of the store requests (the auto-create template, as producers send).
_DEFAULT_TOPIC = "TBW102"
#: A batch of publishes is cut at this many octets (the broker takes 4 MiB bodies).
MAX_BATCH_BYTES = 1024 * 1024
#: Acknowledgements per BATCH_ACK request (the broker takes up to 1024 entries).
ACK_BATCH = 512
#: At most this many BATCH_ACK entries (one per queue and pop) in one request.
ACK_REQUEST_ENTRIES = 256
#: Stored-property octets remembered per gateway (entries; the memory starts over when
#: full), for publishes whose AMQP properties are at most this many octets.
_PROPS_CACHE_SIZE = 1024
_PROPS_CACHE_MAX_RAW = 512


class BrokerTraffic:
    """Publish storing and acknowledgement sending of `AmqpBroker` (which provides
    `config`, `client`, `addr`, `broker_name`, `stats` and `_ns`)."""

    def _init_traffic(self) -> None:
        #: Stored properties of recent publishes (stored_properties).
        self._props_cache: dict[tuple, bytes] = {}
        # Acks waiting for the ack task: sent as BATCH_ACK, one request for all consumer
        # groups in each round, while the previous round is on the wire.
        self._acks: list[tuple[PopClient, Any]] = []
        self._acks_ready = trio.Event()
        # Rounds begun / ended, and an event set at the end of each (acks_settled).
        self._ack_rounds = [0, 0]
        self._ack_round_ended = trio.Event()
        self._ext_base = {"a": self.config.producer_group, "b": self.config.store_topic,
                          "c": _DEFAULT_TOPIC, "d": str(self.config.store_queues), "f": "0",
                          "h": "0", "j": "0", "k": "false", "m": "false"}
        #: The broker's send checks and put when it runs in this process
        #: (core/broker/local_send.py; set by embedded.py): stores without requests.
        self.local_send: Any = None

    def ack_later(self, pop: PopClient, message: Any) -> None:
        """Queue an acknowledgement (Basic.Ack): sent in the next batch, not waited for."""
        self._acks.append((pop, message))
        self._acks_ready.set()

    def apply_acks(self, acks: list[tuple[PopClient, Any]]) -> None:
        """Apply the acknowledgements gathered while one read of a connection was handled,
        in the caller's task: those of pops in this process with one `LocalPop.ack` (one
        journal write for all their groups), at once; the others go to the ack task
        (`ack_later`, a request)."""
        if len(acks) == 1:  # a lone message's ack (pika's)
            pop, m = acks[0]
            if pop.local is not None:
                self._apply_local(((pop, [m]),))
                return
        groups: dict[int, tuple[PopClient, list]] = {}
        for pop, m in acks:
            if pop.local is None:
                self.ack_later(pop, m)
            else:
                groups.setdefault(id(pop), (pop, []))[1].append(m)
        if groups:
            self._apply_local(groups.values())

    def ack_popped(self, pop: PopClient, messages: list) -> None:
        """Acknowledge the deliveries of one pop at once (a no-ack consumer's, once
        written): in process one `LocalPop.ack` in the caller's task, no ack task round;
        otherwise queued for the ack task (`ack_later`, a request)."""
        if pop.local is not None:
            if messages:
                self._apply_local(((pop, messages),))
            return
        for m in messages:
            self.ack_later(pop, m)

    @staticmethod
    def _apply_local(groups: Any) -> None:
        """(PopClient, deliveries) pairs of in-process pops: one `LocalPop.ack` call per
        service (one journal write), whatever the number of groups."""
        by_service: dict[int, tuple[Any, list]] = {}
        try:
            if len(groups) == 1:
                ((pop, messages),) = groups
                pop.local.ack(pop.local_ack_entries(messages))
                return
            for pop, messages in groups:
                by_service.setdefault(id(pop.local), (pop.local, []))[1].extend(
                    pop.local_ack_entries(messages))
            for local, entries in by_service.values():
                local.ack(entries)
        except Exception:  # unacknowledged: redelivered after the deadline (at least once)
            log.exception("AMQP in-process ack failed")

    async def acks_settled(self) -> None:
        """Return once every ack queued before the call was applied (in process) or its
        request answered: Tx.Commit waits for this, so a commit-ok means the acks hold."""
        target = self._ack_rounds[0] + (1 if self._acks else 0)
        while self._ack_rounds[1] < target:
            await self._ack_round_ended.wait()

    async def _ack_loop(self) -> None:
        while True:
            try:
                await self._ack_round()
            except Exception:
                log.exception("AMQP ack round failed")  # those acks: redelivered later

    async def _ack_round(self) -> None:
        await self._acks_ready.wait()
        self._acks_ready = trio.Event()
        batch, self._acks = self._acks, []
        self._ack_rounds[0] += 1
        try:
            await self._ack_batch(batch)
        finally:
            self._ack_rounds[1] += 1
            ended, self._ack_round_ended = self._ack_round_ended, trio.Event()
            ended.set()

    async def _ack_batch(self, batch: list[tuple[PopClient, Any]]) -> None:
        groups: dict[int, tuple[PopClient, list]] = {}
        for pop, m in batch:
            groups.setdefault(id(pop), (pop, []))[1].append(m)
        # One request carries the entries of every group (queue) up to ACK_BATCH messages
        # and ACK_REQUEST_ENTRIES entries: a fan-out's consumers cost one, not one each.
        # (All PopClients of this gateway talk to the one broker.)
        sender = None
        acks: list[dict] = []
        count = 0
        local = [g for g in groups.values() if g[0].local is not None]
        if local:  # the broker runs in this process: no request
            self._apply_local(local)
        for pop, messages in groups.values():
            if pop.local is not None:
                continue
            sender = pop
            for start in range(0, len(messages), ACK_BATCH):
                part = messages[start:start + ACK_BATCH]
                entries = pop.ack_entries(part)
                if acks and (count + len(part) > ACK_BATCH
                             or len(acks) + len(entries) > ACK_REQUEST_ENTRIES):
                    await self._send_acks(pop, acks, count)
                    acks, count = [], 0
                acks += entries
                count += len(part)
        if acks:
            await self._send_acks(sender, acks, count)

    @staticmethod
    async def _send_acks(pop: PopClient, acks: list[dict], count: int) -> None:
        try:
            await pop.send_acks(acks)
        except (MQClientError, RemotingError, OSError, trio.TooSlowError) as exc:
            # Unacknowledged: redelivered after the deadline (at least once).
            log.warning("AMQP batch ack of %d failed: %r", count, exc)

    def stored_properties(self, exchange_name: str, routing_key: str, properties: Any,
                          raw_properties: bytes, lmqs: list[str]) -> bytes:
        """The RocketMQ properties (UTF-8) of a stored publish multi-dispatched to `lmqs`.

        A function of its arguments (`properties` is `raw_properties` decoded), except for
        MQTT's expiry on the amq.topic bridge: publishes that repeat exchange, key,
        properties and queues (the common case) reuse the octets built for the first."""
        dispatch = MessageConst.MULTI_DISPATCH_SEPARATOR.join(lmqs)
        bridged = exchange_name == BRIDGE_EXCHANGE and not self._ns
        cache_key = None
        if not bridged and len(raw_properties) <= _PROPS_CACHE_MAX_RAW:
            cache_key = (exchange_name, routing_key, raw_properties, dispatch)
            cached = self._props_cache.get(cache_key)
            if cached is not None:
                return cached
        # Empty values are left out (the readers take a missing pair as empty): the
        # store decodes properties with an empty pair into a dict and encodes them again
        # per message, while a string without one gets its queue offsets appended as is.
        props = {MessageConst.INNER_MULTI_DISPATCH: dispatch}
        if exchange_name:
            props[PROP_EXCHANGE] = quote_text(exchange_name)
        if routing_key:
            props[PROP_ROUTING_KEY] = quote_text(routing_key)
        if raw_properties:
            props[PROP_PROPERTIES] = base64.b64encode(raw_properties).decode()
        if properties.expiration is not None:
            props[PROP_TTL] = str(parse_expiration(properties.expiration))
        for attr, key in _READABLE:
            value = getattr(properties, attr)
            if value:
                props[key] = quote_text(value)
        if bridged:
            add_mqtt_properties(props, routing_key, properties, lmqs)  # MQTT's view too
        out = encode_properties(props).encode()
        if cache_key is not None:
            cache = self._props_cache
            if len(cache) >= _PROPS_CACHE_SIZE:
                cache.clear()
            cache[cache_key] = out
        return out

    async def store_batch(self, qid: int, items: list[tuple]) -> bool | None:
        """Store (properties, body, ...) messages in store queue `qid`, in order, with one
        request: True once the broker stored them all; None when the broker refused the
        request (nothing stored: sending the messages one by one is safe); False when the
        outcome is unknown or a lone message was refused."""
        cfg = self.config
        born = time.time_ns() // 1_000_000
        if len(items) == 1:
            props = items[0][0].decode()
            body = items[0][1]
            batch = False
        else:
            # The MQTT link's batch body (one C call when the extension is built).
            body = batch_body([item[1] for item in items], [item[0] for item in items])
            props = ""
            batch = True
        local = self.local_send
        try:
            if local is not None:  # the broker of this process: no request (store-api.md)
                result = await local.send(SendHeader(
                    cfg.producer_group, cfg.store_topic, _DEFAULT_TOPIC, cfg.store_queues, qid,
                    0, born, 0, props, 0, False, None, batch), body)
            else:
                ext = dict(self._ext_base)
                ext["e"] = str(qid)
                ext["g"] = str(born)
                ext["i"] = props
                if batch:
                    ext["m"] = "true"
                mq = MessageQueue(cfg.store_topic, self.broker_name, qid)
                result = await self.client.api.send_message(
                    self.addr, mq, ext, body, batch=batch, uniq_id="",
                    timeout=cfg.send_timeout_s)
        except MQClientError as exc:
            # The broker answered with an error (or the client refused locally): nothing
            # was stored.
            if len(items) > 1:
                return None
            self.stats["failed"] += 1
            log.warning("AMQP store refused: %r", exc)
            return False
        except (RemotingError, OSError, trio.TooSlowError) as exc:
            self.stats["failed"] += len(items)
            log.warning("AMQP store of %d message(s) failed: %r", len(items), exc)
            return False
        self.stats["stored"] += len(items)
        return result is not None
