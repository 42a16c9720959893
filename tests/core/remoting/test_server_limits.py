"""RemotingServer limits over real sockets: read deadlines, idle timeout, connection caps,
the descriptor reserve, EMFILE on accept, and a valid frame followed by a broken one."""

from __future__ import annotations

import os
import resource
import struct
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace

import trio
from trio.testing import trio_test

from core.remoting import FrameDecoder, ProcessorTable, RemotingCommand, encode_command_bytes
from core.remoting.server import SERVER_CONNECTION_LIMITS, ListenerLimits, RemotingServer

PING = 1500


def ping_table() -> ProcessorTable:
    table = ProcessorTable()

    async def ping(ctx, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(0, "pong")

    table.register(PING, ping)
    return table


@asynccontextmanager
async def serving(**kwargs: object) -> AsyncIterator[RemotingServer]:
    timeouts = {k: kwargs.pop(k) for k in list(kwargs) if k.endswith("_s")}
    limits = replace(SERVER_CONNECTION_LIMITS, **timeouts)
    async with trio.open_nursery() as nursery:
        server = RemotingServer(ping_table(), "127.0.0.1", 0, limits=limits, **kwargs)
        await nursery.start(server.serve)
        yield server
        server.close()


def ping_frame(opaque: int = 1) -> bytes:
    return encode_command_bytes(RemotingCommand(PING, opaque=opaque))


async def ping(stream: trio.SocketStream, opaque: int = 1) -> RemotingCommand:
    await stream.send_all(ping_frame(opaque))
    decoder = FrameDecoder()
    with trio.fail_after(5):
        while True:
            data = await stream.receive_some()
            assert data, "server closed instead of answering"
            got = decoder.feed(data)
            if got:
                return got[0]


async def wait_closed(stream: trio.SocketStream, bound: float = 5.0) -> bytes:
    """Read until the server closes; returns what came. Fails after `bound` seconds."""
    got = b""
    with trio.fail_after(bound):
        while True:
            data = await stream.receive_some()
            if not data:
                return got
            got += data


@trio_test
async def test_partial_header_is_cut_at_the_header_deadline() -> None:
    async with serving(header_timeout_s=0.3) as server:
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        await stream.send_all(ping_frame()[:6])  # length prefix and a bit
        assert await wait_closed(stream) == b""
        # Other peers are served as before.
        other = await trio.open_tcp_stream("127.0.0.1", server.port)
        assert (await ping(other)).remark == "pong"


@trio_test
async def test_trickled_header_is_cut_although_bytes_keep_coming() -> None:
    frame = ping_frame() + b"x" * 1000  # longer than what the deadline lets through
    async with serving(header_timeout_s=0.3, idle_timeout_s=60.0) as server:
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        sent = 0

        async def trickle() -> None:
            nonlocal sent
            try:
                while sent < len(frame):
                    await stream.send_all(frame[sent : sent + 1])
                    sent += 1
                    await trio.sleep(0.02)
            except trio.BrokenResourceError:
                pass

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trickle)
            await wait_closed(stream, 10)
            nursery.cancel_scope.cancel()
        assert sent < len(frame), "a 1-byte trickle was never cut"


@trio_test
async def test_partial_body_is_cut_at_the_body_deadline() -> None:
    big = RemotingCommand(PING, opaque=3, body=b"b" * 1_000_000)
    frame = encode_command_bytes(big)
    async with serving(header_timeout_s=30.0, body_timeout_s=0.3) as server:
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        await stream.send_all(frame[:200_000])  # header complete, body started
        assert await wait_closed(stream) == b""


@trio_test
async def test_idle_connection_is_closed_and_busy_one_kept() -> None:
    async with serving(idle_timeout_s=0.5) as server:
        idle = await trio.open_tcp_stream("127.0.0.1", server.port)
        busy = await trio.open_tcp_stream("127.0.0.1", server.port)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_closed, idle)
            # Traffic every 50 ms for 1.5 s: three idle timeouts pass, the busy peer stays.
            for i in range(30):
                assert (await ping(busy, i)).remark == "pong"
                await trio.sleep(0.05)
        assert len(server.connections) == 1


@trio_test
async def test_connections_per_address_and_per_port_are_capped() -> None:
    async with serving(
        listener_limits=ListenerLimits(max_connections=6, max_connections_per_address=4)
    ) as server:
        streams = [await trio.open_tcp_stream("127.0.0.1", server.port) for _ in range(4)]
        for i, stream in enumerate(streams):
            assert (await ping(stream, i)).remark == "pong"
        extra = await trio.open_tcp_stream("127.0.0.1", server.port)
        assert await wait_closed(extra) == b""  # closed at accept, before any read
        assert server.refused["max_connections_per_address"] == 1
        # Another source address (127.0.0.2 is loopback too) is counted apart...
        other = [await open_from("127.0.0.2", server.port) for _ in range(2)]
        for stream in other:
            assert (await ping(stream)).remark == "pong"
        # ... up to the port's cap.
        over = await open_from("127.0.0.3", server.port)
        assert await wait_closed(over) == b""
        assert server.refused["max_connections"] == 1
        # A slot freed is a slot for the next peer.
        await streams[0].aclose()
        with trio.fail_after(5):
            while len(server.connections) > 5:
                await trio.sleep(0.01)
        again = await trio.open_tcp_stream("127.0.0.1", server.port)
        assert (await ping(again)).remark == "pong"


