"""AMQP exchanges and queues over the broker (docs/amqp.md, "Exchanges, queues, publish").

An AMQP queue is an LMQ (`%LMQ%a_<escaped name>`, `gateway/routing/lmq_names.py`); a
binding is a route of the shared routing table (`gateway/routing`), appended to the route
log so every gateway of the cluster routes the same way. A publish computes the LMQ set of
the message from the routes and stores ONE message in the AMQP store topic with
INNER_MULTI_DISPATCH naming those LMQs: the broker appends one entry per LMQ that points at
the single stored copy (as the MQTT gateway does).

What this module keeps in memory, per gateway process: the declared exchanges and queues
(name, type, flags, arguments) and the routes each queue's bindings added. The bindings
themselves are cluster-wide (route log); the declarations are not yet (see docs/amqp.md).

`AmqpBroker` methods raise `AmqpError` with RabbitMQ's reply codes and texts; the caller
(the channel layer) sets the channel and closes it or the connection.
"""

from __future__ import annotations

import base64
import logging
import secrets
from collections.abc import Mapping
from typing import Any

import trio

from core.client import ClientInstance
from core.client.errors import MQBrokerError, MQClientError
from core.client.pop_consumer import PopClient
from core.remoting.errors import RemotingError
from gateway.amqp import errors
from gateway.amqp.broker_io import (
    ACK_BATCH,
    ACK_REQUEST_ENTRIES,
    MAX_BATCH_BYTES,
    PROP_EXCHANGE,
    PROP_PROPERTIES,
    PROP_ROUTING_KEY,
    PROP_TTL,
    BrokerTraffic,
)
from gateway.amqp.errors import AmqpError
from gateway.amqp.expiry import SharedExpiry
from gateway.amqp.model import (
    AmqpBrokerConfig,
    Exchange,
    Queue,
    bind_route,
    inequivalent,
    not_found,
    show,
)
from gateway.amqp.mqtt_bridge import mqtt_lmqs_of_key
from gateway.amqp.pop_compat import APACHE_MODE_LOG, drain, unsupported
from gateway.amqp.presence import EXCLUSIVE_QUEUE_OP, Presence
from gateway.amqp.queue_args import parse_queue_args
from gateway.amqp.sac import SingleActive
from gateway.routing import lmq_names
from gateway.routing.route_log import RouteLog
from gateway.routing.route_table import BRIDGE_EXCHANGE, Route

__all__ = ["AmqpBroker", "AmqpBrokerConfig", "Exchange", "Queue", "PROP_EXCHANGE",
           "PROP_ROUTING_KEY", "PROP_PROPERTIES", "PROP_TTL", "EXCHANGE_TYPES",
           "MAX_BATCH_BYTES", "ACK_BATCH", "ACK_REQUEST_ENTRIES"]

log = logging.getLogger(__name__)

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
#: The exchanges every vhost has (RabbitMQ's set); "" is the default exchange.
PREDEFINED = {"": "direct", "amq.direct": "direct", "amq.fanout": "fanout",
              "amq.topic": "topic", "amq.headers": "headers", "amq.match": "headers"}


