"""A native client of the name server and broker of this process, for the services
`core.cluster.EmbeddedServer` runs beside them (the MQTT, AMQP and gRPC front ends inside
`lmq serve`): requests to them go through the in-process transport, no sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from core.client.instance import ClientInstance

__all__ = ["embedded_client"]


@asynccontextmanager
async def embedded_client(server) -> AsyncIterator[ClientInstance]:
    """A started `ClientInstance` on `server`'s name servers, reaching its own name server
    (when it runs one) and its broker in process."""
    namesrv_addr = server.namesrv_addr or ";".join(server.broker_config.namesrv_addrs)
    async with ClientInstance(namesrv_addr=namesrv_addr) as client:
        if server.namesrv is not None:
            client.remoting.register_local(server.namesrv_addr, server.namesrv.table)
        client.remoting.register_local(server.broker.broker_addr, server.broker.table)
        yield client
