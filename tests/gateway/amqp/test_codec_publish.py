"""The decoder's one-step publish (method, header and body frames found together) against
its frame-by-frame path: a stream decoded whole and the same stream fed one octet at a
time (which never holds the three frames at once) give the same events, or the same error."""

from __future__ import annotations

import random
import struct

import pytest

from gateway.amqp.codec import (
    PROTOCOL_HEADER,
    AmqpDecoder,
    ChannelFault,
    Content,
    encode_content,
)
from gateway.amqp.errors import AmqpError
from gateway.amqp.methods import BasicPublish
from gateway.amqp.properties import BasicProperties
from tests.gateway.amqp.test_codec_fuzz import _frame

FRAME_MAX = 4096
MAX_MESSAGE = 6000


def _outcome(data: bytes, step: int | None) -> tuple[list, str]:
    decoder = AmqpDecoder(frame_max=FRAME_MAX, max_message_size=MAX_MESSAGE)
    events: list = []
    try:
        if step is None:
            events += decoder.feed(data)
        else:
            for i in range(0, len(data), step):
                events += decoder.feed(data[i:i + step])
    except AmqpError as exc:
        return _plain(events), f"{exc.reply_code} {exc.text}"
    return _plain(events), ""


def _plain(events: list) -> list:
    """Events with their errors as text (errors do not compare equal)."""
    return [(e.channel, e.error.reply_code, e.error.text) if type(e) is ChannelFault else e
            for e in events]


def _part(rng: random.Random) -> bytes:
    ch = rng.randrange(4)  # channel 0 too: refused, by either path
    what = rng.randrange(7)
    if what <= 3:
        props = BasicProperties(content_type=rng.choice([None, "text/plain"]),
                                delivery_mode=rng.choice([None, 2]),
                                headers=rng.choice([None, {"h": rng.randrange(9)}]))
        body = rng.randbytes(rng.choice([0, 1, 100, FRAME_MAX - 8, FRAME_MAX, 7000]))
        return encode_content(ch, BasicPublish(exchange="x", routing_key="k"), props, body,
                              FRAME_MAX)
    if what == 4:  # a publish whose content header has the wrong class or a short body
        return _frame(1, ch, BasicPublish(routing_key="k").encode()) + \
            _frame(2, ch, struct.pack(">HHQ", rng.choice([50, 60]), 0,
                                      rng.randrange(3)) + b"\x00\x00") + _frame(3, ch, b"z")
    if what == 5:
        return _frame(3, ch, rng.randbytes(rng.randrange(5)))
    return _frame(1, ch, struct.pack(">HHQB", 60, 80, rng.randrange(99), 0))  # basic.ack


@pytest.mark.parametrize("seed", range(40))
def test_publishes_decoded_whole_or_trickled_alike(seed):
    rng = random.Random(seed)
    data = PROTOCOL_HEADER + b"".join(_part(rng) for _ in range(rng.randrange(1, 6)))
    if seed % 3 == 0:
        data = data[:rng.randrange(8, len(data) + 1)]  # cut anywhere
    whole, trickled = _outcome(data, None), _outcome(data, 1)
    assert whole[1] == trickled[1]  # the same error (or none)
    if not whole[1]:  # (a failed feed returns nothing: only complete runs compare events)
        assert whole[0] == trickled[0]


def test_valid_publishes_come_out_whole_in_order():
    rng = random.Random(7)
    bodies = [rng.randbytes(n) for n in (0, 1, 5000, FRAME_MAX - 8, FRAME_MAX - 7)]
    data = PROTOCOL_HEADER + b"".join(
        encode_content(1 + i % 3, BasicPublish(routing_key=f"k{i}"), BasicProperties(), b,
                       FRAME_MAX) for i, b in enumerate(bodies))
    events, error = _outcome(data, None)
    assert not error and (events, error) == _outcome(data, 1)
    got = [(e.channel, e.method.routing_key, e.body) for e in events if type(e) is Content]
    assert got == [(1 + i % 3, f"k{i}", b) for i, b in enumerate(bodies)]
