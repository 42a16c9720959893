"""The thin trio server against real pika BlockingConnections on a free port."""

from __future__ import annotations

import logging
import socket
from functools import partial

import pika
import pika.exceptions
import pytest
import trio

from gateway.amqp import server as amqp_server
from gateway.amqp.codec import (
    PROTOCOL_HEADER,
    AmqpDecoder,
    Heartbeat,
    MethodFrame,
    encode_method_frame,
)
from gateway.amqp.methods import (
    ConnectionOpen,
    ConnectionOpenOk,
    ConnectionStart,
    ConnectionStartOk,
    ConnectionTune,
    ConnectionTuneOk,
)
from gateway.amqp.server import AmqpServer, AmqpServerConfig

pytestmark = pytest.mark.timeout(60)


def _params(port: int, user: str = "guest", password: str = "guest", **kw) -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials(
        user, password), connection_attempts=1, socket_timeout=5, blocked_connection_timeout=5,
        **kw)


async def _with_server(client, config: AmqpServerConfig | None = None, **server_kw):
    server = AmqpServer(config or AmqpServerConfig(port=0), **server_kw)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve)
        try:
            return await trio.to_thread.run_sync(client, port)
        finally:
            nursery.cancel_scope.cancel()


def test_pika_opens_and_closes_channels():
    def client(port):
        conn = pika.BlockingConnection(_params(port))
        channels = [conn.channel() for _ in range(3)]
        numbers = [ch.channel_number for ch in channels]
        channels[1].close()
        conn.process_data_events(0)
        again = conn.channel()
        states = (conn.is_open, [ch.is_open for ch in channels], again.is_open)
        conn.close()
        return numbers, states, conn.is_closed

    numbers, states, closed = trio.run(_with_server, client)
    assert len(set(numbers)) == 3
    assert states == (True, [True, False, True], True)
    assert closed


def test_bad_credentials_refused():
    seen = []

    def check(user, password):
        seen.append((user, password))
        return (user, password) == ("app", "right")

    def client(port):
        with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
            pika.BlockingConnection(_params(port, "app", "wrong"))
        ok = pika.BlockingConnection(_params(port, "app", "right"))
        ok.close()
        return str(info.value)

    text = trio.run(partial(_with_server, client, authenticate=check))
    assert "403" in text and "ACCESS_REFUSED" in text
    assert seen == [("app", "wrong"), ("app", "right")]


def test_refused_logins_are_logged_one_line_each_interval(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="gateway.amqp.server")
    monkeypatch.setattr(amqp_server, "REFUSED_LOGIN_LOG_INTERVAL_S", 3600.0)

    def client(port):
        for _ in range(3):  # within one (stretched) interval
            with pytest.raises(pika.exceptions.ProbableAuthenticationError):
                pika.BlockingConnection(_params(port, "mallory", "nope"))

    trio.run(partial(_with_server, client, authenticate=lambda user, password: False))
    lines = [r.getMessage() for r in caplog.records if "login refused" in r.getMessage()]
    assert len(lines) == 1, lines  # the rest are counted, not written
    assert "'mallory'" in lines[0] and "127.0.0.1:" in lines[0]
    assert "wrong user name or password" in lines[0]


def test_unknown_vhost_refused():
    def client(port):
        # What pika raises against RabbitMQ for a missing vhost.
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
            pika.BlockingConnection(_params(port, virtual_host="/other"))
        return str(info.value)

    assert "(530) 'NOT_ALLOWED - vhost /other not found'" in trio.run(_with_server, client)


def test_unimplemented_method_closes_with_540():
    def client(port):
        conn = pika.BlockingConnection(_params(port))
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            ch.queue_declare("q")
        return info.value.reply_code

    assert trio.run(_with_server, client) == 540


def test_heartbeats_negotiated_and_answered():
    def client(port):
        conn = pika.BlockingConnection(_params(port, heartbeat=1))
        conn.channel()
        conn.sleep(3.5)  # pika's own heartbeat checker drops a silent server after 2 x 1 s
        alive = conn.is_open
        conn.close()
        return alive

    assert trio.run(_with_server, client)


def test_wrong_protocol_header_gets_ours_and_close():
    def client(port):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"AMQP\x01\x01\x00\x09")
            data = b""
            while chunk := s.recv(100):
                data += chunk
            return data

    assert trio.run(_with_server, client) == b"AMQP\x00\x00\x09\x01"


