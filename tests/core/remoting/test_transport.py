"""RemotingServer + RemotingClient over real sockets, and the in-process transport."""

from __future__ import annotations

import functools
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
from trio.testing import trio_test, wait_all_tasks_blocked

from core.remoting import (
    ConnectionLimits,
    FrameDecoder,
    ProcessorTable,
    RemotingClient,
    RemotingCommand,
    RemotingConnectError,
    RemotingServer,
    RemotingTimeoutError,
    RequestContext,
    ResponseCode,
    encode_command_bytes,
)
from core.remoting.errors import HeaderError

ECHO, SLOW, FAST, FAIL, NEEDS_N, RECORD, CALL_BACK, CLOSE_ME, DEFERRED, BIG = range(1000, 1010)
CLIENT_PING = 2000


class Recorder:
    def __init__(self) -> None:
        self.oneway: list[RemotingCommand] = []
        self.release = trio.Event()
        self.slow_started = trio.Event()
        self.closed: list[str] = []


def make_table(rec: Recorder) -> ProcessorTable:
    table = ProcessorTable()

    async def echo(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(0, ext_fields=dict(cmd.ext_fields or {}), body=cmd.body)

    async def slow(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        rec.slow_started.set()
        if cmd.ext_str("sleep"):
            await trio.sleep(float(cmd.ext_str("sleep")))
        else:
            await rec.release.wait()
        return cmd.make_response(0, "slow done")

    async def fast(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        return RemotingCommand.response(0, "fast", {"n": 1})

    async def fail(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        raise RuntimeError("boom")

    async def needs_n(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(0, ext_fields={"n2": cmd.ext_int("n", required=True) * 2})

    async def record(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        rec.oneway.append(cmd)
        return cmd.make_response(0, "should not be sent for one-way")

    async def call_back(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        answer = await ctx.connection.invoke(RemotingCommand.request(CLIENT_PING, {"q": "hi"}), 2)
        return cmd.make_response(0, answer.remark)

    async def close_me(ctx: RequestContext, cmd: RemotingCommand) -> None:
        ctx.connection.add_close_callback(lambda: rec.closed.append(ctx.remote_addr))
        ctx.connection.close()

    async def deferred(ctx: RequestContext, cmd: RemotingCommand) -> None:
        async def later() -> None:
            await trio.sleep(0.01)
            await ctx.connection.send(cmd.make_response(0, "deferred"))

        # Answer outside the handler, as a long-polling pull does.
        rec.nursery.start_soon(later)
        return None

    async def big(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        size = cmd.ext_int("size")
        chunk = bytes(range(256)) * 256
        parts = [memoryview(chunk)] * (size // len(chunk))
        return cmd.make_response(0, body=parts)

    table.register(ECHO, echo)
    table.register(SLOW, slow, inline=False)
    table.register(FAST, fast)
    table.register(FAIL, fail)
    table.register(NEEDS_N, needs_n)
    table.register(RECORD, record)
    table.register(CALL_BACK, call_back, inline=False)
    table.register(CLOSE_ME, close_me)
    table.register(DEFERRED, deferred, inline=False)
    table.register(BIG, big)
    return table


def client_table() -> ProcessorTable:
    table = ProcessorTable()

    async def ping(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(0, "pong:" + cmd.ext_str("q"))

    table.register(CLIENT_PING, ping)
    return table


@asynccontextmanager
async def server_running(
    table: ProcessorTable, port: int = 0, **kwargs: object
) -> AsyncIterator[RemotingServer]:
    async with trio.open_nursery() as nursery:
        server = RemotingServer(table, "127.0.0.1", port, **kwargs)
        await nursery.start(server.serve)
        yield server
        server.close()


@asynccontextmanager
async def setup(local: bool, **server_kwargs: object) -> AsyncIterator[tuple[RemotingClient, str, Recorder, RemotingServer | None]]:
    rec = Recorder()
    table = make_table(rec)
    async with trio.open_nursery() as nursery:
        rec.nursery = nursery
        async with RemotingClient(request_timeout=5, processors=client_table()) as client:
            if local:
                client.register_local("local:1", table)
                yield client, "local:1", rec, None
            else:
                async with server_running(table, **server_kwargs) as server:
                    yield client, f"127.0.0.1:{server.port}", rec, server
        nursery.cancel_scope.cancel()


async def raw_exchange(port: int, data: bytes, expect: int) -> list[RemotingCommand]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        decoder = FrameDecoder()
        got: list[RemotingCommand] = []
        with trio.fail_after(5):
            while len(got) < expect:
                chunk = await stream.receive_some()
                if not chunk:
                    break
                got.extend(decoder.feed(chunk))
        return got


both = pytest.mark.parametrize("local", [False, True], ids=["tcp", "local"])


@both
@trio_test
async def test_request_response(local: bool) -> None:
    async with setup(local) as (client, addr, rec, server):
        req = RemotingCommand.request(ECHO, {"topic": "T", "queueId": 3}, body=[b"ab", b"cd"])
        resp = await client.invoke(addr, req)
        assert resp.code == 0 and resp.is_response and resp.opaque == req.opaque
        assert resp.ext_str("topic") == "T" and resp.ext_int("queueId") == 3
        assert resp.body_bytes() == b"abcd"
        fast = await client.invoke(addr, RemotingCommand.request(FAST))
        assert fast.remark == "fast" and fast.ext_int("n") == 1


@both
@trio_test
async def test_many_concurrent_requests_on_one_connection(local: bool) -> None:
    async with setup(local) as (client, addr, rec, server):
        results: dict[int, bytes] = {}

        async def one(i: int) -> None:
            code = ECHO if i % 3 else SLOW
            ext = {"i": i, "sleep": "0.01"}
            resp = await client.invoke(addr, RemotingCommand.request(code, ext, body=str(i).encode()))
            results[i] = resp.body_bytes() if code == ECHO else resp.remark.encode()

        async with trio.open_nursery() as nursery:
            for i in range(300):
                nursery.start_soon(one, i)
        assert all(results[i] == (str(i).encode() if i % 3 else b"slow done") for i in range(300))
        if server is not None:
            assert len(server.connections) == 1


@both
@trio_test
async def test_oneway_gets_no_response(local: bool) -> None:
    async with setup(local) as (client, addr, rec, server):
        await client.invoke_oneway(addr, RemotingCommand.request(RECORD, {"k": "v"}))
        with trio.fail_after(5):
            while not rec.oneway:
                await trio.sleep(0.01)
        assert rec.oneway[0].is_oneway and rec.oneway[0].ext_str("k") == "v"
        if server is not None:
            # Over a raw socket: the one-way request is silent, the next one is answered.
            oneway = RemotingCommand(RECORD, opaque=1, flag=2)
            normal = RemotingCommand(FAST, opaque=2)
            got = await raw_exchange(
                server.port, encode_command_bytes(oneway) + encode_command_bytes(normal), 1
            )
            assert [c.opaque for c in got] == [2]


@both
@trio_test
async def test_server_initiated_invoke_to_client(local: bool) -> None:
    async with setup(local) as (client, addr, rec, server):
        resp = await client.invoke(addr, RemotingCommand.request(CALL_BACK))
        assert resp.code == 0 and resp.remark == "pong:hi"


@both
@trio_test
async def test_timeout_then_connection_still_usable(local: bool) -> None:
    async with setup(local) as (client, addr, rec, server):
        with pytest.raises(RemotingTimeoutError):
            await client.invoke(addr, RemotingCommand.request(SLOW), timeout=0.1)
        resp = await client.invoke(addr, RemotingCommand.request(FAST))
        assert resp.remark == "fast"


@both
@trio_test
async def test_slow_non_inline_handler_does_not_block_inline(local: bool) -> None:
    async with setup(local) as (client, addr, rec, server):
        slow_result: list[RemotingCommand] = []

        async def slow_call() -> None:
            slow_result.append(await client.invoke(addr, RemotingCommand.request(SLOW)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow_call)
            await rec.slow_started.wait()
            for _ in range(5):
                assert (await client.invoke(addr, RemotingCommand.request(FAST))).remark == "fast"
            assert not slow_result
            rec.release.set()
        assert slow_result[0].remark == "slow done"


@both
@trio_test
async def test_unknown_code_and_handler_errors(local: bool) -> None:
    async with setup(local) as (client, addr, rec, server):
        resp = await client.invoke(addr, RemotingCommand.request(4242))
        assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED == 3
        assert resp.remark == " request type 4242 not supported"
        resp = await client.invoke(addr, RemotingCommand.request(FAIL))
        assert resp.code == ResponseCode.SYSTEM_ERROR and "boom" in resp.remark
        resp = await client.invoke(addr, RemotingCommand.request(FAIL))
        assert resp.code == ResponseCode.SYSTEM_ERROR
        resp = await client.invoke(addr, RemotingCommand.request(NEEDS_N))
        # the remark names the missing field ("n" alone would match nearly any text)
        assert resp.code == ResponseCode.SYSTEM_ERROR and resp.remark.endswith(": n")
        assert "missing" in resp.remark
        resp = await client.invoke(addr, RemotingCommand.request(NEEDS_N, {"n": "x"}))
        assert resp.code == ResponseCode.SYSTEM_ERROR and "invalid integer" in resp.remark
        resp = await client.invoke(addr, RemotingCommand.request(NEEDS_N, {"n": 21}))
        assert resp.code == 0 and resp.ext_str("n2") == "42"


@both
@trio_test
async def test_deferred_reply_through_connection_send(local: bool) -> None:
    async with setup(local) as (client, addr, rec, server):
        resp = await client.invoke(addr, RemotingCommand.request(DEFERRED))
        assert resp.remark == "deferred"


@both
@trio_test
async def test_connection_close_fails_pending_and_runs_callbacks(local: bool) -> None:
    async with setup(local) as (client, addr, rec, server):
        with pytest.raises(RemotingConnectError):
            await client.invoke(addr, RemotingCommand.request(CLOSE_ME), timeout=10)
        with trio.fail_after(5):
            while not rec.closed:
                await trio.sleep(0.01)
        # The client reconnects lazily.
        assert (await client.invoke(addr, RemotingCommand.request(FAST))).remark == "fast"


@trio_test
async def test_server_close_callbacks_on_client_disconnect() -> None:
    rec = Recorder()
    table = ProcessorTable()
    closed = trio.Event()

    async def hello(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        ctx.connection.add_close_callback(closed.set)
        return cmd.make_response(0)

    table.register(ECHO, hello)
    async with server_running(table) as server:
        async with RemotingClient() as client:
            await client.invoke(f"127.0.0.1:{server.port}", RemotingCommand.request(ECHO))
            assert len(server.connections) == 1
        with trio.fail_after(5):
            await closed.wait()
        assert not server.connections
    del rec


@trio_test
async def test_server_restart_client_reconnects() -> None:
    rec = Recorder()
    table = make_table(rec)
    async with RemotingClient(request_timeout=2) as client:
        async with server_running(table) as server:
            port = server.port
            addr = f"127.0.0.1:{port}"
            assert (await client.invoke(addr, RemotingCommand.request(FAST))).code == 0
        with trio.fail_after(5):
            while True:  # the old connection notices the close
                try:
                    await client.invoke(addr, RemotingCommand.request(FAST))
                except RemotingConnectError:
                    break
                await trio.sleep(0.01)
        async with server_running(table, port=port):
            assert (await client.invoke(addr, RemotingCommand.request(FAST))).remark == "fast"


@trio_test
async def test_connect_error() -> None:
    async with RemotingClient(request_timeout=2) as client:
        # A port nobody listens on: bind a listener, note its port, close it.
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        await listeners[0].aclose()
        with pytest.raises(RemotingConnectError):
            await client.invoke(f"127.0.0.1:{port}", RemotingCommand.request(FAST))
        with pytest.raises(RemotingConnectError):
            await client.invoke("no-port", RemotingCommand.request(FAST))


@trio_test
async def test_malformed_frame_closes_only_that_connection() -> None:
    rec = Recorder()
    async with server_running(make_table(rec)) as server:
        async with RemotingClient() as client:
            addr = f"127.0.0.1:{server.port}"
            assert (await client.invoke(addr, RemotingCommand.request(FAST))).code == 0
            bad = struct.pack(">iI", 12, 8) + b"not json"
            got = await raw_exchange(server.port, bad, 1)
            assert got == []  # closed without an answer
            huge = struct.pack(">iI", 64 * 1024 * 1024, 10)
            assert await raw_exchange(server.port, huge, 1) == []
            assert (await client.invoke(addr, RemotingCommand.request(FAST))).code == 0
            assert len(server.connections) == 1


@trio_test
async def test_cpp_style_request_and_binary_request_over_socket() -> None:
    rec = Recorder()
    async with server_running(make_table(rec)) as server:
        header = (
            b'{"code":1000,"extFields":{"AccessKey":"","queueId":2,"topic":"T"},'
            b'"flag":0,"language":"CPP","opaque":41,"remark":"","version":63}\n'
        )
        cpp = struct.pack(">ii", 4 + len(header), len(header)) + header
        binary = encode_command_bytes(
            RemotingCommand(ECHO, opaque=42, ext_fields={"a": "b"}, serialize_type=1)
        )
        got = await raw_exchange(server.port, cpp + binary, 2)
        assert [c.opaque for c in got] == [41, 42]
        assert got[0].serialize_type == 0 and got[0].ext_fields["queueId"] == "2"
        assert got[1].serialize_type == 1 and got[1].ext_fields == {"a": "b"}
        assert all(c.is_response and c.code == 0 for c in got)


@trio_test
async def test_unencodable_response_is_dropped_and_connection_survives() -> None:
    table = ProcessorTable()

    async def bad(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(100_000)  # does not fit the binary header's int16

    async def good(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(0, "ok")

    table.register(ECHO, bad)
    table.register(FAST, good)
    async with server_running(table) as server:
        frames = encode_command_bytes(RemotingCommand(ECHO, opaque=1, serialize_type=1))
        frames += encode_command_bytes(RemotingCommand(FAST, opaque=2, serialize_type=1))
        got = await raw_exchange(server.port, frames, 1)
        assert [(c.opaque, c.remark) for c in got] == [(2, "ok")]


@trio_test
async def test_large_gathered_response() -> None:
    rec = Recorder()
    async with server_running(make_table(rec)) as server:
        async with RemotingClient(request_timeout=10) as client:
            size = 8 * 1024 * 1024
            resp = await client.invoke(
                f"127.0.0.1:{server.port}", RemotingCommand.request(BIG, {"size": size})
            )
            body = resp.body_bytes()
            assert len(body) == size and body[:256] == bytes(range(256)) and body[-1] == 255


@trio_test
async def test_slow_reader_is_disconnected() -> None:
    rec = Recorder()
    limits = ConnectionLimits(max_outbound_bytes=2 * 1024 * 1024)
    async with server_running(make_table(rec), limits=limits) as server:
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        async with stream:
            req = b"".join(
                encode_command_bytes(RemotingCommand(BIG, opaque=i, ext_fields={"size": 1 << 20}))
                for i in range(200)
            )
            await stream.send_all(req)  # ~200 MiB of answers requested, none read
            with trio.fail_after(10):
                while server.connections:
                    await trio.sleep(0.05)


@trio_test
async def test_too_many_concurrent_requests_get_system_busy() -> None:
    rec = Recorder()
    limits = ConnectionLimits(max_concurrent_requests=2)
    async with server_running(make_table(rec), limits=limits) as server:
        frames = b"".join(
            encode_command_bytes(RemotingCommand(SLOW, opaque=i)) for i in range(3)
        )
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        async with stream:
            await stream.send_all(frames)
            decoder = FrameDecoder()
            with trio.fail_after(5):
                got = decoder.feed(await stream.receive_some())
            assert got[0].opaque == 2 and got[0].code == ResponseCode.SYSTEM_BUSY
            rec.release.set()
            with trio.fail_after(5):
                while len(got) < 3:
                    got.extend(decoder.feed(await stream.receive_some()))
            assert sorted(c.opaque for c in got) == [0, 1, 2]


@trio_test
async def test_local_close_callbacks_both_sides_and_client_close() -> None:
    table = ProcessorTable()
    server_side = []

    async def hello(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        server_side.append(ctx.connection)
        ctx.connection.add_close_callback(lambda: server_side.append("closed"))
        return cmd.make_response(0, ctx.remote_addr)

    table.register(ECHO, hello)
    async with RemotingClient() as client:
        client.register_local("broker:1", table)
        resp = await client.invoke("broker:1", RemotingCommand.request(ECHO))
        assert resp.remark.startswith("127.0.0.1:")
        assert server_side[0].remote_addr == resp.remark
        assert server_side[0].local_addr == "broker:1"
        await client.close()
        assert server_side[-1] == "closed"
        with pytest.raises(RemotingConnectError):
            await client.invoke("broker:1", RemotingCommand.request(ECHO))


def test_header_error_message() -> None:
    exc = HeaderError("topic", "missing required ext field")
    assert str(exc) == "missing required ext field: topic"


@trio_test
async def test_in_process_invoke_loop_lets_other_tasks_run() -> None:
    """A handler that never waits must not let an invoke loop starve the event loop:
    in-process gateways call the broker this way on their hot path."""
    table = ProcessorTable()

    async def instant(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(0)

    table.register(ECHO, instant)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0)

    async with RemotingClient() as client, trio.open_nursery() as nursery:
        client.register_local("broker:1", table)
        nursery.start_soon(ticker)
        await trio.sleep(0)
        before = ticks
        for _ in range(200):
            resp = await client.invoke("broker:1", RemotingCommand.request(ECHO), timeout=5)
            assert resp.code == 0
        assert ticks - before >= 100  # the ticker ran during the loop
        nursery.cancel_scope.cancel()


@trio_test
async def test_oneway_flood_waits_for_a_slow_reader_instead_of_disconnecting() -> None:
    """Requests this side originates get backpressure; only replies to a peer that stops
    reading hit the slow-reader cut-off."""
    total = 3000
    received = 0
    reading = trio.Event()

    async def slow_peer(stream: trio.SocketStream) -> None:
        nonlocal received
        await reading.wait()  # read nothing at first: the client's queue fills up
        decoder = FrameDecoder()
        while received < total:
            data = await stream.receive_some(65536)
            if not data:
                return
            received += len(decoder.feed(data))

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, slow_peer, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        limits = ConnectionLimits(max_outbound_frames=100)
        async with RemotingClient(limits=limits) as client:
            addr = f"127.0.0.1:{port}"
            body = b"x" * 1024

            queued = 0

            async def flood() -> None:
                nonlocal queued
                for i in range(total):
                    await client.invoke_oneway(addr, RemotingCommand.request(ECHO, {"i": i}, body))
                    queued += 1

            async with trio.open_nursery() as senders:
                senders.start_soon(flood)
                # Every task blocked: the flood is waiting for room (socket buffers and the
                # outbound queue are full), the connection still open.
                await wait_all_tasks_blocked()
                assert 0 < queued < total and received == 0
                assert not (await client.connection(addr)).closed
                reading.set()
            with trio.fail_after(10):
                while received < total:
                    await trio.sleep(0.01)
            assert not (await client.connection(addr)).closed
        nursery.cancel_scope.cancel()
    assert received == total
