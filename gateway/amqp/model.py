"""What the AMQP broker side keeps per exchange and queue, its settings, and the
helpers that build its bindings and RabbitMQ's error texts (used by `gateway/amqp/broker.py`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import trio

from gateway.amqp import errors
from gateway.amqp.errors import AmqpError
from gateway.amqp.queue_args import NO_ARGS, QueueArgs
from gateway.routing.route_table import Route, RouteError

__all__ = ["AmqpBrokerConfig", "Exchange", "Queue", "bind_route", "inequivalent", "not_found",
           "quote_text", "show"]

_SAFE = " !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~"  # printable ASCII except % (quote keeps these)


@dataclass
class AmqpBrokerConfig:
    """Settings of the AMQP broker side (defaults documented in docs/amqp.md)."""

    store_topic: str = "LMQ_AMQP_STORE"
    store_queues: int = 4
    producer_group: str = "AMQP_GATEWAY"
    send_timeout_s: float = 5.0
    #: Octets of publishes of one connection received but not yet stored; past it the
    #: connection's socket is not read until stores complete (back-pressure).
    max_publish_backlog_bytes: int = 4 * 1024 * 1024
    #: Queues and exchanges one gateway process keeps (a declare past it: 406 on the channel).
    max_queues: int = 100_000
    max_exchanges: int = 10_000
    #: Bindings of one queue.
    max_bindings_per_queue: int = 1_000
    #: Exchange-to-exchange bindings one gateway process keeps.
    max_exchange_bindings: int = 10_000
    #: POP invisibility of a delivery not yet acknowledged (RabbitMQ's consumer_timeout
    #: is 30 min); a gateway crash returns its deliveries at once (holder), not after this.
    invisible_ms: int = 30 * 60 * 1000
    #: How long one POP request waits for a message (a consumer's cancel waits for it).
    poll_ms: int = 1000
    #: Messages per POP request (the broker's POP_MAX_NUMS is 32).
    pop_batch: int = 32
    #: Prefix of the POP consumer group of a queue (group = prefix + the queue's LMQ).
    group_prefix: str = "GID_AMQP"
    #: POP holder id of this gateway process (default: random per process).
    holder_id: str = ""
    #: Share exchange and queue declarations with the cluster's other gateways
    #: (the LMQ_AMQP_DECL log, gateway/amqp/decl_log.py).
    share_declarations: bool = True
    #: Declaration-log records after which a gateway writes a snapshot (compaction).
    decl_snapshot_every: int = 10_000
    #: x-single-active-consumer across gateways (gateway/amqp/sac.py): a gateway counts a
    #: queue's broker lock as its own for `sac_lease_s` after asking (below the broker's
    #: lock_max_live_s, 60 s), renews it every `sac_renew_s`, and a gateway waiting for
    #: it asks every `sac_retry_s` (the take-over bound after a cancel or a close).
    sac_lease_s: float = 30.0
    sac_renew_s: float = 10.0
    sac_retry_s: float = 1.0
    #: Consumers and exclusive queues across gateways (gateway/amqp/presence.py): while
    #: a gateway knows another's consumers or exclusive queues it reads the gateways'
    #: group every `presence_check_s`; one out of it for `presence_gone_s` (longer than
    #: the route log's 20 s heartbeat) is gone: its consumers stop counting, its
    #: exclusive queues and the auto-delete queues it was the last to consume are deleted.
    presence_check_s: float = 5.0
    presence_gone_s: float = 30.0


@dataclass
class Exchange:
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass
class Queue:
    name: str
    lmq: str
    durable: bool = False
    exclusive: bool = False
    auto_delete: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    owner: int | None = None  # connection id of an exclusive queue
    routes: set[Route] = field(default_factory=set)
    consumers: int = 0  # consumers on this gateway
    exclusive_consumer: bool = False  # an exclusive consume holds it (on this gateway)
    args: QueueArgs = NO_ARGS  # the parsed arguments (gateway/amqp/queue_args.py)
    #: x-expires: trio time after which the unused queue is deleted (None: never).
    expires_at: float | None = None
    #: x-single-active-consumer: consumers in the order they came; the first is active.
    waiting: list = field(default_factory=list)
    #: Consumers of this queue on this gateway (told with Basic.Cancel when it is deleted).
    subscribers: set = field(default_factory=set)
    active_changed: trio.Event = field(default_factory=trio.Event)
    #: Declared by another gateway (decl_log.py); every gateway runs the x-expires timer
    #: of the queues it knows, the uses are shared (gateway/amqp/expiry.py).
    adopted: bool = False

    def touch(self) -> None:
        """Used (declared, consumed, got): x-expires counts from now."""
        if self.args.expires is not None:
            self.expires_at = trio.current_time() + self.args.expires / 1000


def _flag(value: bool) -> str:
    return "true" if value else "false"


def inequivalent(what: str, name: str, arg: str, received: Any, current: Any) -> AmqpError:
    return AmqpError(errors.PRECONDITION_FAILED, f"PRECONDITION_FAILED - inequivalent arg "
                     f"'{arg}' for {what} '{name}' in vhost '/': received {received} but "
                     f"current is {current}")


def not_found(what: str, name: str) -> AmqpError:
    return AmqpError(errors.NOT_FOUND, f"NOT_FOUND - no {what} '{name}' in vhost '/'")


def bind_route(exchange: Exchange, source: str, routing_key: str,
                arguments: Mapping[str, Any], dest: str, dest_exchange: bool = False) -> Route:
    """The route of a binding; `source` is the exchange's name in the routing table."""
    kind = exchange.type
    try:
        if kind == "headers":
            x_match = arguments.get("x-match", "all")
            if isinstance(x_match, bytes):
                x_match = x_match.decode("utf-8", "replace")
            return Route.headers_route(source, arguments, dest, x_match=str(x_match),
                                       dest_exchange=dest_exchange)
        return Route(kind, "" if kind == "fanout" else routing_key, dest, source,
                     dest_exchange)
    except RouteError as exc:
        raise AmqpError(errors.PRECONDITION_FAILED, f"PRECONDITION_FAILED - invalid "
                        f"binding: {exc}") from None


def quote_text(text: str) -> str:
    # Octets that are not UTF-8 arrive as lone surrogates (surrogateescape): keep them.
    return quote(text, safe=_SAFE, errors="surrogateescape")


def show(value: Any) -> str:
    if isinstance(value, bool):
        return f"'{_flag(value)}'"
    if value is None:
        return "none"
    return f"'{value}'"
