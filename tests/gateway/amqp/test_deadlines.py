"""The connection's deadlines (gateway/amqp/deadlines.py) on a real server and a raw
client socket, under trio's MockClock (time moves only when the test jumps it): heartbeats
on time, a silent peer dropped, the handshake timeout and the close linger, none of them
stretched by trickling input; and reads take no cancel scope each."""

from __future__ import annotations

import socket

import pytest
import trio
import trio.testing

from gateway.amqp import methods as am
from gateway.amqp.codec import (
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    AmqpDecoder,
    MethodFrame,
    encode_method_frame,
)
from gateway.amqp.server import AmqpServer, AmqpServerConfig
from tests.tls_certs import certs  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(60)

HEARTBEAT = 30  # s, virtual
HANDSHAKE = 10.0
LINGER = 4.0


class Peer:
    """A raw AMQP client over a non-blocking socket (reads wait with trio)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setblocking(False)
        self.decoder = AmqpDecoder(role="client", frame_max=1 << 20)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def poll(self) -> bytes | None:
        """What arrived (b"": closed); None: open, nothing to read."""
        try:
            return self.sock.recv(65536)
        except BlockingIOError:
            return None
        except ConnectionResetError:
            return b""

    async def expect(self, wanted: type):
        while True:
            await trio.lowlevel.wait_readable(self.sock)
            data = self.poll()
            assert data, "server closed"
            for event in self.decoder.feed(data):
                method = event.method if isinstance(event, MethodFrame) else event
                if isinstance(method, wanted):
                    return method

    async def handshake(self, heartbeat: int) -> None:
        self.send(PROTOCOL_HEADER)
        await self.expect(am.ConnectionStart)
        self.send(encode_method_frame(0, am.ConnectionStartOk({}, "PLAIN",
                                                           b"\x00guest\x00guest")))
        tune = await self.expect(am.ConnectionTune)
        self.send(encode_method_frame(0, am.ConnectionTuneOk(tune.channel_max, tune.frame_max,
                                                          heartbeat)))
        self.send(encode_method_frame(0, am.ConnectionOpen("/")))
        await self.expect(am.ConnectionOpenOk)


def _run(test, **config) -> None:
    clock = trio.testing.MockClock()  # rate 0: only `clock.jump` moves time

    async def main():
        cfg = AmqpServerConfig(port=0, heartbeat_s=HEARTBEAT, handshake_timeout_s=HANDSHAKE,
                               close_linger_s=LINGER, **config)
        server = AmqpServer(cfg, authenticate=lambda user, password: True)
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.serve)
            peer = Peer(port if server.tls_port is None else server.tls_port)
            try:
                await test(peer, clock, server)
            finally:
                peer.sock.close()
                nursery.cancel_scope.cancel()

    trio.run(main, clock=clock)


async def _after(clock: trio.testing.MockClock, seconds: float) -> None:
    """Move time on, then let the server act on it."""
    await trio.testing.wait_all_tasks_blocked()
    clock.jump(seconds)
    await trio.testing.wait_all_tasks_blocked()


def test_heartbeats_on_time_and_a_silent_peer_dropped_after_two():
    async def test(peer, clock, server):
        await peer.handshake(HEARTBEAT)
        await _after(clock, HEARTBEAT - 1)
        assert peer.poll() is None  # nothing due yet
        await _after(clock, 1.5)
        assert peer.poll() == HEARTBEAT_FRAME
        await _after(clock, HEARTBEAT - 1)
        assert peer.poll() is None  # alive: the peer has one more interval
        await _after(clock, 1.5)  # 2 x the interval without a frame from the peer
        assert peer.poll() in (b"", HEARTBEAT_FRAME)
        assert peer.poll() in (b"", None) and server.connections == 0

    _run(test)


def test_peer_traffic_keeps_the_connection_and_delays_the_drop():
    async def test(peer, clock, server):
        await peer.handshake(HEARTBEAT)
        for _ in range(6):  # 3 x 2 intervals, a heartbeat from the peer every half
            await _after(clock, HEARTBEAT / 2)
            peer.send(HEARTBEAT_FRAME)
            while (data := peer.poll()) is not None:
                assert data == HEARTBEAT_FRAME  # ours, on time
        assert server.connections == 1
        peer.send(encode_method_frame(1, am.ChannelOpen()))
        await peer.expect(am.ChannelOpenOk)  # still served
        await _after(clock, 2 * HEARTBEAT + 0.5)  # now silent
        while (data := peer.poll()) == HEARTBEAT_FRAME:
            pass
        assert data == b"" and server.connections == 0

    _run(test)


def test_no_heartbeat_deadlines_when_negotiated_off():
    async def test(peer, clock, server):
        await peer.handshake(0)
        await _after(clock, 100 * HEARTBEAT)
        assert peer.poll() is None and server.connections == 1

    _run(test)


def test_handshake_timeout_holds_against_trickling_input():
    async def test(peer, clock, server):
        peer.send(PROTOCOL_HEADER)
        await peer.expect(am.ConnectionStart)
        frame = encode_method_frame(0, am.ConnectionStartOk({"k": "v" * 200}, "PLAIN",
                                                         b"\x00guest\x00guest"))
        step = 0.5
        for i in range(int(HANDSHAKE / step) - 1):  # one octet per step, up to the deadline
            peer.send(frame[i:i + 1])
            await _after(clock, step)
            assert peer.poll() is None, f"dropped early, at {trio.current_time()}"
        peer.send(frame[40:41])
        await _after(clock, step + 0.01)  # past the deadline
        assert peer.poll() == b"" and server.connections == 0

    _run(test)


def test_handshake_timeout_before_any_octet():
    async def test(peer, clock, server):
        await _after(clock, HANDSHAKE - 0.5)
        assert peer.poll() is None
        await _after(clock, 1)
        assert peer.poll() == b""

    _run(test)


def test_tls_peer_stuck_before_its_tls_handshake_is_dropped(request):
    cert, key = request.getfixturevalue("certs")

    async def test(peer, clock, server):
        await _after(clock, HANDSHAKE - 0.5)
        assert peer.poll() is None
        await _after(clock, 1)
        assert peer.poll() == b"" and server.connections == 0

    _run(test, tls_port=0, certfile=cert, keyfile=key)


def test_close_linger_ends_without_close_ok_whatever_the_peer_trickles():
    async def test(peer, clock, server):
        await peer.handshake(HEARTBEAT)
        # Tune-Ok once more: a connection error, our Connection.Close follows.
        peer.send(encode_method_frame(0, am.ConnectionTuneOk(1, 4096, 0)))
        close = await peer.expect(am.ConnectionClose)
        assert close.reply_code == 540  # (NOT_IMPLEMENTED: a connection error)
        for _ in range(int(LINGER / 0.5) - 1):  # no Close-Ok, heartbeats every 0.5 s
            peer.send(HEARTBEAT_FRAME)
            await _after(clock, 0.5)
            assert peer.poll() is None, f"closed early, at {trio.current_time()}"
        await _after(clock, 0.6)
        assert peer.poll() == b"" and server.connections == 0

    _run(test)


def test_close_ok_ends_the_linger_at_once():
    async def test(peer, clock, server):
        await peer.handshake(HEARTBEAT)
        peer.send(encode_method_frame(0, am.ConnectionTuneOk(1, 4096, 0)))
        await peer.expect(am.ConnectionClose)
        peer.send(encode_method_frame(0, am.ConnectionCloseOk()))
        await trio.lowlevel.wait_readable(peer.sock)
        assert peer.poll() == b"" and trio.current_time() == 0  # no time passed

    _run(test)


def test_reads_take_no_cancel_scope_each(monkeypatch):
    entered = [0]
    enter = trio.CancelScope.__enter__

    def counting(self):
        entered[0] += 1
        return enter(self)

    async def test(peer, clock, server):
        await peer.handshake(HEARTBEAT)
        monkeypatch.setattr(trio.CancelScope, "__enter__", counting)
        for channel in range(1, 51):  # 50 reads, each answered
            peer.send(encode_method_frame(channel, am.ChannelOpen()))
            await peer.expect(am.ChannelOpenOk)
        monkeypatch.undo()

    _run(test)
    assert entered[0] < 5, entered[0]
