"""Frame decoder behaviour: protocol header, limits, frame sequencing and the reply codes."""

from __future__ import annotations

import struct
from decimal import Decimal

import pytest

from gateway.amqp import errors
from gateway.amqp.codec import (
    FRAME_MIN_SIZE,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    AmqpDecoder,
    ChannelFault,
    Content,
    Heartbeat,
    MethodFrame,
    ProtocolHeader,
    encode_content,
    encode_method_frame,
)
from gateway.amqp.errors import AmqpError, BadProtocolHeader
from gateway.amqp.fields import MAX_TABLE_DEPTH, Timestamp, decode_table, encode_table
from gateway.amqp.methods import BasicAck, BasicPublish, ChannelOpen, QueueDeclare
from gateway.amqp.properties import BasicProperties, decode_properties


def frame(kind: int, channel: int, payload: bytes, end: bytes = b"\xce") -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + end


def header_frame(channel: int, size: int, class_id: int = 60) -> bytes:
    return frame(2, channel, struct.pack(">HHQ", class_id, 0, size) + b"\x00\x00")


PUBLISH = BasicPublish(exchange="", routing_key="q")


def server() -> AmqpDecoder:
    decoder = AmqpDecoder()
    assert decoder.feed(PROTOCOL_HEADER) == [ProtocolHeader()]
    return decoder


def fault(decoder: AmqpDecoder, data: bytes) -> AmqpError:
    with pytest.raises(AmqpError) as info:
        decoder.feed(data)
    return info.value


# ---------------------------------------------------------------- protocol header


@pytest.mark.parametrize("wrong", [b"AMQP\x00\x00\x09\x00", b"AMQP\x01\x01\x00\x09",
                                   b"GET / HTTP/1.1\r\n", b"\x10\x0c\x00\x04MQTT"])
def test_wrong_protocol_header_is_answered_with_ours(wrong):
    error = fault(AmqpDecoder(), wrong)
    assert isinstance(error, BadProtocolHeader)
    assert error.reply == b"AMQP\x00\x00\x09\x01"


def test_protocol_header_in_pieces_then_frames():
    decoder = AmqpDecoder()
    assert decoder.feed(b"AMQ") == []
    assert decoder.feed(b"P\x00\x00") == []
    events = decoder.feed(b"\x09\x01" + HEARTBEAT_FRAME)
    assert events == [ProtocolHeader(), Heartbeat()]


def test_client_role_starts_with_frames():
    assert AmqpDecoder(role="client").feed(HEARTBEAT_FRAME) == [Heartbeat()]


# ---------------------------------------------------------------- frame limits


def test_frame_over_frame_max_refused_from_its_header_alone():
    decoder = server()
    # Only the 7-octet frame header: the size is refused before any payload is buffered.
    # (RabbitMQ and we tolerate 8 octets too many: a payload of frame_max is the largest.)
    error = fault(decoder, struct.pack(">BHI", 1, 1, FRAME_MIN_SIZE + 1))
    assert error.reply_code == errors.FRAME_ERROR
    assert decoder.buffered == 0


def test_frame_max_with_rabbitmqs_tolerance_and_limit_raised_after_tune():
    decoder = server()
    big = QueueDeclare(queue="q", arguments={"x": b"a" * 5000})
    data = encode_method_frame(1, big)
    assert fault(decoder, data).reply_code == errors.FRAME_ERROR
    decoder = server()
    decoder.frame_max = len(data)
    assert decoder.feed(data) == [MethodFrame(1, big)]
    decoder.frame_max = len(data) - 8  # 8 octets over: tolerated
    assert decoder.feed(data) == [MethodFrame(1, big)]
    decoder.frame_max = len(data) - 9
    assert fault(decoder, data).reply_code == errors.FRAME_ERROR


def test_bad_frame_end_octet():
    data = frame(1, 1, ChannelOpen().encode(), end=b"\xcd")
    assert fault(server(), data).reply_code == errors.FRAME_ERROR


def test_unknown_frame_type():
    assert fault(server(), frame(4, 0, b"")).reply_code == errors.FRAME_ERROR


@pytest.mark.parametrize("data", [frame(8, 1, b""), frame(8, 0, b"x")])
def test_heartbeat_must_be_empty_on_channel_zero(data):
    assert fault(server(), data).reply_code == errors.FRAME_ERROR


def test_decoder_stays_failed():
    decoder = server()
    first = fault(decoder, frame(9, 0, b""))
    assert fault(decoder, HEARTBEAT_FRAME) is first


# ---------------------------------------------------------------- content sequencing


