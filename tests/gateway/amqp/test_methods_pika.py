"""Every method and the basic properties, encoded by us and decoded by pika.spec, and the
reverse, with field values drawn by hypothesis."""

from __future__ import annotations

import pika.frame
import pika.spec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.amqp.codec import (
    AmqpDecoder,
    Content,
    MethodFrame,
    encode_content,
    encode_deliver,
    encode_method_frame,
)
from gateway.amqp.errors import NOT_IMPLEMENTED, AmqpError
from gateway.amqp.methods import METHODS, BasicDeliver, BasicPublish, decode_method
from gateway.amqp.properties import BasicProperties, decode_properties, encode_properties
from tests.gateway.amqp.strategies import method_args, normalize, shortstr, tables

CHECK = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ALL = sorted(METHODS.items())
IDS = [cls.NAME for _, cls in ALL]


def _pika_cls(class_id: int, method_id: int):
    return pika.spec.methods[class_id << 16 | method_id]


def _pika_name(name: str) -> str:
    return "type" if name == "exchange_type" else name


def test_same_methods_as_pika():
    ours = {(c << 16) | m for c, m in METHODS}
    assert ours == set(pika.spec.methods)
    for (class_id, method_id), cls in METHODS.items():
        theirs = _pika_cls(class_id, method_id)
        assert cls.NAME.replace("-", "") == theirs.NAME.lower()
        assert cls.HAS_CONTENT == (theirs.INDEX in (
            pika.spec.Basic.Publish.INDEX, pika.spec.Basic.Return.INDEX,
            pika.spec.Basic.Deliver.INDEX, pika.spec.Basic.GetOk.INDEX))


@pytest.mark.parametrize(("ids", "cls"), ALL, ids=IDS)
@CHECK
@given(data=st.data())
def test_ours_to_pika(ids, cls, data):
    args = data.draw(method_args(cls))
    payload = cls(**args).encode()
    pika_cls = _pika_cls(*ids)
    theirs = pika_cls.__new__(pika_cls)  # some pika classes require arguments
    theirs.decode(payload[4:])
    for name, value in args.items():
        attr = _pika_name(name)
        if cls.NAME == "connection.update-secret" and name == "new_secret":
            attr = "mechanisms"  # pika's decoder stores it under this name
        assert normalize(getattr(theirs, attr)) == normalize(value), name


@pytest.mark.parametrize(("ids", "cls"), ALL, ids=IDS)
@CHECK
@given(data=st.data())
def test_pika_to_ours(ids, cls, data):
    args = data.draw(method_args(cls))
    pika_args = {_pika_name(n): v for n, v in args.items()}
    theirs = _pika_cls(*ids)(**pika_args)
    payload = ids[0].to_bytes(2, "big") + ids[1].to_bytes(2, "big") + b"".join(theirs.encode())
    ours = decode_method(payload)
    assert type(ours) is cls
    for name, value in args.items():
        got = getattr(ours, name)
        if cls.FIELDS[cls._fields.index(name)][1] == "T" and not value:
            assert got == {}
        else:
            assert normalize(got) == normalize(value), name


properties = st.builds(
    BasicProperties,
    content_type=st.none() | shortstr,
    content_encoding=st.none() | shortstr,
    headers=st.none() | tables,
    delivery_mode=st.none() | st.sampled_from([1, 2]),
    priority=st.none() | st.integers(0, 255),
    correlation_id=st.none() | shortstr,
    reply_to=st.none() | shortstr,
    expiration=st.none() | st.integers(0, 10**9).map(str),
    message_id=st.none() | shortstr,
    timestamp=st.none() | st.integers(0, 2**40),
    type=st.none() | shortstr,
    user_id=st.none() | shortstr,
    app_id=st.none() | shortstr,
    cluster_id=st.none() | shortstr,
)


@settings(max_examples=100, deadline=None)
@given(props=properties)
def test_properties_both_ways(props):
    raw = encode_properties(props)
    theirs = pika.spec.BasicProperties()
    theirs.decode(raw)
    for name, value in props._asdict().items():
        assert normalize(getattr(theirs, name)) == normalize(value), name
    assert b"".join(theirs.encode()) == raw or decode_properties(b"".join(theirs.encode())) == \
        decode_properties(raw)
    back = decode_properties(b"".join(theirs.encode()))
    assert normalize(list(back)) == normalize(list(props))


def _pika_frames(data: bytes) -> list:
    frames, off = [], 0
    while off < len(data):
        used, frame = pika.frame.decode_frame(data[off:])
        assert frame is not None
        frames.append(frame)
        off += used
    return frames


@settings(max_examples=50, deadline=None)
@given(body=st.binary(max_size=20000), props=properties, tag=st.integers(1, 2**64 - 1),
       redelivered=st.booleans(), key=shortstr)
def test_deliver_fast_path_read_by_pika(body, props, tag, redelivered, key):
    data = encode_deliver(3, "ctag", tag, redelivered, "amq.topic", key,
                          encode_properties(props), body, 4096)
    frames = _pika_frames(data)
    deliver = frames[0].method
    assert isinstance(deliver, pika.spec.Basic.Deliver)
    assert (deliver.consumer_tag, deliver.delivery_tag, deliver.redelivered,
            deliver.exchange, deliver.routing_key) == ("ctag", tag, redelivered, "amq.topic", key)
    assert frames[1].body_size == len(body)
    assert all(f.channel_number == 3 for f in frames)
    assert all(len(f.marshal()) <= 4096 for f in frames)
    assert b"".join(f.fragment for f in frames[2:]) == body
    # Same bytes as the generic path.
    generic = encode_content(3, BasicDeliver("ctag", tag, redelivered, "amq.topic", key),
                             props, body, 4096)
    assert generic == data


@settings(max_examples=50, deadline=None)
@given(body=st.binary(max_size=20000), props=properties, key=shortstr,
       mandatory=st.booleans(), split=st.integers(1, 5000))
def test_pika_publish_read_by_us(body, props, key, mandatory, split):
    publish = pika.spec.Basic.Publish(exchange="ex", routing_key=key, mandatory=mandatory)
    pprops = pika.spec.BasicProperties(**props._asdict())
    frame_max = 4096
    data = pika.frame.Method(5, publish).marshal()
    data += pika.frame.Header(5, len(body), pprops).marshal()
    for start in range(0, len(body), frame_max - 8):
        data += pika.frame.Body(5, body[start:start + frame_max - 8]).marshal()
    data += pika.frame.Method(0, pika.spec.Connection.CloseOk()).marshal()
    decoder = AmqpDecoder(role="client", frame_max=frame_max)
    events = []
    for start in range(0, len(data), split):
        events += decoder.feed(data[start:start + split])
    content, close_ok = events
    assert isinstance(content, Content) and isinstance(close_ok, MethodFrame)
    assert content.method == BasicPublish(0, "ex", key, mandatory, False)
    assert content.body == body
    assert normalize(list(content.properties)) == normalize(list(props))


def test_unknown_method_is_540():
    with pytest.raises(AmqpError) as info:
        decode_method(b"\x00\x3c\x00\x63")
    assert info.value.reply_code == NOT_IMPLEMENTED


def test_method_frame_read_by_pika():
    frame = encode_method_frame(7, METHODS[(20, 40)](404, "NOT_FOUND - no queue", 50, 10))
    (parsed,) = _pika_frames(frame)
    assert parsed.channel_number == 7
    assert parsed.method.reply_code == 404 and parsed.method.method_id == 10
