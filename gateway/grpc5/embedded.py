"""The gRPC front end inside `lmq serve` (docs/grpc.md "Running").

`GrpcService` plugs into `core.cluster.EmbeddedServer(services=[...])` as the MQTT and
AMQP services do: its `ClientInstance` reaches the embedded name server and broker
through the in-process transport (no sockets).
"""

from __future__ import annotations

import errno
import logging

import trio

from core.client.local import embedded_client
from gateway.grpc5.config import GrpcConfig
from gateway.grpc5.server import GrpcServer

__all__ = ["GrpcService"]

log = logging.getLogger(__name__)


class GrpcService:
    """An `EmbeddedServer` service running the RocketMQ 5 gRPC front end."""

    def __init__(self, config: GrpcConfig | None = None) -> None:
        self.config = config or GrpcConfig()
        self.server: GrpcServer | None = None
        self._scope: trio.CancelScope | None = None
        self._stopped = False

    async def __call__(self, server, task_status=trio.TASK_STATUS_IGNORED) -> None:
        core = server.broker
        # Never accept a delivery time the broker would pull in (docs/grpc.md "Delivery times").
        self.config.timer_max_delay_s = min(self.config.timer_max_delay_s,
                                            server.broker_config.timer_max_delay_s)
        started = False
        with trio.CancelScope() as scope:
            self._scope = scope
            if self._stopped:
                scope.cancel()
            async with embedded_client(server) as client:
                acl = None
                if server.broker_config.acl_enable:
                    # The broker's accounts, reloads included (docs/acl.md).
                    guard = core.table.guard
                    acl = lambda: guard.config  # noqa: E731
                self.server = GrpcServer(self.config, client, acl)
                async with trio.open_nursery() as nursery:
                    try:
                        port = await nursery.start(self.server.serve)
                    except OSError as exc:
                        # As MQTT and AMQP: the brokers keep serving when the port is taken.
                        log.error("gRPC front end not started: %s", _bind_problem(self.config, exc))
                        nursery.cancel_scope.cancel()
                    else:
                        log.info("RocketMQ 5 gRPC listening on %s:%d", self.config.host, port)
                        started = True
                        task_status.started(port)
        if not started:
            task_status.started(None)

    def stop(self) -> None:
        """Close the listener and the calls (call before the broker stops)."""
        self._stopped = True
        if self._scope is not None:
            self._scope.cancel()


def _bind_problem(config: GrpcConfig, exc: OSError) -> str:
    where = f"port {config.port} (gRPC) on {config.host}"
    if exc.errno == errno.EADDRINUSE or "in use" in str(exc).lower():
        return (f"{where} is already in use by another process: stop it, or choose another "
                "port with --grpc-port (or --no-grpc)")
    return f"{where}: {exc} (choose another with --grpc-port, or --no-grpc)"
