"""The publish scanner (gateway/amqp/publish_scan.py): the C `scan_amqp_publishes` against
its Python reference on random, cut and mutated streams (the same run and position, or
the same error), and the decoder with either scanner against the frame-by-frame path."""

from __future__ import annotations

import random
import struct

import pytest

from gateway.amqp import codec
from gateway.amqp.codec import PROTOCOL_HEADER, AmqpDecoder, Content, encode_content
from gateway.amqp.errors import AmqpError
from gateway.amqp.methods import BasicAck, BasicPublish
from gateway.amqp.properties import BasicProperties, decode_properties, encode_properties
from gateway.amqp.publish_scan import scan_publishes_py
from tests.gateway.amqp.test_codec_fuzz import _frame

try:
    from core._speedups import scan_amqp_publishes
except ImportError:  # the extension is not built: the reference is all there is
    scan_amqp_publishes = None

needs_c = pytest.mark.skipif(scan_amqp_publishes is None, reason="no C extension")

FRAME_MAX = 4096
LIMIT = FRAME_MAX - 8 + 8
MAX_MESSAGE = 6000
PROPS = [BasicProperties(), BasicProperties(delivery_mode=2),
         BasicProperties(content_type="text/plain", delivery_mode=1),
         BasicProperties(headers={"h": 1}), BasicProperties(correlation_id="c" * 90)]
RAWS = [encode_properties(p) for p in PROPS]


def _memo() -> dict:
    """Properties the decoder would have remembered: all but the ones with headers."""
    return {raw: decode_properties(raw) for raw in RAWS if raw[0] & 0x20 == 0}


def _publish(rng: random.Random, channel: int) -> bytes:
    body = rng.randbytes(rng.choice([0, 0, 1, 100, 1024, FRAME_MAX - 8, FRAME_MAX, 7000]))
    method = BasicPublish(rng.randrange(3), rng.choice(["", "amq.topic", "é.x"]),
                          rng.choice(["k", "", "a.b" * 40, "\u00ff"]),
                          rng.random() < 0.3, rng.random() < 0.1)
    return encode_content(channel, method, rng.choice(PROPS), body, FRAME_MAX)


def _stream(rng: random.Random) -> list[bytes]:
    parts = []
    for _ in range(rng.randrange(1, 12)):
        what = rng.randrange(10)
        ch = rng.choice([1, 1, 2, 3, 0])
        if what < 7:
            parts.append(_publish(rng, ch))
        elif what == 7:
            parts.append(_frame(1, ch, BasicAck(rng.randrange(9), False).encode()))
        elif what == 8:  # a header of another class or a short one after a publish
            parts.append(_frame(1, ch, BasicPublish(routing_key="k").encode()) + _frame(
                2, ch, struct.pack(">HHQ", rng.choice([50, 60]), 0, rng.randrange(3)) +
                b"\x00\x00"[:rng.randrange(3)]) + _frame(3, ch, b"z"))
        else:  # a complete publish with a method too long, cut short or badly ended,
            # or a header badly ended
            whole = _publish(rng, ch)
            size = struct.unpack_from(">I", whole, 3)[0]
            method, rest = whole[7:7 + size], whole[8 + size:]
            how = rng.randrange(4)
            if how == 3:  # the content header's end octet
                hsize = struct.unpack_from(">I", rest, 3)[0]
                rest = rest[:7 + hsize] + bytes([rng.choice([0, 0xCD])]) + rest[8 + hsize:]
            if how == 0:
                method += b"\x00"
            elif how == 1:
                method = method[:rng.randrange(len(method))]
            frame = _frame(1, ch, method)
            if how == 2:
                frame = frame[:-1] + bytes([rng.choice([0, 0xCD, 0xCF])])
            parts.append(frame + rest)
    return parts


def _mutate(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randrange(4)):
        if not data:
            break
        i = rng.randrange(len(data))
        op = rng.randrange(3)
        if op == 0:
            data[i] = rng.randrange(256)
        elif op == 1:
            del data[i]
        else:
            data.insert(i, rng.choice([0, 1, 2, 3, 0x28, 0x3C, 0xCE, 0xFF]))
    if rng.random() < 0.3:
        data = data[:rng.randrange(len(data) + 1)]
    return bytes(data)


def _scan(fn, buf, pos, pending, memo) -> tuple:
    try:
        return fn(buf, pos, LIMIT, MAX_MESSAGE, pending, memo, Content, BasicPublish)
    except Exception as exc:  # noqa: BLE001 - compared, not hidden
        return type(exc).__name__


@needs_c
@pytest.mark.parametrize("seed", range(300))
def test_c_and_python_scan_alike(seed):
    rng = random.Random(seed)
    parts = _stream(rng)
    data = b"".join(parts)
    if seed % 2:
        data = _mutate(rng, data)
    buf = bytearray(data) if seed % 5 == 0 else data
    memo = _memo() if seed % 7 else {}
    pending = {rng.choice([1, 2, 3]): None} if seed % 4 == 0 else {}
    starts = {sum(map(len, parts[:i])) for i in range(len(parts))}  # every part's start
    for pos in sorted({p for p in starts if p <= len(data)} | {rng.randrange(len(data) + 1)}):
        c, py = _scan(scan_amqp_publishes, buf, pos, pending, memo), \
            _scan(scan_publishes_py, buf, pos, pending, memo)
        assert c == py
        if isinstance(c, tuple):
            for a, b in zip(c[0], py[0], strict=True):  # the same types all the way down
                assert type(a) is type(b) is Content and type(a.method) is BasicPublish
                assert [type(v) for v in a.method] == [type(v) for v in b.method]


