"""Bounded inflation of peer-sent compressed bodies (core.remoting.inflate), and a
compressed REGISTER_BROKER bomb against a real name server."""

from __future__ import annotations

import os
import tracemalloc
import zlib

import pytest
import trio
from trio.testing import trio_test

from core.namesrv import NameServer, NamesrvConfig
from core.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from core.remoting.inflate import InflateLimitError, inflate, inflate_async


@trio_test
async def test_inflate_async_matches_and_enforces_the_cap() -> None:
    for size in (0, 10, 70_000, 1_000_000):
        data = os.urandom(size // 2) + b"a" * (size - size // 2)
        packed = zlib.compress(data)
        assert await inflate_async(packed, size) == data  # exactly the cap is fine
        assert inflate(packed, size) == data
        if size:
            with pytest.raises(InflateLimitError):
                await inflate_async(packed, size - 1)
            with pytest.raises(InflateLimitError):
                inflate(packed, size - 1)
    with pytest.raises(ValueError):
        await inflate_async(b"not zlib at all", 100)


def register_request(body: bytes) -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.REGISTER_BROKER,
        {
            "clusterName": "C", "brokerAddr": "127.0.0.1:1", "brokerName": "b",
            "brokerId": "0", "compressed": "true",
        },
        body=body,
    )


@trio_test
async def test_compressed_register_bomb_is_refused_with_bounded_memory() -> None:
    bomb = zlib.compress(b"\0" * (64 * 1024 * 1024), 9)  # ~64 KB inflating to 64 MiB
    nameserver = NameServer(NamesrvConfig(port=0))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(nameserver.serve)
        async with RemotingClient(request_timeout=30) as client:
            addr = f"127.0.0.1:{port}"
            await client.invoke(addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
            tracemalloc.start()
            try:
                base = tracemalloc.get_traced_memory()[0]
                resp = await client.invoke(addr, register_request(bomb))
                peak = tracemalloc.get_traced_memory()[1] - base
            finally:
                tracemalloc.stop()
            assert resp.code == ResponseCode.SYSTEM_ERROR
            assert peak < 16 * 1024 * 1024, f"inflating the bomb took {peak} bytes"
        nameserver.close()