async def open_from(source: str, port: int) -> trio.SocketStream:
    sock = trio.socket.socket()
    await sock.bind((source, 0))
    await sock.connect(("127.0.0.1", port))
    return trio.SocketStream(sock)


@contextmanager
def fd_limit(soft: int):
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, old)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# Holds N connections to a port from another process (so they cost this process one
# descriptor each, as remote peers do) until its stdin closes.
HOLDER = """
import socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
sys.stdin.readline()
held = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
print(len(held), flush=True)
sys.stdin.read()
"""


@trio_test
async def test_descriptor_reserve_is_kept_for_the_rest_of_the_process() -> None:
    async with serving(listener_limits=ListenerLimits(fd_reserve=20)) as server:
        # Started before the limit is lowered (a child inherits it).
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(server.port), "150"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )
        with fd_limit(open_fds() + 100):
            try:
                holder.stdin.write(b"go\n")
                holder.stdin.flush()
                assert (await trio.to_thread.run_sync(holder.stdout.readline)).strip() == b"150"
                with trio.fail_after(10):
                    while len(server.connections) + server.refused["fd_reserve"] < 150:
                        await trio.sleep(0.01)
                assert 0 < server.refused["fd_reserve"] and not server.refused["accept_error"]
                # The reserve is there: the process can still open files.
                files = [os.open(os.devnull, os.O_RDONLY) for _ in range(15)]
                for fd in files:
                    os.close(fd)
            finally:
                holder.stdin.close()
                holder.wait()
            with trio.fail_after(5):
                while server.connections:
                    await trio.sleep(0.01)
            stream = await trio.open_tcp_stream("127.0.0.1", server.port)
            assert (await ping(stream)).remark == "pong"
            await stream.aclose()


@trio_test
async def test_accept_survives_emfile() -> None:
    # No reserve: accept() itself runs out of descriptors.
    async with serving(listener_limits=ListenerLimits(fd_reserve=0)) as server:
        streams = []
        with fd_limit(open_fds() + 30):
            for _ in range(40):
                try:
                    streams.append(await trio.open_tcp_stream("127.0.0.1", server.port))
                except OSError:
                    break
            with trio.fail_after(5):
                while not server.refused["accept_error"]:
                    await trio.sleep(0.01)
            for stream in streams:
                await stream.aclose()
            with trio.fail_after(5):
                while server.connections:
                    await trio.sleep(0.01)
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        assert (await ping(stream)).remark == "pong"


@trio_test
async def test_valid_frame_then_broken_header_is_answered_then_closed() -> None:
    good = ping_frame(7)
    bad_header = b"{not json"
    broken = struct.pack(">iI", 4 + len(bad_header), len(bad_header)) + bad_header
    async with serving() as server:
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        await stream.send_all(good + broken)  # one write
        rest = await wait_closed(stream)
        cmds = FrameDecoder().feed(rest)
        assert [(c.opaque, c.remark) for c in cmds] == [(7, "pong")]
        other = await trio.open_tcp_stream("127.0.0.1", server.port)
        assert (await ping(other)).remark == "pong"


@trio_test
async def test_partial_frames_of_all_peers_share_a_byte_budget() -> None:
    frame = encode_command_bytes(RemotingCommand(PING, opaque=5, body=b"p" * 1_500_000))
    budget = 3_000_000  # two peers' 1.2 MB halves fit, a third does not
    async with serving(listener_limits=ListenerLimits(max_pending_frame_bytes=budget)) as server:
        halves = [await trio.open_tcp_stream("127.0.0.1", server.port) for _ in range(5)]
        closed = []
        async with trio.open_nursery() as watchers:
            for stream in halves:
                try:
                    await stream.send_all(frame[:1_200_000])
                except trio.BrokenResourceError:
                    pass

                async def watch(stream=stream) -> None:
                    await wait_closed(stream, 30)
                    closed.append(stream)

                watchers.start_soon(watch)
            with trio.fail_after(10):
                while len(closed) < 3:
                    await trio.sleep(0.01)
            watchers.cancel_scope.cancel()
        assert server.frame_budget.used <= budget
        # Peers within the budget go on: one completes its frame and is answered.
        survivor = next(s for s in halves if s not in closed)
        await survivor.send_all(frame[1_200_000:])
        decoder = FrameDecoder()
        with trio.fail_after(10):
            got: list = []
            while not got:
                got = decoder.feed(await survivor.receive_some())
        assert got[0].opaque == 5
        other = await trio.open_tcp_stream("127.0.0.1", server.port)
        assert (await ping(other)).remark == "pong"