def test_scan_takes_a_run_and_stops_at_anything_else():
    memo = _memo()
    pubs = [encode_content(1, BasicPublish(exchange="x", routing_key=f"k{i}"), PROPS[1],
                           bytes([i]) * i, FRAME_MAX) for i in range(3)]
    ack = _frame(1, 1, BasicAck(1, False).encode())
    data = b"".join(pubs) + ack + pubs[0]
    run, pos = scan_publishes_py(data, 0, LIMIT, MAX_MESSAGE, {}, memo, Content,
                                 BasicPublish)
    assert [(e.method.routing_key, e.body) for e in run] == [(f"k{i}", bytes([i]) * i)
                                                             for i in range(3)]
    assert data[pos:] == ack + pubs[0]
    # A channel with a content under way, unknown properties, a body over two frames, a
    # content cut short: nothing taken.
    assert scan_publishes_py(data, 0, LIMIT, MAX_MESSAGE, {1: None}, memo, Content,
                             BasicPublish) == ([], 0)
    assert scan_publishes_py(data, 0, LIMIT, MAX_MESSAGE, {}, {}, Content,
                             BasicPublish) == ([], 0)
    big = encode_content(1, BasicPublish(), PROPS[0], b"x" * 5000, FRAME_MAX)
    assert scan_publishes_py(big, 0, LIMIT, MAX_MESSAGE, {}, memo, Content,
                             BasicPublish) == ([], 0)
    assert scan_publishes_py(pubs[2][:-1], 0, LIMIT, MAX_MESSAGE, {}, memo, Content,
                             BasicPublish) == ([], 0)


@needs_c
def test_c_scan_refuses_bad_arguments():
    for args in ((b"", 1, LIMIT, MAX_MESSAGE, {}, {}, Content, BasicPublish),
                 (b"", -1, LIMIT, MAX_MESSAGE, {}, {}, Content, BasicPublish),
                 ("x", 0, LIMIT, MAX_MESSAGE, {}, {}, Content, BasicPublish),
                 (b"", 0, LIMIT, MAX_MESSAGE, {}, {}, dict, BasicPublish),
                 (b"", 0, LIMIT, MAX_MESSAGE, [], {}, Content, BasicPublish)):
        with pytest.raises((TypeError, ValueError)):
            scan_amqp_publishes(*args)
    with pytest.raises(ValueError):
        scan_publishes_py(b"", 1, LIMIT, MAX_MESSAGE, {}, {}, Content, BasicPublish)


def _decode(data: bytes, step: int | None) -> tuple[list, str]:
    decoder = AmqpDecoder(frame_max=FRAME_MAX, max_message_size=MAX_MESSAGE)
    events: list = []
    try:
        for i in range(0, len(data), step or len(data) or 1):
            events += decoder.feed(data[i:i + (step or len(data))])
    except AmqpError as exc:
        return [], f"{exc.reply_code} {exc.text}"
    return [(e.channel, e.error.reply_code) if hasattr(e, "error") else e for e in events], ""


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("scanner", ["c", "python"])
def test_decoder_with_either_scanner_matches_the_frame_path(seed, scanner, monkeypatch):
    if scanner == "c":
        if scan_amqp_publishes is None:
            pytest.skip("no C extension")
        monkeypatch.setattr(codec, "scan_publishes", scan_amqp_publishes)
    else:
        monkeypatch.setattr(codec, "scan_publishes", scan_publishes_py)
    rng = random.Random(1000 + seed)
    data = PROTOCOL_HEADER + b"".join(_publish(rng, rng.choice([1, 2]))
                                      for _ in range(rng.randrange(1, 9)))
    if seed % 2:
        data = PROTOCOL_HEADER + _mutate(rng, data[8:])
    assert _decode(data, None) == _decode(data, 1)


def test_basic_ack_decoded_without_the_method_table_alike():
    """The decoder reads a consumer's Basic.Ack (13 octets) itself; any tag and bit octet
    decode as the method table decodes them, and other lengths still go that way."""
    from gateway.amqp.codec import MethodFrame
    from gateway.amqp.methods import decode_method

    rng = random.Random(5)
    for _ in range(500):
        payload = struct.pack(">HHQB", 60, 80, rng.getrandbits(64), rng.randrange(256))
        payload = payload + b"\x00" * rng.choice([0, 0, 0, 1])  # too long: 502 both ways
        decoder = AmqpDecoder(role="client", frame_max=FRAME_MAX)
        try:
            expected = [MethodFrame(1, decode_method(payload))]
        except AmqpError as exc:
            with pytest.raises(AmqpError) as got:
                decoder.feed(_frame(1, 1, payload))
            assert got.value.reply_code == exc.reply_code
            continue
        events = decoder.feed(_frame(1, 1, payload))
        assert events == expected and type(events[0].method) is BasicAck