class AmqpBroker(BrokerTraffic):
    """Exchanges, queues, bindings and publishes of one gateway process."""

    def __init__(self, client: ClientInstance, broker_addr: str, broker_name: str,
                 routes: RouteLog, config: AmqpBrokerConfig | None = None,
                 vhost: str = "/") -> None:
        #: Names of this virtual host's exchanges (in routes) and queues (LMQs) carry the
        #: vhost, except in "/" (so MQTT's amq.topic bridge and older data keep theirs).
        self.vhost = vhost
        self._ns = "" if vhost == "/" else f"\x00{vhost}\x00"
        self._vhosts: dict[str, AmqpBroker] = {}
        #: The declaration log shared with the cluster's other gateways (decl_log.py).
        self.decl: Any = None
        self.client = client
        self.addr = broker_addr
        self.broker_name = broker_name
        self.routes = routes
        self.config = config or AmqpBrokerConfig()
        self.exchanges: dict[str, Exchange] = {
            name: Exchange(name, kind) for name, kind in PREDEFINED.items()}
        self.queues: dict[str, Queue] = {}
        #: Exchange-to-exchange bindings (routes whose destination is an exchange).
        self.exchange_routes: set[Route] = set()
        #: Queues with x-max-length, by LMQ: a publish reaching one counts it first.
        self.limited: dict[str, Queue] = {}
        from gateway.amqp.dead_letter import QueuePolicy  # it imports this module

        self.policy = QueuePolicy(self)
        #: Single active consumer and x-expires across gateways (sac.py, expiry.py).
        self.sac = SingleActive(self)
        self.expiry = SharedExpiry(self, self.sac.locks)
        self.presence = Presence(self)  # consumers across gateways (presence.py)
        self.stats = {"stored": 0, "unroutable": 0, "failed": 0}
        self.holder_id = self.config.holder_id or "amqp-" + secrets.token_hex(8)
        #: Whether the broker serves lmq-gateway's private POP codes (holders, dead-letter,
        #: purge; docs/pop.md). False in front of an Apache RocketMQ 5 broker (or ours in
        #: apache_strict mode): the gateway then uses only Apache's POP codes.
        self.extensions = True
        self._pop_clients: dict[str, PopClient] = {}
        #: The broker's POP service when it runs in this process (`attach_local`): pops
        #: and acks then call it instead of sending requests (docs/amqp.md "In process").
        self.local_pop: Any = None
        #: Consumer loops run here (not in a connection's nursery): a POP in progress is
        #: never cancelled, so no delivery is handed out to a request nobody reads.
        self.nursery: trio.Nursery | None = None
        self._init_traffic()

    async def start(self) -> None:
        """Create the store topic and register this gateway as a POP holder (the route log
        must be running: `routes.run`)."""
        n = self.config.store_queues
        await self.client.api.create_topic(self.addr, self.config.store_topic, n, n)
        # Holder (docs/pop.md): when this gateway's broker connection drops, the broker
        # makes its unacknowledged deliveries visible again at once.
        first = self.pop_client(self.config.group_prefix)
        try:
            await first.register_holder(self.holder_id)
        except MQBrokerError as exc:
            if not unsupported(exc):
                raise
            self.apache_mode(exc)

    def attach_local(self, core_broker: Any) -> None:
        """Pop and acknowledge through `core_broker`'s POP service directly: it runs in
        this process (`lmq serve`). Without it (or in front of a broker in apache_strict
        mode) every pop and ack is a POP request."""
        from core.broker.pop.local import LocalPop

        self.local_pop = LocalPop.of(core_broker)
        for pc in self._pop_clients.values():
            pc.local = self.local_pop

    def apache_mode(self, exc: BaseException) -> None:
        """The broker refused a private POP code: use Apache RocketMQ 5's codes only."""
        if not self.extensions:
            return
        self.extensions = False
        self.local_pop = None
        for pc in self._pop_clients.values():
            pc.holder_id = None
            pc.local = None
        log.warning(APACHE_MODE_LOG, self.addr, getattr(exc, "remark", "") or exc)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        await self.start()
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            nursery.start_soon(self._ack_loop)
            nursery.start_soon(self.policy.expiry_loop)
            nursery.start_soon(self.sac.run)
            nursery.start_soon(self.expiry.run)
            nursery.start_soon(self.presence.run)
            if self.config.share_declarations:
                from gateway.amqp.decl_log import DeclLog  # it imports this module

                self.decl = DeclLog(self, self.holder_id,
                                    snapshot_every=self.config.decl_snapshot_every)
                await nursery.start(self.decl.run)  # replayed before we serve
            task_status.started()
            await trio.sleep_forever()

    def for_vhost(self, vhost: str) -> AmqpBroker:
        """The broker side of another virtual host: its own exchanges and queues, this
        one's broker connection, POP clients, ack task and nursery."""
        if vhost == self.vhost:
            return self
        child = self._vhosts.get(vhost)
        if child is None:
            if self.nursery is None:
                raise AmqpError(errors.INTERNAL_ERROR, "INTERNAL_ERROR - broker side not "
                                "running")
            child = AmqpBroker(self.client, self.addr, self.broker_name, self.routes,
                               self.config, vhost)
            child.holder_id = self.holder_id
            child.extensions = self.extensions
            child._pop_clients = self._pop_clients
            child.local_pop = self.local_pop
            child.ack_later = self.ack_later  # type: ignore[method-assign]
            child.acks_settled = self.acks_settled  # type: ignore[method-assign]
            child.local_send = self.local_send
            child.nursery = self.nursery
            child.decl = self.decl
            child.sac, child.expiry, child.presence = self.sac, self.expiry, self.presence
            self.nursery.start_soon(child.policy.expiry_loop)
            self._vhosts[vhost] = child
        return child

    def qualified(self, name: str) -> str:
        """An exchange's or queue's name in the routing table / LMQ name space."""
        return self._ns + name

    def plain(self, qualified: str) -> str:
        ns = self._ns
        return qualified[len(ns):] if ns and qualified.startswith(ns) else qualified

    def pop_client(self, group: str) -> PopClient:
        pc = self._pop_clients.get(group)
        if pc is None:
            pc = self._pop_clients[group] = PopClient(
                self.client.api.remoting, self.addr, self.broker_name, group,
                holder_id=self.holder_id if self.extensions else None)
            pc.local = self.local_pop
        return pc

    async def register_holder(self) -> None:
        """Bind the holder id to the (possibly new) broker connection again: called after
        a broker error, since a reconnected connection is not registered."""
        if not self.extensions:
            return
        try:
            await self.pop_client(self.config.group_prefix).register_holder(self.holder_id)
        except (MQClientError, RemotingError, OSError) as exc:
            log.warning("AMQP POP holder registration failed: %r", exc)

    def queue_pop(self, queue: Queue) -> PopClient:
        """The POP client of a queue's consumer group (one group per queue)."""
        return self.pop_client(self.config.group_prefix + queue.lmq)

    # ------------------------------------------------------------------ exchanges
    def exchange_declare(self, name: str, kind: str, *, passive: bool, durable: bool,
                         auto_delete: bool, internal: bool, arguments: Mapping[str, Any]) -> None:
        if passive:
            if name not in self.exchanges:
                raise not_found("exchange", name)
            return
        if name == "" or name.startswith("amq."):
            # RabbitMQ refuses every active declare of a reserved name, existing or not.
            raise AmqpError(errors.ACCESS_REFUSED, f"ACCESS_REFUSED - exchange name '{name}' "
                            "contains reserved prefix 'amq.*'" if name else
                            "ACCESS_REFUSED - operation not permitted on the default exchange")
        if kind not in EXCHANGE_TYPES:
            # A connection error in RabbitMQ (503 COMMAND_INVALID).
            raise AmqpError(errors.COMMAND_INVALID, f"COMMAND_INVALID - unknown exchange "
                            f"type '{kind}'")
        old = self.exchanges.get(name)
        if old is not None:
            for arg, received, current in (("type", kind, old.type),
                                           ("durable", durable, old.durable),
                                           ("auto_delete", auto_delete, old.auto_delete),
                                           ("internal", internal, old.internal)):
                if received != current:
                    raise inequivalent("exchange", name, arg, show(received), show(current))
            return
        if len(self.exchanges) >= self.config.max_exchanges + len(PREDEFINED):
            raise AmqpError(errors.PRECONDITION_FAILED, f"PRECONDITION_FAILED - cannot "
                            f"declare exchange '{name}': exchange limit "
                            f"({self.config.max_exchanges}) is reached")
        self.exchanges[name] = Exchange(name, kind, durable, auto_delete, internal,
                                        dict(arguments))
        if self.decl is not None:
            self.decl.append("x+", self.vhost, name, t=kind, d=durable, ad=auto_delete,
                             i=internal, a=dict(arguments))

    async def exchange_delete(self, name: str, if_unused: bool) -> None:
        if name == "" or name.startswith("amq."):
            raise AmqpError(errors.ACCESS_REFUSED, f"ACCESS_REFUSED - operation not "
                            f"permitted on exchange '{name}'")
        if name not in self.exchanges:
            return  # RabbitMQ answers delete-ok for a missing exchange
        qname = self.qualified(name)
        bound = [(q, r) for q in self.queues.values() for r in q.routes if r.exchange == qname]
        e2e = [r for r in self.exchange_routes if r.exchange == qname]
        if if_unused and (bound or e2e):
            # RabbitMQ: in use = it is the source of a binding.
            raise AmqpError(errors.PRECONDITION_FAILED, f"PRECONDITION_FAILED - exchange "
                            f"'{name}' in vhost '/' in use")
        if self.decl is not None:
            self.decl.append("x-", self.vhost, name)
        await self.forget_exchange(name)

    async def forget_exchange(self, name: str) -> None:
        """Drop the exchange and the bindings this gateway made from or to it."""
        if self.exchanges.pop(name, None) is None or name == "" or name.startswith("amq."):
            return
        qname = self.qualified(name)
        for queue in self.queues.values():
            for route in [r for r in queue.routes if r.exchange == qname]:
                queue.routes.discard(route)
                await self.routes.remove_route(route)
        for route in [r for r in self.exchange_routes if qname in (r.exchange, r.dest)]:
            self.exchange_routes.discard(route)
            await self.routes.remove_route(route)

    def adopt_exchange(self, name: str, kind: str, durable: bool, auto_delete: bool,
                       internal: bool, arguments: Mapping[str, Any]) -> None:
        """Another gateway declared it (decl_log.py)."""
        if name not in self.exchanges and kind in EXCHANGE_TYPES:
            self.exchanges[name] = Exchange(name, kind, durable, auto_delete, internal,
                                            dict(arguments))

    def adopt_queue(self, name: str, durable: bool, auto_delete: bool,
                    arguments: Mapping[str, Any], exclusive: bool = False) -> None:
        """Another gateway declared it (decl_log.py); an exclusive one is another's."""
        if name in self.queues:
            return
        try:
            args = parse_queue_args(name, arguments, durable, exclusive)
            lmq = lmq_names.encode(lmq_names.AMQP, self.qualified(name)).topic
        except (AmqpError, ValueError) as exc:
            log.warning("AMQP shared declaration of queue %r skipped: %s", name, exc)
            return
        queue = Queue(name, lmq, durable, exclusive, auto_delete, dict(arguments), None,
                      args=args, adopted=True)
        self.queues[name] = queue
        if args.max_length is not None:
            self.limited[lmq] = queue
        if args.expires is not None:  # a timer here too; adopting is no use (expiry.py)
            queue.touch()
            self.policy.schedule_expiry(queue)

    async def forget_queue(self, name: str) -> None:
        """Another gateway deleted it: cancel its consumers here, drop the bindings made
        here (its messages are already gone)."""
        queue = self.queues.get(name)
        if queue is not None and (not queue.exclusive or queue.owner is None):
            await self._drop_queue(queue, share=False)

    async def exchange_bind(self, destination: str, source: str, routing_key: str,
                            arguments: Mapping[str, Any], bind: bool = True) -> None:
        """Exchange.Bind / Unbind: messages reaching `source` also go through
        `destination` (a route of the shared table whose destination is an exchange)."""
        dest = self._exchange_for_bind(destination)
        route = bind_route(self._exchange_for_bind(source), self.qualified(source),
                            routing_key, arguments, self.qualified(dest.name),
                            dest_exchange=True)
        if not bind:
            self.exchange_routes.discard(route)
            await self.routes.remove_route(route)
            return
        if route in self.exchange_routes:
            return
        if len(self.exchange_routes) >= self.config.max_exchange_bindings:
            raise AmqpError(errors.PRECONDITION_FAILED, f"PRECONDITION_FAILED - "
                            f"{len(self.exchange_routes)} exchange-to-exchange bindings "
                            "(the limit)")
        self.exchange_routes.add(route)
        await self.routes.add_route(route)

    # ------------------------------------------------------------------ queues
    def queue_declare(self, name: str, *, passive: bool, durable: bool, exclusive: bool,
                      auto_delete: bool, arguments: Mapping[str, Any], owner: int) -> Queue:
        queue = self.queues.get(name) if name else None
        if queue is not None and queue.exclusive and queue.owner != owner:
            raise AmqpError(errors.RESOURCE_LOCKED, f"RESOURCE_LOCKED - cannot obtain "
                            f"exclusive access to locked queue '{name}' in vhost '/'")
        if passive:
            if queue is None:
                raise not_found("queue", name)
            self._touch(queue)
            return queue
        if name.startswith("amq."):
            raise AmqpError(errors.ACCESS_REFUSED, f"ACCESS_REFUSED - queue name '{name}' "
                            "contains reserved prefix 'amq.*'")
        if queue is not None:
            for arg, received, current in (("durable", durable, queue.durable),
                                           ("exclusive", exclusive, queue.exclusive),
                                           ("auto_delete", auto_delete, queue.auto_delete)):
                if received != current:
                    raise inequivalent("queue", name, arg, show(received), show(current))
            for key in set(arguments) | set(queue.arguments):
                if arguments.get(key) != queue.arguments.get(key):
                    raise inequivalent("queue", name, key, show(arguments.get(key)),
                                        show(queue.arguments.get(key)))
            self._touch(queue)
            return queue
        args = parse_queue_args(name, arguments, durable, exclusive)
        if len(self.queues) >= self.config.max_queues:
            raise AmqpError(errors.PRECONDITION_FAILED, f"PRECONDITION_FAILED - cannot "
                            f"declare queue '{name}': queue limit in vhost '/' "
                            f"({self.config.max_queues}) is reached")
        if not name:
            name = "amq.gen-" + base64.urlsafe_b64encode(secrets.token_bytes(16)).decode()[:22]
        try:
            lmq = lmq_names.encode(lmq_names.AMQP, self.qualified(name)).topic
        except ValueError:  # not UTF-8 (the codec keeps raw octets as lone surrogates)
            raise AmqpError(errors.PRECONDITION_FAILED, "PRECONDITION_FAILED - queue name "
                            "is not valid UTF-8") from None
        queue = Queue(name, lmq, durable, exclusive, auto_delete, dict(arguments),
                      owner if exclusive else None, args=args)
        self.queues[name] = queue
        if args.max_length is not None:
            self.limited[lmq] = queue
        self._touch(queue)
        if self.decl is not None:  # exclusive ones too: 405 on the others (presence.py)
            extra = {"m": self.routes.gateway_id} if exclusive else {}
            self.decl.append(EXCLUSIVE_QUEUE_OP if exclusive else "q+", self.vhost, name,
                             d=durable, ad=auto_delete, a=dict(arguments), **extra)
        return queue

    def _touch(self, queue: Queue) -> None:
        if queue.args.expires is not None:
            queue.touch()
            self.policy.schedule_expiry(queue)
            self.expiry.used(queue)  # shared with the other gateways (expiry.py)

    async def delete_expired(self, queue: Queue) -> None:
        """x-expires passed with the queue unused here: it goes if it was unused on every
        gateway, deleted by one of them (expiry.py)."""
        if await self.expiry.may_delete(self, queue):
            await self._drop_queue(queue)
            await self.expiry.deleted_by_us(queue)

    async def queue_delete(self, name: str, owner: int, if_unused: bool = False,
                           if_empty: bool = False) -> int:
        """Queue.Delete: the number of messages deleted with it."""
        queue = self.queues.get(name)
        if queue is None:
            return 0  # RabbitMQ answers delete-ok for a missing queue
        if queue.exclusive and queue.owner != owner:
            raise AmqpError(errors.RESOURCE_LOCKED, f"RESOURCE_LOCKED - cannot obtain "
                            f"exclusive access to locked queue '{name}' in vhost '/'")
        if if_unused and self.presence.count(self, queue) > 0:
            raise AmqpError(errors.PRECONDITION_FAILED, f"PRECONDITION_FAILED - queue "
                            f"'{name}' in vhost '/' in use")
        if if_empty and await self.message_count(queue) > 0:
            raise AmqpError(errors.PRECONDITION_FAILED, f"PRECONDITION_FAILED - queue "
                            f"'{name}' in vhost '/' is not empty")
        return await self._drop_queue(queue)

    async def queue_purge(self, name: str, owner: int) -> int:
        """Queue.Purge: drop the messages waiting for delivery (not the unacknowledged
        ones, as RabbitMQ); how many."""
        queue = self._queue_for(name, owner)
        try:
            return await self._purge(queue, everything=False)
        except (MQClientError, RemotingError, OSError, trio.TooSlowError) as exc:
            raise AmqpError(errors.INTERNAL_ERROR, f"INTERNAL_ERROR - purge failed: "
                            f"{exc}") from None

    async def _purge(self, queue: Queue, everything: bool) -> int:
        """POP_PURGE when the broker has it; else pop and acknowledge what is ready."""
        pop = self.queue_pop(queue)
        if self.extensions:
            try:
                return await pop.purge(queue.lmq, everything=everything,
                                       volatile=not queue.durable)
            except MQBrokerError as exc:
                if not unsupported(exc):
                    raise
                self.apache_mode(exc)
        return await drain(pop, queue.lmq, self.config.pop_batch, queue.name)

    async def _drop_queue(self, queue: Queue, share: bool = True) -> int:
        """Forget the queue, remove its routes, cancel its consumers (Basic.Cancel) and
        drop its messages in the broker (unless `share` is False: another gateway did);
        how many messages went."""
        self.queues.pop(queue.name, None)
        self.limited.pop(queue.lmq, None)
        self.sac.idle(queue)
        self.presence.forget(self, queue)
        for consumer in list(queue.subscribers):
            await consumer.deliveries.cancel_by_server(consumer.tag)
        queue.expires_at = None
        routes, queue.routes = queue.routes, set()
        for route in routes:
            await self.routes.remove_route(route)
        if not share:
            return 0
        if self.decl is not None:
            self.decl.append("q-", self.vhost, queue.name)
        try:
            return await self._purge(queue, everything=True)
        except (MQClientError, RemotingError, OSError, trio.TooSlowError) as exc:
            # Its messages stay in the LMQ; a queue declared again by that name sees them.
            log.warning("AMQP purge of deleted queue %r failed: %r", queue.name, exc)
            return 0

    async def message_count(self, queue: Queue) -> int:
        """Messages of the queue not yet acknowledged (Declare-Ok's message_count; unlike
        RabbitMQ this counts deliveries in flight too): the LMQ's end minus its consumer
        group's consumed offset (docs/pop.md). 0 when the broker cannot say."""
        api, lmq = self.client.api, queue.lmq
        try:
            end = await api.get_max_offset(self.addr, lmq, 0)
            done = await api.query_consumer_offset(
                self.addr, self.config.group_prefix + lmq, lmq, 0)
            if done < 0:  # the group never popped: it will start at the first message
                done = await api.get_min_offset(self.addr, lmq, 0)
        except (MQClientError, RemotingError, OSError, trio.TooSlowError) as exc:
            log.warning("AMQP message count of %r failed: %r", queue.name, exc)
            return 0
        return max(0, end - done)

    async def consumer_gone(self, queue: Queue) -> None:
        """An auto-delete queue goes with its last consumer on every gateway."""
        if self.queues.get(queue.name) is not queue:
            return
        self.presence.changed(self, queue)  # the other gateways count ours (presence.py)
        if queue.consumers > 0:
            return
        self.sac.idle(queue)  # another gateway's consumer may take over
        if queue.auto_delete:
            await self.presence.auto_delete(self, queue)
        else:
            self._touch(queue)  # x-expires counts from the last consumer's going

    async def connection_ended(self, owner: int) -> None:
        """Exclusive queues die with their connection."""
        for queue in [q for q in self.queues.values() if q.owner == owner]:
            await self._drop_queue(queue)

    def consumable(self, name: str, owner: int) -> Queue:
        """The queue for consume/get: 404 if unknown, 405 if another's exclusive queue."""
        queue = self._queue_for(name, owner)
        self._touch(queue)  # x-expires: in use
        return queue

    def _queue_for(self, name: str, owner: int) -> Queue:
        queue = self.queues.get(name)
        if queue is None:
            raise not_found("queue", name)
        if queue.exclusive and queue.owner != owner:
            raise AmqpError(errors.RESOURCE_LOCKED, f"RESOURCE_LOCKED - cannot obtain "
                            f"exclusive access to locked queue '{name}' in vhost '/'")
        return queue

    def _exchange_for_bind(self, name: str) -> Exchange:
        if name == "":
            raise AmqpError(errors.ACCESS_REFUSED, "ACCESS_REFUSED - operation not "
                            "permitted on the default exchange")
        exchange = self.exchanges.get(name)
        if exchange is None:
            raise not_found("exchange", name)
        return exchange

    async def queue_bind(self, queue_name: str, exchange_name: str, routing_key: str,
                         arguments: Mapping[str, Any], owner: int) -> None:
        queue = self._queue_for(queue_name, owner)
        route = bind_route(self._exchange_for_bind(exchange_name),
                            self.qualified(exchange_name), routing_key, arguments, queue.lmq)
        if route in queue.routes:
            return
        if len(queue.routes) >= self.config.max_bindings_per_queue:
            raise AmqpError(errors.PRECONDITION_FAILED, f"PRECONDITION_FAILED - queue "
                            f"'{queue_name}' has {len(queue.routes)} bindings (the limit)")
        queue.routes.add(route)
        await self.routes.add_route(route)

    async def queue_unbind(self, queue_name: str, exchange_name: str, routing_key: str,
                           arguments: Mapping[str, Any], owner: int) -> None:
        queue = self._queue_for(queue_name, owner)
        route = bind_route(self._exchange_for_bind(exchange_name),
                            self.qualified(exchange_name), routing_key, arguments, queue.lmq)
        queue.routes.discard(route)
        await self.routes.remove_route(route)

    # ------------------------------------------------------------------ publish
    def route(self, exchange_name: str, routing_key: str,
              headers: Mapping[str, Any] | None) -> list[str]:
        """The LMQs a publish reaches (sorted); 404 for an unknown exchange."""
        if exchange_name == "":
            queue = self.queues.get(routing_key)
            return [queue.lmq] if queue is not None else []
        exchange = self.exchanges.get(exchange_name)
        if exchange is None:
            raise not_found("exchange", exchange_name)
        if exchange.internal:
            raise AmqpError(errors.ACCESS_REFUSED, f"ACCESS_REFUSED - cannot publish to "
                            f"internal exchange '{exchange_name}' in vhost '/'")
        table = self.routes.table
        lmqs = table.amqp_lmqs(self.qualified(exchange_name), routing_key, headers)
        if exchange_name == BRIDGE_EXCHANGE and not self._ns:
            lmqs.update(mqtt_lmqs_of_key(table, routing_key))  # and MQTT subscribers
        return sorted(lmqs)
