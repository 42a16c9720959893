"""Hostile peers against a running name server while a well-behaved client keeps asking.

Each input of issue 9 (an idle flood past the connection cap, half-sent large frames, a
1-byte trickle, compressed REGISTER_BROKER bombs, a valid frame followed by a broken one)
is driven while a client sends a request every few milliseconds: every request must be
answered promptly, and the server must serve normally once the attackers are cut off.
Deadlines are small through the config, so the test waits for the server's own limits.
"""

from __future__ import annotations

import struct
import zlib

import trio
from trio.testing import trio_test

from core.namesrv import NameServer, NamesrvConfig
from core.remoting import (
    FrameDecoder,
    RemotingClient,
    RemotingCommand,
    RequestCode,
    encode_command_bytes,
)

# Generous: the machine is shared; a stalled loop shows up as hundreds of ms to seconds.
PROMPT_S = 1.0
PING_EVERY_S = 0.005


def topics_request() -> RemotingCommand:
    return RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)


async def connect_from(source: str, port: int) -> trio.SocketStream:
    sock = trio.socket.socket()
    await sock.bind((source, 0))
    await sock.connect(("127.0.0.1", port))
    return trio.SocketStream(sock)


async def drain_until_closed(stream: trio.SocketStream) -> bytes:
    got = b""
    try:
        while data := await stream.receive_some():
            got += data
    except trio.BrokenResourceError:
        pass
    return got


class Pinger:
    """Sends a request every few ms on its own connection and records the latencies."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.latencies: list[float] = []
        self.failures: list[BaseException] = []

    async def run(self, client: RemotingClient) -> None:
        while True:
            start = trio.current_time()
            try:
                resp = await client.invoke(self.addr, topics_request(), timeout=10)
                assert resp.code == 0
            except Exception as exc:  # recorded, asserted on by the test
                self.failures.append(exc)
            self.latencies.append(trio.current_time() - start)
            await trio.sleep(PING_EVERY_S)


async def idle_flood(source: str, port: int, count: int) -> list[trio.SocketStream]:
    return [await connect_from(source, port) for _ in range(count)]


async def half_frame(stream: trio.SocketStream) -> None:
    frame = encode_command_bytes(RemotingCommand(RequestCode.REGISTER_BROKER, body=b"x" * 4_000_000))
    try:
        await stream.send_all(frame[:1_000_000])  # header and a quarter of the body
    except trio.BrokenResourceError:
        return
    await drain_until_closed(stream)


async def trickle(stream: trio.SocketStream) -> None:
    frame = encode_command_bytes(topics_request())
    try:
        for byte in frame * 100:
            await stream.send_all(bytes([byte]))
            await trio.sleep(0.02)
    except trio.BrokenResourceError:
        return  # cut by the header deadline, as it should be
    raise AssertionError("a trickling peer was never cut off")


async def bombs(stream: trio.SocketStream, bomb: bytes, count: int) -> None:
    ext = {"clusterName": "C", "brokerAddr": "127.0.0.1:1", "brokerName": "evil",
           "brokerId": "0", "compressed": "true"}
    for i in range(count):
        cmd = RemotingCommand(RequestCode.REGISTER_BROKER, opaque=i, ext_fields=ext, body=bomb)
        await stream.send_all(encode_command_bytes(cmd))
    decoder = FrameDecoder()
    answers: list[RemotingCommand] = []
    while len(answers) < count:
        data = await stream.receive_some()
        assert data, "bomb connection closed before every bomb was answered"
        answers += decoder.feed(data)
    assert all(a.code != 0 for a in answers)
    await stream.aclose()


async def frame_then_garbage(stream: trio.SocketStream) -> None:
    good = encode_command_bytes(RemotingCommand(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, opaque=9))
    bad = b"{broken"
    await stream.send_all(good + struct.pack(">iI", 4 + len(bad), len(bad)) + bad)
    answers = FrameDecoder().feed(await drain_until_closed(stream))
    assert [a.opaque for a in answers] == [9]


@trio_test
async def test_hostile_inputs_do_not_delay_other_clients() -> None:
    config = NamesrvConfig(
        port=0, max_connections=140, max_connections_per_address=100,
        idle_timeout_s=1.0, frame_header_timeout_s=0.5, frame_body_timeout_s=0.5,
    )
    nameserver = NameServer(config)
    # Made before the clock starts: the attacker shares this process and its loop.
    bomb = zlib.compress(b"\0" * (64 * 1024 * 1024), 9)  # 64 KB inflating to 64 MiB
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(nameserver.serve)
            server = nameserver.server
            pinger = Pinger(f"127.0.0.1:{port}")
            async with RemotingClient(request_timeout=10) as client, trio.open_nursery() as pings:
                await client.invoke(pinger.addr, topics_request())
                pings.start_soon(pinger.run, client)
                # Connect everyone first (admission is under test too), then attack.
                flood = await idle_flood("127.0.0.2", port, 110)  # 100 per address
                halves = await idle_flood("127.0.0.3", port, 15)
                trickler, bomber, garbler = await idle_flood("127.0.0.4", port, 3)
                # 119 open with the pinger: a burst of 30 more meets the port's cap (140).
                burst = await idle_flood("127.0.0.5", port, 30)
                async with trio.open_nursery() as attacks:
                    for stream in halves:
                        attacks.start_soon(half_frame, stream)
                    attacks.start_soon(trickle, trickler)
                    attacks.start_soon(bombs, bomber, bomb, 12)
                    attacks.start_soon(frame_then_garbage, garbler)
                    for stream in flood + burst:
                        attacks.start_soon(drain_until_closed, stream)
                assert server.refused["max_connections_per_address"] == 10
                assert server.refused["max_connections"] == 9
                # Every attacker is gone (cut by a deadline or the idle timeout) ...
                while len(server.connections) > 1:
                    await trio.sleep(0.05)
                # ... and a newcomer is served as before.
                async with RemotingClient() as fresh:
                    assert (await fresh.invoke(pinger.addr, topics_request())).code == 0
                pings.cancel_scope.cancel()
            assert not pinger.failures, pinger.failures[:3]
            assert len(pinger.latencies) > 20
            worst = max(pinger.latencies)
            assert worst < PROMPT_S, f"a request waited {worst:.3f} s"
            nameserver.close()
