"""A real broker + route log + AMQP server on free ports, and pika clients in a thread."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pika
import trio

from core.client import ClientInstance, PullStatus
from core.common.sysflag import PullSysFlag
from gateway.amqp.broker import AmqpBroker, AmqpBrokerConfig
from gateway.amqp.server import AmqpServer, AmqpServerConfig
from gateway.routing.route_log import RouteLog, RouteLogConfig
from tests.core.broker.harness import run_embedded


def params(port: int) -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials(
        "guest", "guest"), connection_attempts=1, socket_timeout=10,
        blocked_connection_timeout=10)


def declare_fanout(ch, exchange: str, queues: list[str]) -> None:
    """On a pika channel: a fanout exchange and `queues` bound to it."""
    ch.exchange_declare(exchange, exchange_type="fanout")
    for q in queues:
        ch.queue_declare(q)
        ch.queue_bind(q, exchange)


def confirm_client(port: int, queue: str):
    """A raw client (lmq.bench's RawClient) with a channel in confirm mode and `queue`
    declared: (client, channel)."""
    from gateway.amqp.methods import ConfirmSelect, QueueDeclare
    from lmq.bench._amqp_load import RawClient

    c = RawClient("127.0.0.1", port)
    ch = c.channel()
    c.call(ch, QueueDeclare(queue=queue))
    c.call(ch, ConfirmSelect())
    return c, ch


@dataclass
class Gateway:
    port: int
    broker: AmqpBroker
    client: ClientInstance
    addr: str
    server: AmqpServer

    def wait_idle(self) -> None:
        """Until every connection's task ended (publishes received are stored by then)."""
        self.wait_for(lambda: self.server.connections == 0)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run an async function on the trio loop (from the pika thread)."""
        return trio.from_thread.run(fn, *args)

    def wait_for(self, condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
        """Poll `condition` on the trio loop until it holds (AssertionError after timeout_s)."""
        async def poll() -> None:
            with trio.fail_after(timeout_s):
                while not condition():
                    await trio.sleep(0.01)

        try:
            self.call(poll)
        except trio.TooSlowError:
            raise AssertionError("condition not reached") from None

    async def drop_broker_connections(self) -> None:
        """Close this gateway's TCP connections to the broker, as a crash would."""
        remoting = self.client.api.remoting
        for conn in list(remoting._connections.values()):
            conn.close()
        remoting._connections.clear()
        await trio.sleep(0)

    def lmq_messages(self, lmq: str) -> list:
        return self.call(pull_all, self.client, self.addr, lmq)

    def stored_count(self) -> int:
        """Messages in the AMQP store topic (all its queues)."""
        cfg = self.broker.config

        async def count() -> int:
            total = 0
            for qid in range(cfg.store_queues):
                total += await self.client.api.get_max_offset(self.addr, cfg.store_topic, qid)
            return total

        return self.call(count)


async def pull_all(client: ClientInstance, addr: str, topic: str) -> list:
    out: list = []
    offset = 0
    while True:
        ext = {"consumerGroup": "AMQP_TEST_READER", "topic": topic, "queueId": "0",
               "queueOffset": str(offset), "maxMsgNums": "32",
               "sysFlag": str(int(PullSysFlag.SUBSCRIPTION)), "commitOffset": "0",
               "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0",
               "expressionType": "TAG"}
        got = await client.api.pull_message(addr, ext, 10.0)
        if got.status is not PullStatus.FOUND or not got.messages:
            return out
        out.extend(got.messages)
        offset = got.next_begin_offset


def run_gateway(tmp_path, client_fn: Callable[[Gateway], Any],
                broker_config: AmqpBrokerConfig | None = None, *,
                broker_kw: dict | None = None, in_process: bool = False, **server_kw) -> Any:
    """Start broker, route log and AMQP server; run `client_fn(gateway)` in a thread."""
    return run_gateways(tmp_path, lambda gws: client_fn(gws[0]), 1, broker_config,
                        broker_kw=broker_kw, in_process=in_process, **server_kw)


def run_gateways(tmp_path, client_fn: Callable[[list[Gateway]], Any], count: int,
                 broker_config: AmqpBrokerConfig | None = None, *,
                 broker_kw: dict | None = None, in_process: bool = False,
                 **server_kw) -> Any:
    """`count` gateways (each its own broker client, route log and AMQP server) over one
    broker; `client_fn(gateways)` runs in a thread. `in_process`: the gateways pop and
    acknowledge through the broker's POP service directly, as in `lmq serve`."""
    result: list[Any] = []

    async def gateway(nursery, server, i: int, client) -> tuple[Gateway, AmqpServer]:
        b = server.broker
        if in_process:  # requests (stores, routes) in-process too, as in `lmq serve`
            client.remoting.register_local(b.broker_addr, b.table)
        routes = RouteLog(client, b.broker_addr, b.config.broker_name, f"amqp-gw-{i}",
                          RouteLogConfig(pull_suspend_ms=500, heartbeat_interval_s=0.2,
                                         gateway_timeout_s=2.0, ack_timeout_s=10.0))
        broker = AmqpBroker(client, b.broker_addr, b.config.broker_name, routes,
                            broker_config or AmqpBrokerConfig())
        if in_process:
            broker.attach_local(b)
        await nursery.start(routes.run)
        await nursery.start(broker.run)
        amqp = AmqpServer(AmqpServerConfig(port=0, **server_kw), broker=broker)
        port = await nursery.start(amqp.serve)
        return Gateway(port, broker, client, b.broker_addr, amqp), amqp

    async def body(server, _remoting):
        async with contextlib.AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(
                ClientInstance(namesrv_addr=server.namesrv_addr)) for _ in range(count)]
            async with trio.open_nursery() as nursery:
                made = [await gateway(nursery, server, i, clients[i]) for i in range(count)]
                result.append(await trio.to_thread.run_sync(client_fn, [g for g, _ in made]))
                with trio.fail_after(20):  # connection clean-ups before the route log stops
                    while any(amqp.connections for _, amqp in made):
                        await trio.sleep(0.01)
                nursery.cancel_scope.cancel()

    # A gateway over TCP may set INNER_MULTI_DISPATCH only when the broker allows it.
    run_embedded(body, tmp_path, timeout=90.0, allow_inner_properties_without_acl=True,
                 **(broker_kw or {}))
    return result[0]
