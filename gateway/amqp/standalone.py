"""A stand-alone AMQP gateway (`lmq amqp`): a broker client, the route log, the broker side
and the listener, against the cluster named by a name server (docs/amqp.md "Running").

This slice serves one broker: the first master (by name) the name servers list.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

import trio

from core.client import ClientInstance
from core.client.errors import MQClientError
from core.remoting.errors import RemotingError
from gateway.amqp.broker import AmqpBroker, AmqpBrokerConfig
from gateway.amqp.server import AmqpServer, AmqpServerConfig
from gateway.routing.route_log import RouteLog, RouteLogConfig

__all__ = ["CLUSTER_WAIT_S", "run_standalone"]

log = logging.getLogger(__name__)

#: How long start-up waits for a master broker to be registered with the name servers.
CLUSTER_WAIT_S = 30.0


async def _first_master(client: ClientInstance, wait_s: float) -> tuple[str, str]:
    with trio.fail_after(wait_s):
        while True:
            try:
                masters = (await client.api.get_cluster_info()).master_addrs(None)
                if masters:
                    return sorted(masters.items())[0]
            except (MQClientError, RemotingError, OSError) as exc:
                log.debug("cluster not ready: %r", exc)
            await trio.sleep(0.2)


async def run_standalone(namesrv_addr: str, server_config: AmqpServerConfig | None = None,
                         broker_config: AmqpBrokerConfig | None = None,
                         route_config: RouteLogConfig | None = None, *,
                         gateway_id: str | None = None, on_server: Any = None,
                         cluster_wait_s: float = CLUSTER_WAIT_S, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Run until cancelled; `task_status.started(port)` once the listener is bound.
    `on_server(AmqpServer)` is called once it exists (the metrics endpoint reads it).
    Start-up waits at most `cluster_wait_s` for a master broker (trio.TooSlowError)."""
    gateway_id = gateway_id or "amqp-" + secrets.token_hex(6)
    async with ClientInstance(namesrv_addr=namesrv_addr) as client:
        name, addr = await _first_master(client, cluster_wait_s)
        routes = RouteLog(client, addr, name, gateway_id, route_config)
        broker = AmqpBroker(client, addr, name, routes, broker_config)
        async with trio.open_nursery() as nursery:
            await nursery.start(routes.run)
            await nursery.start(broker.run)
            server = AmqpServer(server_config, broker=broker)
            if on_server is not None:
                on_server(server)
            port = await nursery.start(server.serve)
            cfg = server.config
            log.info("AMQP gateway %s listening on %s:%d (broker %s at %s)", gateway_id,
                     cfg.host, port, name, addr)
            if server.tls_port is not None:
                log.info("AMQP over TLS listening on %s:%d", cfg.host, server.tls_port)
            task_status.started(port)