def test_content_assembled_from_frames_fed_one_octet_at_a_time():
    body = bytes(range(256)) * 40
    props = BasicProperties(content_type="text/plain", delivery_mode=2, headers={"k": "v"})
    data = encode_content(1, PUBLISH, props, body, FRAME_MIN_SIZE)
    decoder = server()
    events = []
    for i in range(len(data)):
        events += decoder.feed(data[i:i + 1])
    (content,) = events
    assert content.method == PUBLISH and content.body == body
    assert content.properties == props
    assert decode_properties(content.raw_properties) == props
    assert decoder.buffered == 0


def test_empty_body_completes_at_the_header():
    data = encode_method_frame(1, PUBLISH) + header_frame(1, 0)
    (content,) = server().feed(data)
    assert content == Content(1, PUBLISH, BasicProperties(), b"\x00\x00", b"")


def test_contents_of_two_channels_may_interleave():
    a = encode_content(1, PUBLISH, BasicProperties(), b"a" * 6000)
    b = encode_content(2, PUBLISH, BasicProperties(), b"b" * 10)
    a_frames, b_frames = _split_frames(a), _split_frames(b)
    data = a_frames[0] + a_frames[1] + a_frames[2] + b"".join(b_frames) + a_frames[3]
    events = server().feed(data)
    assert [(e.channel, e.body[:1], len(e.body)) for e in events] == [(2, b"b", 10),
                                                                       (1, b"a", 6000)]


def _split_frames(data: bytes) -> list[bytes]:
    out, off = [], 0
    while off < len(data):
        size = struct.unpack_from(">I", data, off + 3)[0]
        out.append(data[off:off + size + 8])
        off += size + 8
    return out


@pytest.mark.parametrize("data", [
    frame(3, 1, b"x"),                                                  # body without header
    header_frame(1, 1),                                                 # header without method
    encode_method_frame(1, PUBLISH) + encode_method_frame(1, ChannelOpen()),  # method mid-content
    encode_method_frame(1, PUBLISH) + header_frame(1, 5) + header_frame(1, 5),
    encode_method_frame(1, PUBLISH) + header_frame(1, 2) + frame(3, 1, b"xyz"),  # body too long
    encode_method_frame(1, PUBLISH) + header_frame(1, 2, class_id=50),
    encode_method_frame(0, PUBLISH),                                    # content on channel 0
])
def test_out_of_sequence_content_frames_are_505(data):
    assert fault(server(), data).reply_code == errors.UNEXPECTED_FRAME


def test_message_over_max_message_size_closes_only_its_channel():
    decoder = AmqpDecoder(max_message_size=100)
    decoder.feed(PROTOCOL_HEADER)
    big = encode_content(1, PUBLISH, BasicProperties(), b"x" * 101)
    small = encode_content(2, PUBLISH, BasicProperties(), b"y" * 100)
    after = encode_method_frame(1, BasicAck(1))
    events = decoder.feed(big + small + after)
    assert isinstance(events[0], ChannelFault)
    assert events[0].channel == 1
    assert events[0].error.reply_code == errors.PRECONDITION_FAILED
    assert not events[0].error.connection_level
    assert events[1].channel == 2 and events[1].body == b"y" * 100
    assert events[2] == MethodFrame(1, BasicAck(1))


def test_partial_bodies_of_all_channels_are_bounded():
    decoder = AmqpDecoder(frame_max=FRAME_MIN_SIZE, max_buffered_content=10_000)
    decoder.feed(PROTOCOL_HEADER)
    data = b"".join(
        encode_method_frame(ch, PUBLISH) + header_frame(ch, 1_000_000) + frame(3, ch, b"z" * 4000)
        for ch in (1, 2, 3)
    )
    assert fault(decoder, data).reply_code == errors.RESOURCE_ERROR


# ---------------------------------------------------------------- method and field syntax


def test_truncated_method_is_502_naming_the_method():
    payload = QueueDeclare(queue="abc").encode()[:-3]
    error = fault(server(), frame(1, 1, payload))
    assert (error.reply_code, error.class_id, error.method_id) == (errors.SYNTAX_ERROR, 50, 10)


def test_octets_after_method_fields_are_502():
    error = fault(server(), frame(1, 1, BasicAck(1).encode() + b"\x00"))
    assert error.reply_code == errors.SYNTAX_ERROR


def test_unknown_method_is_540():
    error = fault(server(), frame(1, 1, b"\x00\x3c\x03\xe7"))
    assert error.reply_code == errors.NOT_IMPLEMENTED


def test_unknown_property_flag_is_502():
    # Bit 0 (another flag word) and bit 1 (a 15th property) do not exist for basic.
    for flags in (b"\x00\x01", b"\x00\x02"):
        data = encode_method_frame(1, PUBLISH) + frame(2, 1, struct.pack(">HHQ", 60, 0, 0) + flags)
        assert fault(server(), data).reply_code == errors.SYNTAX_ERROR


def _table(entries: bytes) -> bytes:
    return struct.pack(">I", len(entries)) + entries