def test_binds_loopback_by_default():
    assert AmqpServerConfig().host == "127.0.0.1"


def _raw_handshake(port: int, heartbeat: int) -> tuple[socket.socket, AmqpDecoder]:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    decoder = AmqpDecoder(role="client", frame_max=1 << 20)
    s.sendall(PROTOCOL_HEADER)
    _read_until(s, decoder, ConnectionStart)
    s.sendall(encode_method_frame(0, ConnectionStartOk({}, "PLAIN", b"\x00guest\x00guest")))
    tune = _read_until(s, decoder, ConnectionTune)
    s.sendall(encode_method_frame(0, ConnectionTuneOk(tune.channel_max, tune.frame_max,
                                                      heartbeat)))
    s.sendall(encode_method_frame(0, ConnectionOpen("/")))
    _read_until(s, decoder, ConnectionOpenOk)
    return s, decoder


def _read_until(s: socket.socket, decoder: AmqpDecoder, wanted: type):
    while True:
        data = s.recv(65536)
        assert data, "server closed"
        for event in decoder.feed(data):
            if isinstance(event, wanted):
                return event
            if isinstance(event, MethodFrame) and isinstance(event.method, wanted):
                return event.method


def test_server_sends_heartbeats_and_drops_a_silent_client():
    def client(port):
        s, decoder = _raw_handshake(port, heartbeat=2)  # 2 s: margin on a loaded machine
        with s:
            _read_until(s, decoder, Heartbeat)  # sent by the server while we are idle
            # We stay silent: after two missed heartbeats the server closes the socket.
            while True:
                try:
                    data = s.recv(65536)
                except ConnectionResetError:
                    return True
                if not data:
                    return True
                assert all(isinstance(e, Heartbeat) for e in decoder.feed(data))

    assert trio.run(_with_server, client)


def test_handshake_deadline_holds_against_trickling_input():
    def client(port):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(PROTOCOL_HEADER)
            # A Start-Ok trickled one octet every 0.2 s, for 5 s (the deadline is 1 s).
            frame = encode_method_frame(0, ConnectionStartOk({"k": "v" * 200}, "PLAIN",
                                                             b"\x00guest\x00guest"))
            try:
                for octet in frame[:25]:
                    s.sendall(bytes([octet]))
                    trio.from_thread.run(trio.sleep, 0.2)
            except (BrokenPipeError, ConnectionResetError):
                return "closed"
            return "still open"

    config = AmqpServerConfig(port=0, handshake_timeout_s=1.0)
    assert trio.run(partial(_with_server, client, config)) == "closed"


def test_failing_authenticator_refuses_and_the_server_goes_on():
    def broken(user, password):
        raise RuntimeError("directory unreachable")

    def client(port):
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(_params(port))
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(_params(port))
        return True

    assert trio.run(partial(_with_server, client, authenticate=broken))


def test_connections_over_the_cap_are_closed_at_once():
    server = AmqpServer(AmqpServerConfig(port=0, max_connections=1))

    def client(port):
        first = pika.BlockingConnection(_params(port))
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            try:
                s.sendall(PROTOCOL_HEADER)
                refused = s.recv(100) == b""
            except ConnectionResetError:  # closed with our header unread
                refused = True
        first.close()
        while server.connections:  # the server's side of `first` finishing
            trio.from_thread.run(trio.sleep, 0.01)
        second = pika.BlockingConnection(_params(port))  # the slot is free again
        second.close()
        return refused

    async def main():
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.serve)
            result = await trio.to_thread.run_sync(client, port)
            nursery.cancel_scope.cancel()
        return result

    assert trio.run(main)


def test_guest_refused_from_a_non_loopback_address():
    # Reach the server through a non-loopback address of this machine, if it has one.
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: picks the outgoing address
        address = probe.getsockname()[0]
    except OSError:
        pytest.skip("no non-loopback address")
    finally:
        probe.close()
    if address.startswith("127."):
        pytest.skip("no non-loopback address")

    def client(port):
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(pika.ConnectionParameters(
                address, port, credentials=pika.PlainCredentials("guest", "guest"),
                connection_attempts=1, socket_timeout=5))
        return True

    assert trio.run(partial(_with_server, client, AmqpServerConfig(host="0.0.0.0", port=0)))
