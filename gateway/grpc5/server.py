"""`GrpcServer`: the gRPC front end's lifetime on the trio side (docs/grpc.md).

``await nursery.start(GrpcServer(config, client).serve)`` binds the port, starts the
grpc.aio thread and returns the bound port; cancelling `serve` stops the server (calls in
flight get `shutdown_grace_s`) and joins the thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc
import trio

from core.acl import AclConfig
from core.client import ClientInstance
from gateway.grpc5.auth import GrpcAuth
from gateway.grpc5.backend import Backend
from gateway.grpc5.bridge import GrpcThread, TrioHop
from gateway.grpc5.config import GrpcConfig
from gateway.grpc5.proto import messaging_pb2_grpc as pbg
from gateway.grpc5.servicer import MessagingServicer
from gateway.grpc5.stats import GrpcStats, counted

__all__ = ["GrpcServer"]

log = logging.getLogger(__name__)


class GrpcServer:
    def __init__(self, config: GrpcConfig, client: ClientInstance,
                 acl: Callable[[], AclConfig] | None = None) -> None:
        self.config = config
        self.client = client
        #: The current ACL accounts when ACL is on: every call must be signed.
        self.acl = acl
        self.servicer: MessagingServicer | None = None
        self.port: int | None = None
        #: Counters for /metrics (gateway/grpc5/stats.py; lmq/metrics.py reads them).
        self.stats = GrpcStats()

    def _grpc_options(self) -> list[tuple[str, int]]:
        cfg = self.config
        return [
            ("grpc.max_receive_message_length", cfg.max_request_bytes),
            ("grpc.max_concurrent_streams", cfg.max_streams_per_connection),
            ("grpc.so_reuseport", 0),
        ]

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.config
        async with trio.open_nursery() as nursery:
            hop = TrioHop(trio.lowlevel.current_trio_token(), nursery)
            backend = Backend(self.client, cfg, on_transaction_check=self._on_check)
            await nursery.start(backend.renewer.run)
            nursery.start_soon(backend.mqtt.run)
            servicer = self.servicer = MessagingServicer(hop, backend, cfg)
            servicer.stats = self.stats
            if self.acl is not None:
                servicer.auth = GrpcAuth(self.acl)

            def build() -> grpc.aio.Server:
                servicer.loop = asyncio.get_running_loop()
                server = grpc.aio.server(options=self._grpc_options())
                pbg.add_MessagingServiceServicer_to_server(counted(servicer, self.stats), server)
                return server

            host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
            thread = GrpcThread(build, f"{host}:{cfg.port}", cfg.shutdown_grace_s,
                                self._credentials())
            self.port = servicer.port = await thread.start()
            try:
                task_status.started(self.port)
                await trio.sleep_forever()
            finally:
                nursery.cancel_scope.cancel()
                await thread.stop()

    def _credentials(self) -> grpc.ServerCredentials | None:
        """TLS credentials from the PEM files (OSError when unreadable), or None."""
        cfg = self.config
        if not (cfg.tls_certfile or cfg.tls_keyfile):
            return None
        if not (cfg.tls_certfile and cfg.tls_keyfile):
            raise OSError("gRPC TLS needs both a certificate and a key file")
        with open(cfg.tls_keyfile, "rb") as key, open(cfg.tls_certfile, "rb") as cert:
            return grpc.ssl_server_credentials([(key.read(), cert.read())])

    def _on_check(self, addr: str, msg, cmd) -> None:
        """A broker's CHECK_TRANSACTION_STATE (trio side): hand it to the gRPC loop."""
        servicer = self.servicer
        if servicer is None or servicer.loop is None:
            return
        broker = servicer.backend.broker_name(addr)
        if broker is None:
            return
        qo = cmd.ext_int("tranStateTableOffset", msg.queue_offset)
        clo = cmd.ext_int("commitLogOffset", msg.commitlog_offset)
        try:
            servicer.loop.call_soon_threadsafe(servicer.push_transaction_check, broker, msg,
                                               qo, clo)
        except RuntimeError:
            pass
