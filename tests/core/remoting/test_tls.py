"""TLS on the remoting ports: name server and broker with a self-signed certificate, the
broker registering over TLS, our native client producing over TLS, plain peers refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from trio.testing import trio_test

from core.broker.config import BrokerConfig
from core.client import ClientInstance, Message, Producer
from core.cluster import EmbeddedServer
from core.namesrv import NameServer, NamesrvConfig
from core.remoting import (
    RemotingClient,
    RemotingCommand,
    RemotingConnectError,
    RemotingError,
    RequestCode,
)
from core.remoting.security import client_ssl_context
from tests.tls_certs import certs

__all__ = ["certs"]  # fixture used below


def topics_request() -> RemotingCommand:
    return RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)


def test_name_server_over_tls(certs: tuple[str, str]) -> None:
    cert, key = certs

    async def main() -> None:
        nameserver = NameServer(
            NamesrvConfig(port=0, tls_certfile=cert, tls_keyfile=key, frame_header_timeout_s=2)
        )
        async with trio.open_nursery() as nursery:
            port = await nursery.start(nameserver.serve)
            addr = f"127.0.0.1:{port}"
            async with RemotingClient(ssl_context=client_ssl_context(cert)) as client:
                assert (await client.invoke(addr, topics_request())).code == 0
            # Verification is on by default: the system store does not trust our cert.
            async with RemotingClient(ssl_context=client_ssl_context()) as client:
                with pytest.raises(RemotingConnectError):
                    await client.invoke(addr, topics_request())
            async with RemotingClient(ssl_context=client_ssl_context(verify=False)) as client:
                assert (await client.invoke(addr, topics_request())).code == 0
            # A plaintext peer gets no answer, and the server goes on serving.
            async with RemotingClient(request_timeout=3) as client:
                with pytest.raises(RemotingError):
                    await client.invoke(addr, topics_request())
            async with RemotingClient(ssl_context=client_ssl_context(cert)) as client:
                assert (await client.invoke(addr, topics_request())).code == 0
            nameserver.close()

    trio.run(main)


@trio_test
async def test_broker_registers_and_client_produces_over_tls(
    certs: tuple[str, str], tmp_path: Path
) -> None:
    cert, key = certs
    tls = {"tls_certfile": cert, "tls_keyfile": key}
    broker_config = BrokerConfig(
        port=0, data_dir=str(tmp_path / "data"), commitlog_file_size=16 * 1024 * 1024,
        preallocate_files=False, namesrv_tls=True, tls_ca_file=cert, **tls,
    )
    server = EmbeddedServer(broker_config, NamesrvConfig(port=0, **tls))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            namesrv = server.namesrv_addr
            async with RemotingClient(ssl_context=client_ssl_context(cert)) as client:
                info = await client.invoke(
                    namesrv, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
                )
                assert broker_config.broker_name.encode() in info.body_bytes()
            async with ClientInstance(namesrv_addr=namesrv, tls=True, tls_ca_file=cert) as c:
                async with Producer(c, "PG_TLS") as producer:
                    result = await producer.send(Message("TlsTopic", b"over tls"))
                    assert result.msg_id
            server.stop()