def test_every_rabbitmq_field_type_decodes():
    # Built by hand from the type list, not with our encoder.
    entries = b"".join([
        b"\x01tt\x01", b"\x01bb\xff", b"\x01BB\xff", b"\x01ss\xff\xfe", b"\x01uu\xff\xfe",
        b"\x01II\xff\xff\xff\xfd", b"\x01ii\xff\xff\xff\xfd",
        b"\x01ll" + struct.pack(">q", -(2**40)), b"\x01ff" + struct.pack(">f", 1.5),
        b"\x01dd" + struct.pack(">d", -2.25), b"\x01DD\x02" + struct.pack(">i", -12345),
        b"\x01SS\x00\x00\x00\x02h\xc3", b"\x01xx\x00\x00\x00\x01\x00",
        b"\x01AA" + struct.pack(">I", 7) + b"V" + b"I\x00\x00\x00\x07" + b"V"[:0] + b"V",
        b"\x01TT" + struct.pack(">Q", 1_700_000_000), b"\x01FF" + _table(b"\x01kV"),
        b"\x01VV",
    ])
    table, end = decode_table(_table(entries), 0)
    assert end == len(entries) + 4
    assert table == {
        "t": True, "b": -1, "B": 255, "s": -2, "u": 65534, "I": -3, "i": 2**32 - 3,
        "l": -(2**40), "f": 1.5, "d": -2.25, "D": Decimal("-123.45"),
        "S": "h\udcc3", "x": b"\x00", "A": [None, 7, None], "T": 1_700_000_000,
        "F": {"k": None}, "V": None,
    }
    assert isinstance(table["T"], Timestamp)
    # Everything but integer widths and floats' width survives re-encoding exactly.
    assert decode_table(encode_table(table), 0)[0] == table


@pytest.mark.parametrize("raw", [
    _table(b"\x01kZ"),                        # unknown type
    _table(b"\x01kI\x00\x00"),                # truncated int
    struct.pack(">I", 100) + b"\x01kV",       # table longer than its buffer
    _table(b"\x01kS\x00\x00\x00\x09abc"),     # string past the table's end
    _table(b"\x05k"),                         # name past the end
    _table(b"\x01kA\x00\x00\x00\x02I\x00"),   # array item past the array
])
def test_malformed_tables_are_502(raw):
    with pytest.raises(AmqpError) as info:
        decode_table(raw, 0)
    assert info.value.reply_code == errors.SYNTAX_ERROR


def test_deep_nesting_is_502_not_a_crash():
    depth = MAX_TABLE_DEPTH + 5
    inner = b""
    for _ in range(depth):
        inner = _table(b"\x01kF" + (inner or _table(b"")))
    with pytest.raises(AmqpError) as info:
        decode_table(inner, 0)
    assert info.value.reply_code == errors.SYNTAX_ERROR
    # And within the limit it decodes.
    ok = b""
    for _ in range(MAX_TABLE_DEPTH - 1):
        ok = _table(b"\x01kF" + (ok or _table(b"")))
    decode_table(ok, 0)


# ---------------------------------------------------------------- encoding validation


@pytest.mark.parametrize("method", [
    QueueDeclare(queue="q" * 256),
    BasicAck(delivery_tag=2**64),
    BasicAck(delivery_tag=-1),
    QueueDeclare(arguments={"x-max-length": 2**63}),
    QueueDeclare(arguments={"x": object()}),
])
def test_values_the_wire_cannot_carry_raise_value_error(method):
    with pytest.raises(ValueError):
        method.encode()


def test_content_frames_respect_frame_max():
    data = encode_content(1, PUBLISH, BasicProperties(), b"q" * 10_000, frame_max=5000)
    sizes = [len(f) for f in _split_frames(data)]
    assert max(sizes) == 5000 and sum(sizes[2:]) == 10_000 + 8 * (len(sizes) - 2)
    with pytest.raises(ValueError):
        encode_content(1, PUBLISH, BasicProperties(), b"", frame_max=FRAME_MIN_SIZE - 1)


def test_repeated_properties_decode_alike_and_headers_are_never_shared():
    plain = BasicProperties(content_type="text/plain", delivery_mode=2)
    raw = encode_content(1, PUBLISH, plain, b"")
    first, second = server().feed(raw)[0], server().feed(raw)[0]
    assert first.properties == second.properties == plain
    with_headers = encode_content(1, PUBLISH, BasicProperties(headers={"a": 1}), b"")
    one, two = server().feed(with_headers)[0], server().feed(with_headers)[0]
    one.properties.headers["a"] = 2
    assert two.properties.headers == {"a": 1}
    # A bad property list is refused every time, not only the first.
    bad = encode_method_frame(1, PUBLISH) + frame(2, 1, struct.pack(">HHQ", 60, 0, 0) + b"\x80\x00")
    for _ in range(2):
        assert fault(server(), bad).reply_code == errors.SYNTAX_ERROR
