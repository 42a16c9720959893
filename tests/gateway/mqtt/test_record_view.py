"""The light read of stored records (core/store/record_view.py, message.from_record_view)
gives the same MQTT message as the full decode (decode_record + from_message_ext)."""

from __future__ import annotations

import zlib

import pytest

from core.common.codec import RecordError, decode_record, encode_host, encode_record
from core.common.properties import MessageConst, encode_properties
from core.common.sysflag import MessageSysFlag
from core.store.record_view import iter_record_views
from gateway.mqtt.message import MqttMessage, from_message_ext, from_record_view, to_properties
from gateway.mqtt.packets import Properties


def _record(msg: MqttMessage, clog: int, lmqs: dict[str, int], *, compress: bool = False,
            props: dict | None = None) -> bytes:
    p = to_properties(msg) if props is None else props
    if lmqs:
        sep = MessageConst.MULTI_DISPATCH_SEPARATOR
        p[MessageConst.INNER_MULTI_DISPATCH] = sep.join(lmqs)
        p[MessageConst.INNER_MULTI_QUEUE_OFFSET] = sep.join(str(o) for o in lmqs.values())
    body = zlib.compress(msg.payload) if compress else msg.payload
    return encode_record(
        topic=b"MQTT_MESSAGES", body=body, properties=encode_properties(p).encode(),
        queue_id=3, flag=0, queue_offset=7, physical_offset=clog,
        sys_flag=MessageSysFlag.COMPRESSED if compress else 0, born_timestamp=1,
        born_host=encode_host("127.0.0.1:1"), store_timestamp=2,
        store_host=encode_host("127.0.0.1:2"), reconsume_times=0,
        prepared_transaction_offset=0)


def test_views_match_the_full_decode():
    msgs = [
        MqttMessage("a/b", b"one", 1, sender="c1"),
        MqttMessage("t/\x01x", b"\x00" * 300, 2, True, Properties(content_type="c",
                    user_properties=(("k", "v"),)), expiry_at=123456, sender="c2"),
        MqttMessage("z", b"", 0),
    ]
    lmqs = [{"%LMQ%a": 4, "%LMQ%b": 9}, {"%LMQ%a": 5}, {}]
    buf = b"".join(_record(m, 1000 * i, lq, compress=i == 1)
                   for i, (m, lq) in enumerate(zip(msgs, lmqs, strict=True)))
    views = list(iter_record_views(buf))
    assert [v.commitlog_offset for v in views] == [0, 1000, 2000]
    pos = 0
    for view in views:
        ext = decode_record(buf, pos, decompress=True)
        pos += ext.store_size
        full = from_message_ext(ext, "b")
        light = from_record_view(view, "b")
        assert light == full
    assert from_record_view(views[0], "b").lmq_offsets == {"%LMQ%a": 4, "%LMQ%b": 9}


def test_foreign_and_malformed_records():
    foreign = _record(MqttMessage("x", b"native"), 0, {}, props={"KEYS": "k"})
    assert from_record_view(next(iter_record_views(foreign)), "b") is None
    with pytest.raises(RecordError):
        list(iter_record_views(foreign[:-3]))
