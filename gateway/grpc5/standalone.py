"""A stand-alone gRPC proxy (`lmq proxy`) in front of a cluster, like Apache's proxy in
cluster mode (docs/grpc.md "Running").

It holds no message state: routes come from the name servers, receipt handles are the
brokers' POP handles and transaction ids name the broker and offsets, so proxies can be
restarted, killed or run side by side, and any of them serves any client's next call.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from core.acl import load_acl_file
from core.client import ClientInstance
from gateway.grpc5.config import GrpcConfig
from gateway.grpc5.server import GrpcServer

__all__ = ["run_proxy"]

log = logging.getLogger(__name__)


async def run_proxy(namesrv_addr: str, config: GrpcConfig | None = None, *,
                    access_key: str | None = None, secret_key: str | None = None,
                    acl_file: str | None = None, on_server: Any = None,
                    task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Run until cancelled; `task_status.started(port)` once the gRPC port is bound.
    `on_server(GrpcServer)` is called before it starts (the metrics read its counters)."""
    config = config or GrpcConfig()
    creds = {"access_key": access_key, "secret_key": secret_key} if access_key else {}
    async with ClientInstance(namesrv_addr=namesrv_addr, **creds) as client:
        acl = None
        if acl_file:
            accounts = load_acl_file(acl_file)  # the accounts the brokers check (docs/acl.md)
            acl = lambda: accounts  # noqa: E731
        server = GrpcServer(config, client, acl)
        if on_server is not None:
            on_server(server)
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.serve)
            log.info("RocketMQ 5 gRPC proxy listening on %s:%d (name servers %s)",
                     config.host, port, namesrv_addr)
            task_status.started(port)
