"""Fuzz the frame decoder: random and mutated input gives only our protocol errors, never
another exception, and never more buffered state than the limits allow."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.amqp.codec import (
    FRAME_MIN_SIZE,
    FRAME_SIZE_TOLERANCE,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    AmqpDecoder,
    encode_content,
    encode_method_frame,
)
from gateway.amqp.errors import AmqpError
from gateway.amqp.methods import (
    METHODS,
    BasicAck,
    BasicConsume,
    BasicPublish,
    ConnectionStartOk,
    ExchangeDeclare,
    QueueDeclare,
)
from gateway.amqp.properties import BasicProperties

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MAX_BUFFERED = 20_000

VALID = b"".join([
    PROTOCOL_HEADER,
    encode_method_frame(0, ConnectionStartOk(client_properties={"product": "x", "n": [1, 2.5]},
                                             response=b"\x00guest\x00guest")),
    encode_method_frame(1, QueueDeclare(queue="q", durable=True,
                                        arguments={"x-max-length": 10, "d": {"e": None}})),
    encode_method_frame(1, ExchangeDeclare(exchange="e", exchange_type="topic")),
    encode_method_frame(1, BasicConsume(queue="q", consumer_tag="c")),
    encode_content(1, BasicPublish(exchange="e", routing_key="a.b"),
                   BasicProperties(content_type="t", headers={"h": b"v"}, timestamp=9),
                   b"x" * 9000),
    encode_content(2, BasicPublish(routing_key="q"), BasicProperties(), b""),
    HEARTBEAT_FRAME,
    encode_method_frame(1, BasicAck(delivery_tag=1, multiple=True)),
])


def run(data: bytes, splits: list[int]) -> None:
    decoder = AmqpDecoder(frame_max=FRAME_MIN_SIZE * 4, max_message_size=10_000,
                          max_buffered_content=MAX_BUFFERED)
    pos = 0
    cuts = sorted({min(s, len(data)) for s in splits}) + [len(data)]
    try:
        for cut in cuts:
            decoder.feed(data[pos:cut])
            pos = cut
            assert decoder.buffered <= decoder.frame_max + FRAME_SIZE_TOLERANCE + MAX_BUFFERED
    except AmqpError:
        pass


def test_valid_stream_decodes():
    decoder = AmqpDecoder(frame_max=FRAME_MIN_SIZE * 4)
    assert len(decoder.feed(VALID)) == 9


@FUZZ
@given(data=st.binary(max_size=3000), splits=st.lists(st.integers(0, 3000), max_size=8))
def test_random_frames(data, splits):
    run(PROTOCOL_HEADER + data, splits)


@FUZZ
@given(data=st.binary(max_size=200))
def test_random_from_the_first_octet(data):
    run(data, [])


@FUZZ
@given(
    edits=st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)),
                   min_size=1, max_size=6),
    cut=st.integers(0, len(VALID)),
    splits=st.lists(st.integers(0, len(VALID)), max_size=6),
)
def test_mutated_stream(edits, cut, splits):
    data = bytearray(VALID)
    for index, value in edits:
        data[index] = value
    run(bytes(data[:cut]) + bytes(data[cut + 1:]), splits)


def _frame(kind: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + b"\xce"


# Well-framed frames with a known method id (or a content header) and random fields, so the
# fuzzing reaches the field and table decoders rather than stopping at the frame layer.
framed = st.one_of(
    st.builds(lambda ids, ch, body: _frame(1, ch, struct.pack(">HH", *ids) + body),
              st.sampled_from(sorted(METHODS)), st.integers(0, 3), st.binary(max_size=60)),
    st.builds(lambda ch, size, body: _frame(2, ch, struct.pack(">HHQ", 60, 0, size) + body),
              st.integers(0, 3), st.integers(0, 20), st.binary(max_size=60)),
    st.builds(lambda ch, body: _frame(3, ch, body), st.integers(0, 3), st.binary(max_size=30)),
    st.builds(lambda body: _frame(1, 1, QueueDeclare(queue="q").encode()[:-4] + body),
              st.binary(max_size=80)),
)


@FUZZ
@given(frames=st.lists(framed, min_size=1, max_size=8),
       splits=st.lists(st.integers(0, 600), max_size=4))
def test_well_framed_random_fields(frames, splits):
    run(PROTOCOL_HEADER + b"".join(frames), splits)


@FUZZ
@given(
    chunk=st.integers(0, len(VALID) - 1),
    noise=st.binary(min_size=1, max_size=40),
)
def test_inserted_garbage(chunk, noise):
    run(VALID[:chunk] + noise + VALID[chunk:], [chunk])


@pytest.mark.timeout(60)
def test_frame_trickled_one_octet_at_a_time_costs_linear_time():
    # 1 MiB in single octets: re-parsing the partial frame on every octet would copy
    # ~5 * 10**11 octets and never finish; the decoder waits until the frame can be whole.
    size = 1024 * 1024
    data = encode_method_frame(1, QueueDeclare(queue="q", arguments={"x": b"a" * (size - 64)}))
    decoder = AmqpDecoder(frame_max=len(data))
    decoder.feed(PROTOCOL_HEADER)
    feed = decoder.feed
    events = []
    for i in range(len(data)):
        events += feed(data[i:i + 1])
    assert len(events) == 1 and len(events[0].method.arguments["x"]) == size - 64
