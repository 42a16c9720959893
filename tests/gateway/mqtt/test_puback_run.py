"""Subscribers' PUBACKs scanned in one C call (core/_speedups.c scan_pubacks, codec
`publish_runs`): the same acknowledgements, in the same order, and the same faults as the
Python decoder, whatever the packets and however the bytes are split into reads; and a
QoS 1 subscriber acknowledging many messages in one write gets them all completed."""

from __future__ import annotations

import random
import socket

import pytest

from gateway.mqtt import publish_run
from gateway.mqtt.codec import MqttCodec, PubackRun
from gateway.mqtt.packets import Connect, Puback, Publish
from tests.gateway.mqtt.run_support import feed_chunks, flatten, raw, run_codec
from tests.gateway.mqtt.server_harness import GatewayServer

needs_c = pytest.mark.skipif(publish_run.scan_pubacks is None, reason="core._speedups not built")


def _puback(pid: int) -> bytes:
    return raw(0x40, pid.to_bytes(2, "big"))


_OTHER = [
    raw(0x40, b"\x00\x07\x10"),  # v5: with a reason code (3.x: malformed)
    raw(0x40, b"\x00\x07\x00\x00"),  # v5: reason code and empty properties
    raw(0x40, b"\x00\x00"),  # packet id 0
    raw(0x41, b"\x00\x07"),  # reserved flags set
    raw(0x40, b"\x00"),  # too short
    raw(0xC0, b""),  # PINGREQ
    raw(0x32, b"\x00\x01a\x00\x09pay"),  # a PUBLISH between
]


@needs_c
@pytest.mark.parametrize("version", [4, 5])
def test_pubacks_decode_as_the_python_decoder_does(version: int) -> None:
    rng = random.Random(version)
    for _ in range(300):
        stream = b"".join(
            _puback(rng.randrange(1, 65536)) if rng.random() < 0.8 else rng.choice(_OTHER)
            for _ in range(rng.randrange(1, 40))
        )
        cuts = sorted(rng.sample(range(1, len(stream)), min(len(stream) - 1, rng.randrange(4))))
        chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
        fast, fast_err = feed_chunks(run_codec(version, True), chunks)
        slow, slow_err = feed_chunks(run_codec(version, False), chunks)
        assert flatten(fast) == slow
        assert fast_err == slow_err


@needs_c
def test_a_read_of_plain_pubacks_is_one_run() -> None:
    codec = run_codec(4, True)
    out = codec.feed(b"".join(_puback(pid) for pid in (1, 2, 65535, 300)))
    assert [type(p) for p in out] == [PubackRun]
    assert list(out[0]) == [1, 2, 65535, 300]
    # bytearray input and a start position inside the buffer
    assert publish_run.scan_pubacks(bytearray(b"xx" + _puback(9) + b"\x40"), 2) == ([9], 6)
    with pytest.raises(ValueError):
        publish_run.scan_pubacks(b"", 1)
    with pytest.raises(TypeError):
        publish_run.scan_pubacks(memoryview(b""), 0)
    for args in ((b"", -1), (b"", True), (b"", 0, 0), (b"",)):
        with pytest.raises((TypeError, ValueError)):
            publish_run.scan_pubacks(*args)


def test_without_the_extension_pubacks_are_packets(monkeypatch) -> None:
    monkeypatch.setattr("gateway.mqtt.codec.scan_pubacks", None)
    out = run_codec(4, True).feed(_puback(3) + _puback(4))
    assert out == [Puback(3), Puback(4)]


def test_a_subscriber_acking_in_one_write_gets_the_next_window() -> None:
    # Five in flight at most: the sixth and later messages go out only once the first
    # five are acknowledged, here by one write of five PUBACKs (one PubackRun).
    with GatewayServer(max_inflight_out=5) as gw:
        sub = _client(gw.port, "sub")
        sub.sendall(raw(0x82, b"\x00\x01\x00\x03a/b\x01"))  # SUBSCRIBE a/b QoS 1
        codec = MqttCodec(protocol_version=4, role="client")
        codec.feed(_read(sub, lambda buf: len(buf) >= 5))  # SUBACK
        pub = _client(gw.port, "pub")
        pub.sendall(b"".join(raw(0x32, b"\x00\x03a/b\x00" + bytes([i + 1, i])) for i in range(10)))
        got: list[Publish] = []
        for want in (5, 10):
            while len(got) < want:
                got += [p for p in codec.feed(_read(sub, len)) if type(p) is Publish]
            assert len(got) == want
            sub.sendall(b"".join(_puback(p.packet_id) for p in got[want - 5:]))
        assert [p.payload for p in got] == [bytes([i]) for i in range(10)]
        sub.close()
        pub.close()


def _client(port: int, cid: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    sock.sendall(MqttCodec(protocol_version=4, role="client").encode(Connect(cid, 4)))
    assert _read(sock, lambda buf: len(buf) >= 4)[:2] == b"\x20\x02"
    return sock


def _read(sock: socket.socket, done) -> bytes:
    buf = b""
    while not done(buf):
        chunk = sock.recv(65536)
        assert chunk, "connection closed"
        buf += chunk
    return buf
