"""Bounded inflation of peer-sent compressed bodies (core.remoting.inflate), and a
compressed REGISTER_BROKER bomb against a real name server."""

from __future__ import annotations

import os
import tracemalloc
import zlib

import pytest
import trio
from trio.testing import trio_test

from core.client.api import inflate_bodies
from core.common.codec import decode_record, encode_host, encode_record
from core.common.message import MessageExt
from core.common.sysflag import MessageSysFlag
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


# -- consumer side: stored messages are whatever a producer sent --------------------------


def stored_record(body: bytes, sys_flag: int) -> bytes:
    return encode_record(
        topic=b"T", body=body, properties=b"", queue_id=0, flag=0, queue_offset=0,
        physical_offset=0, sys_flag=sys_flag, born_timestamp=0,
        born_host=encode_host("10.0.0.2:1"), store_timestamp=0,
        store_host=encode_host("10.0.0.1:10911"), reconsume_times=0,
        prepared_transaction_offset=0,
    )


def deflated_zeros(size: int) -> bytes:
    """zlib of `size` zero bytes, made without holding them all."""
    packer = zlib.compressobj(9)
    chunk = bytes(1024 * 1024)
    out = [packer.compress(chunk) for _ in range(size // len(chunk))]
    return b"".join(out) + packer.flush()


BOMB_MESSAGE = deflated_zeros(64 * 1024 * 1024)  # ~64 KB inflating to 64 MiB


def test_compressed_message_bomb_is_left_compressed_with_bounded_memory() -> None:
    record = stored_record(BOMB_MESSAGE, MessageSysFlag.COMPRESSED)
    tracemalloc.start()
    try:
        msg = decode_record(record, decompress=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert msg.body == BOMB_MESSAGE and msg.sys_flag & MessageSysFlag.COMPRESSED
    assert peak < 32 * 1024 * 1024, f"decoding took {peak} bytes"
    garbage = decode_record(stored_record(b"not zlib", MessageSysFlag.COMPRESSED), decompress=True)
    assert garbage.body == b"not zlib"
    fine = decode_record(stored_record(zlib.compress(b"ok" * 1000), MessageSysFlag.COMPRESSED),
                         decompress=True)
    assert fine.body == b"ok" * 1000 and not fine.sys_flag & MessageSysFlag.COMPRESSED


@trio_test
async def test_pulled_bodies_are_inflated_bounded_off_the_loop() -> None:
    big = os.urandom(100_000) * 10  # 1 MB: past the on-loop share
    msgs = [
        MessageExt(topic="T", body=zlib.compress(big), sys_flag=MessageSysFlag.COMPRESSED),
        MessageExt(topic="T", body=BOMB_MESSAGE, sys_flag=MessageSysFlag.COMPRESSED),
        MessageExt(topic="T", body=b"plain", sys_flag=0),
    ]
    await inflate_bodies(msgs)
    assert msgs[0].body == big and msgs[0].sys_flag == 0
    assert msgs[1].body == BOMB_MESSAGE and msgs[1].sys_flag == MessageSysFlag.COMPRESSED
    assert msgs[2].body == b"plain"
