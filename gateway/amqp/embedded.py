"""The AMQP gateway inside `lmq serve` (docs/amqp.md "Running").

`AmqpService` plugs into `core.cluster.EmbeddedServer(services=[...])` as `MqttService`
does: its `ClientInstance` reaches the embedded name server and broker through the
in-process transport (no sockets), where the broker trusts it to set
`INNER_MULTI_DISPATCH` (no `allow_inner_properties_without_acl` needed). It then runs the
route log, the broker side and the listener, as `run_standalone` does over TCP.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import tomllib
from typing import Any

import trio

from core.broker.local_send import LocalSend
from core.client import ClientInstance
from gateway.amqp.broker import AmqpBroker, AmqpBrokerConfig
from gateway.amqp.server import AmqpServer, AmqpServerConfig
from gateway.routing.bridge import LOCAL_WRITERS
from gateway.routing.route_log import RouteLog

__all__ = ["AmqpService", "amqp_config_tables"]

log = logging.getLogger(__name__)


def amqp_config_tables(path: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The TOML file `path` (keys at the top level or in an `[amqp]` table) split into
    (AmqpServerConfig kwargs, AmqpBrokerConfig kwargs); ValueError on an unknown key."""
    if not path:
        return {}, {}
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    table = data.get("amqp", data)
    if not isinstance(table, dict):
        raise ValueError("[amqp] must be a table")
    server_names = {f.name for f in dataclasses.fields(AmqpServerConfig)}
    broker_names = {f.name for f in dataclasses.fields(AmqpBrokerConfig)}
    unknown = set(table) - server_names - broker_names
    if unknown:
        raise ValueError(f"unknown AMQP config keys in {path}: {', '.join(sorted(unknown))} "
                         "(keys are AmqpServerConfig / AmqpBrokerConfig fields, docs/amqp.md)")
    return ({k: v for k, v in table.items() if k in server_names},
            {k: v for k, v in table.items() if k in broker_names})


class AmqpService:
    """An `EmbeddedServer` service running the AMQP gateway (see the module doc)."""

    def __init__(self, server_config: AmqpServerConfig,
                 broker_config: AmqpBrokerConfig | None = None) -> None:
        self.config = server_config
        self.broker_config = broker_config or AmqpBrokerConfig()
        self.server: AmqpServer | None = None
        self._scope: trio.CancelScope | None = None
        self._stopped = False

    async def __call__(self, server, task_status=trio.TASK_STATUS_IGNORED) -> None:
        namesrv_addr = server.namesrv_addr or ";".join(server.broker_config.namesrv_addrs)
        core = server.broker
        addr, name = core.broker_addr, server.broker_config.broker_name
        gateway_id = "amqp-" + secrets.token_hex(6)
        # It tells the MQTT gateway of this process itself before writing MQTT LMQs
        # (amq.topic bridge): that gateway need not treat it as a foreign writer.
        LOCAL_WRITERS.add(gateway_id)
        started = False
        with trio.CancelScope() as scope:
            self._scope = scope
            if self._stopped:
                scope.cancel()
            async with ClientInstance(namesrv_addr=namesrv_addr) as client:
                if server.namesrv is not None:
                    client.remoting.register_local(server.namesrv_addr, server.namesrv.table)
                client.remoting.register_local(addr, core.table)
                routes = RouteLog(client, addr, name, gateway_id)
                broker = AmqpBroker(client, addr, name, routes, self.broker_config)
                broker.attach_local(core)  # pops and acks without requests
                broker.local_send = LocalSend.of(core)  # stores without requests
                self.server = AmqpServer(self.config, broker=broker)
                async with trio.open_nursery() as nursery:
                    await nursery.start(routes.run)
                    await nursery.start(broker.run)
                    try:
                        port = await nursery.start(self.server.serve)
                    except OSError as exc:
                        # As MQTT: the brokers keep serving when the AMQP port is taken.
                        log.error("AMQP gateway not started: %s", _bind_problem(self.config,
                                                                                exc))
                        nursery.cancel_scope.cancel()
                    else:
                        log.info("AMQP gateway listening on %s:%d", self.config.host, port)
                        if self.server.tls_port is not None:
                            log.info("AMQP over TLS listening on %s:%d", self.config.host,
                                     self.server.tls_port)
                        started = True
                        task_status.started(port)
        LOCAL_WRITERS.discard(gateway_id)
        if not started:
            task_status.started(None)  # stopped before it listened

    def stop(self) -> None:
        """Close the listener and the connections (call before the broker stops)."""
        self._stopped = True
        if self._scope is not None:
            self._scope.cancel()


def _bind_problem(config: AmqpServerConfig, exc: OSError) -> str:
    import errno

    where = f"port {config.port} (AMQP) on {config.host}"
    if exc.errno == errno.EADDRINUSE:
        return (f"{where} is already in use by another process: stop it, or choose another "
                "port with --amqp-port (or --no-amqp)")
    return f"{where}: {exc.strerror or exc} (choose another with --amqp-port, or --no-amqp)"
