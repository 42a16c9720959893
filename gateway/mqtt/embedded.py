"""Running the gateway next to its brokers: inside `lmq serve` or stand-alone.

`MqttService` plugs into `core.cluster.EmbeddedServer(services=[...])`: it opens a
`ClientInstance` whose requests to the embedded name server and broker go through the
in-process transport (no sockets, no serialization; the same code path as over TCP), then
runs the `MqttGateway`. `run_standalone` is `lmq mqtt --namesrv-addr ...`: the gateway as a
separate process reaching the brokers over TCP.
"""

from __future__ import annotations

import logging
import os

import trio

from core.client import ClientInstance
from gateway.mqtt.config import MqttConfig
from gateway.mqtt.server import MqttGateway

__all__ = ["MqttService", "run_standalone"]

log = logging.getLogger(__name__)


class MqttService:
    """An `EmbeddedServer` service running the MQTT gateway (see the module doc).

    `config.data_dir` defaults to `<broker data dir>/mqtt` when left at its default.
    """

    def __init__(self, config: MqttConfig) -> None:
        self.config = config
        self.gateway: MqttGateway | None = None
        self._stopped = False

    async def __call__(self, server, task_status=trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.config
        if cfg.data_dir == MqttConfig.data_dir:
            cfg.data_dir = os.path.join(server.broker_config.data_dir, "mqtt")
        namesrv_addr = server.namesrv_addr or ";".join(server.broker_config.namesrv_addrs)
        async with ClientInstance(namesrv_addr=namesrv_addr, **_credentials(cfg)) as client:
            if server.namesrv is not None:
                client.remoting.register_local(server.namesrv_addr, server.namesrv.table)
            broker = server.broker
            client.remoting.register_local(broker.broker_addr, broker.table)
            self.gateway = MqttGateway(cfg, client)
            self.gateway.link.attach_local(broker)  # stores without requests
            if self._stopped:
                task_status.started(None)
                return
            started = False

            def report(value=None) -> None:
                nonlocal started
                started = True
                task_status.started(value)

            try:
                await self.gateway.serve(task_status=_Status(report))
            except OSError as exc:
                if started:
                    raise
                # The brokers keep serving: a taken MQTT port must not take them down.
                log.error("MQTT gateway not started: %s (on %s: MQTT port %s, WebSocket %s, TLS %s; free it or choose another with --mqtt-port / --mqtt-ws-port / --mqtt-tls-port)", exc, self.config.host, self.config.port, self.config.ws_port, self.config.tls_port)  # noqa: E501
                task_status.started(None)

    def stop(self) -> None:
        """Disconnect clients and persist (call before the broker stops)."""
        self._stopped = True
        if self.gateway is not None:
            self.gateway.stop()


def _credentials(config: MqttConfig) -> dict[str, str | None]:
    """The ACL credentials the gateway's client signs with (docs/acl.md)."""
    return {"access_key": config.broker_access_key, "secret_key": config.broker_secret_key}


class _Status:
    """A task_status whose `started` also records that it was called."""

    def __init__(self, fn) -> None:
        self.started = fn


async def run_standalone(config: MqttConfig, namesrv_addr: str,
                         task_status=trio.TASK_STATUS_IGNORED, *,
                         client_options: dict | None = None) -> None:
    """The gateway alone, reaching the brokers of `namesrv_addr` over TCP.
    `client_options` are extra ClientConfig fields (TLS: tls, tls_ca_file, tls_verify)."""
    async with ClientInstance(namesrv_addr=namesrv_addr, **_credentials(config),
                              **(client_options or {})) as client:
        # A separate gateway process is one of possibly several: LMQs have other writers.
        gateway = MqttGateway(config, client, shared_lmqs=True)
        await gateway.serve(task_status=task_status)
