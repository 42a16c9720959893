"""3.x PUBLISHes decoded in one C call (core/_speedups.c scan_publishes, codec
`publish_runs`): the same packets, in the same order, and the same faults as the Python
decoder, whatever the packets and however the bytes are split into reads."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.mqtt import publish_run
from gateway.mqtt.codec import PublishRun
from gateway.mqtt.packets import Pingreq, Puback, Publish
from gateway.mqtt.properties import encode_varint
from tests.gateway.mqtt.run_support import feed_chunks, flatten, raw, run_codec

pytestmark = pytest.mark.skipif(publish_run.scan_publishes is None,
                                reason="core._speedups not built")


def _publish(topic: bytes, payload: bytes, qos: int = 0, pid: int = 1, flags: int = 0) -> bytes:
    body = len(topic).to_bytes(2, "big") + topic + (pid.to_bytes(2, "big") if qos else b"")
    return raw(0x30 | (qos << 1) | flags, body + payload)


_GOOD = [
    lambda r: _publish(b"dev/" + str(r.randrange(3)).encode(), r.randbytes(r.randrange(0, 300)),
                       r.randrange(3), r.randrange(1, 65536), r.choice((0, 1))),
    lambda r: _publish("töpic/ü".encode(), b"p", 1, 7, 8),  # DUP on QoS 1, UTF-8 topic
    lambda r: raw(0xC0, b""),  # PINGREQ
    lambda r: raw(0x40, b"\x00\x05"),  # PUBACK
    lambda r: _publish(b"big", bytes(5000)),  # over max_packet_size: 0x95
]
_BAD = [
    _publish(b"a/+", b"x"), _publish(b"a/#", b"x"), _publish(b"a\x00b", b"x"),
    _publish(b"", b"x"), _publish(b"a", b"x", 1, 0), _publish(b"\xff\xfe", b"x"),
    _publish(b"a", b"x", flags=8),  # DUP on QoS 0
    bytes((0x36,)) + encode_varint(3) + b"\x00\x01a",  # QoS 3
    bytes((0x30, 3, 0x00, 0x05, 0x61)),  # topic longer than the packet
    bytes((0x32, 3, 0x00, 0x01, 0x61)),  # no room for the packet id
    bytes((0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01)),  # remaining length of 5 bytes
]


@pytest.mark.parametrize("version", [3, 4])
def test_runs_decode_what_the_python_decoder_decodes(version: int) -> None:
    rng = random.Random(version)
    for _ in range(300):
        stream = b"".join(rng.choice(_GOOD[:4])(rng) for _ in range(rng.randrange(1, 30)))
        if rng.random() < 0.4:
            stream += rng.choice([_GOOD[4](rng), *_BAD])
            stream += _publish(b"after", b"never decoded")
        cuts = sorted(rng.sample(range(1, len(stream)), min(len(stream) - 1, rng.randrange(0, 6))))
        chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
        if rng.random() < 0.3:
            chunks = [bytearray(c) for c in chunks]
        fast, fast_err = feed_chunks(run_codec(version, True), chunks)
        slow, slow_err = feed_chunks(run_codec(version, False), chunks)
        assert flatten(fast) == slow
        assert fast_err == slow_err
        assert all(type(p) in (Publish, Pingreq, Puback) for p in slow)


def test_a_read_of_publishes_is_one_run_sharing_its_topic() -> None:
    codec = run_codec(4, True)
    packets = codec.feed(b"".join(_publish(b"s/1", b"%d" % i, 1, i + 1) for i in range(50)))
    assert [type(p) for p in packets] == [PublishRun]
    [run] = packets
    assert len(run) == 50 and len({id(t[0]) for t in run}) == 1
    assert run[49] == ("s/1", b"49", 2, 50)


def test_v5_and_plain_codecs_give_publish_objects() -> None:
    codec = run_codec(5, True)
    assert [type(p) for p in codec.feed(raw(0x30, b"\x00\x01a\x00x") * 2)] == [Publish] * 2
    codec = run_codec(4, False)
    assert [type(p) for p in codec.feed(_publish(b"a", b"x") * 2)] == [Publish] * 2


def test_scan_publishes_refuses_bad_arguments() -> None:
    scan = publish_run.scan_publishes
    data = _publish(b"a", b"x")
    for args in ((memoryview(data), 0, 100), (data, -1, 100), (data, len(data) + 1, 100),
                 (data, True, 100), (data, 0, 1.5), (bytes, 0, 100)):
        with pytest.raises((TypeError, ValueError)):
            scan(*args)
    assert scan(data, len(data), 100) == ([], len(data))
    assert scan(data, 0, len(data) - 1) == ([], 0)  # over the limit: left to Python
    assert scan(data[:-1], 0, 100) == ([], 0)  # incomplete
    assert scan(bytearray(data * 2), 0, 100) == ([("a", b"x", 0, None)] * 2, 2 * len(data))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(
    st.binary(max_size=40),
    st.builds(lambda t, p, q, i, f: _publish(t, p, q, i, f), st.binary(max_size=6),
              st.binary(max_size=20), st.integers(0, 3), st.integers(0, 2), st.integers(0, 9)),
), max_size=12), st.integers(3, 4))
def test_any_bytes_decode_as_the_python_decoder_decodes(parts: list[bytes], version: int) -> None:
    data = b"".join(parts)
    fast, fast_err = feed_chunks(run_codec(version, True, 64), [data])
    slow, slow_err = feed_chunks(run_codec(version, False, 64), [data])
    assert flatten(fast) == slow and fast_err == slow_err
