"""Stored-record codec: the test vector of docs/protocol.md §7.1 byte for byte, and round trips."""

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.common.codec import (
    BLANK_MAGIC,
    BatchItem,
    RecordError,
    decode_batch,
    decode_record,
    decode_records,
    encode_batch,
    encode_host,
    encode_record,
    parse_layout,
    record_properties,
    record_size,
    write_blank,
)
from core.common.properties import decode_properties, encode_properties
from core.common.sysflag import MessageSysFlag

# docs/protocol.md §7.1: topic T, body "hi", TAGS=A, UNIQ_KEY=ABCD, 115 bytes.
VECTOR = bytes.fromhex(
    "00000073" "daa320a7" "58932aac" "00000001" "00000000"
    "0000000000000005" "00000000000003e8" "00000000" "0000018bcfe56800"
    "0a0000020000c350" "0000018bcfe5687b" "0a00000100002a9f" "00000000"
    "0000000000000000" "00000002" "6869" "01" "54" "0015"
    "5441475301410255" "4e49515f4b455901" "4142434402"
)


def vector_fields(**over):
    fields = dict(
        topic=b"T",
        body=b"hi",
        properties=b"TAGS\x01A\x02UNIQ_KEY\x01ABCD\x02",
        queue_id=1,
        flag=0,
        queue_offset=5,
        physical_offset=1000,
        sys_flag=0,
        born_timestamp=1700000000000,
        born_host=encode_host("10.0.0.2:50000"),
        store_timestamp=1700000000123,
        store_host=encode_host("10.0.0.1:10911"),
        reconsume_times=0,
        prepared_transaction_offset=0,
    )
    fields.update(over)
    return fields


def test_vector_encodes_byte_exact():
    assert encode_record(**vector_fields()) == VECTOR
    assert len(VECTOR) == 115 == record_size(2, 1, 21)


def test_vector_decodes():
    msg = decode_record(VECTOR)
    assert msg.topic == "T"
    assert msg.body == b"hi"
    assert msg.properties == {"TAGS": "A", "UNIQ_KEY": "ABCD"}
    assert (msg.queue_id, msg.queue_offset, msg.commitlog_offset) == (1, 5, 1000)
    assert msg.born_host == "10.0.0.2:50000"
    assert msg.store_host == "10.0.0.1:10911"
    assert msg.born_timestamp == 1700000000000
    assert msg.store_timestamp == 1700000000123
    assert msg.body_crc == zlib.crc32(b"hi") & 0x7FFFFFFF
    assert msg.store_size == 115
    assert msg.offset_msg_id == "0A00000100002A9F00000000000003E8"
    assert msg.msg_id == "ABCD"  # UNIQ_KEY wins, as clients show it


def test_record_properties_reads_only_properties():
    assert record_properties(memoryview(VECTOR)) == {"TAGS": "A", "UNIQ_KEY": "ABCD"}


def test_decode_records_concatenated():
    second = encode_record(**vector_fields(queue_offset=6, physical_offset=1115, body=b"yo"))
    msgs = decode_records(VECTOR + second)
    assert [m.queue_offset for m in msgs] == [5, 6]
    assert [m.body for m in msgs] == [b"hi", b"yo"]


def test_decompress_flag():
    raw = b"x" * 5000
    rec = encode_record(**vector_fields(body=zlib.compress(raw), sys_flag=MessageSysFlag.COMPRESSED))
    plain = decode_record(rec, decompress=True)
    assert plain.body == raw
    assert not plain.sys_flag & MessageSysFlag.COMPRESSED
    assert decode_record(rec).body == zlib.compress(raw)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b[:50],  # truncated
        lambda b: b"\x00\x00\x00\x73" + b"\x00\x00\x00\x00" + b[8:],  # bad magic
        lambda b: b"\x00\x00\x00\x10" + b[4:],  # total too small
        lambda b: b"\x00\x00\x01\x00" + b[4:],  # total beyond buffer
        lambda b: b[:84] + b"\x00\x00\x10\x00" + b[88:],  # body length beyond record
        lambda b: b[:92] + b"\x7f\xff" + b[94:],  # properties length beyond record
    ],
)
def test_malformed_records_raise_record_error(mutate):
    with pytest.raises(RecordError):
        decode_record(mutate(VECTOR))


def test_blank_filler():
    buf = bytearray(16)
    write_blank(buf, 4, 12)
    assert int.from_bytes(buf[4:8], "big") == 12
    assert int.from_bytes(buf[8:12], "big") == BLANK_MAGIC
    with pytest.raises(RecordError):
        parse_layout(buf, 4)


topics = st.text(alphabet="abcXYZ019_-%|", min_size=1, max_size=127)
prop_text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=20,
)


@settings(max_examples=200, deadline=None)
@given(
    topic=topics,
    body=st.binary(max_size=2000),
    props=st.dictionaries(prop_text, prop_text, max_size=8),
    queue_id=st.integers(0, 2**31 - 1),
    queue_offset=st.integers(0, 2**62),
    physical_offset=st.integers(0, 2**62),
    flag=st.integers(-(2**31), 2**31 - 1),
    reconsume=st.integers(0, 1000),
)
def test_round_trip(topic, body, props, queue_id, queue_offset, physical_offset, flag, reconsume):
    encoded_props = encode_properties(props).encode()
    if len(encoded_props) > 32767:
        return
    rec = encode_record(
        **vector_fields(
            topic=topic.encode(),
            body=body,
            properties=encoded_props,
            queue_id=queue_id,
            queue_offset=queue_offset,
            physical_offset=physical_offset,
            flag=flag,
            reconsume_times=reconsume,
        )
    )
    msg = decode_record(rec)
    assert (msg.topic, msg.body, msg.properties) == (topic, body, props)
    assert (msg.queue_id, msg.queue_offset, msg.commitlog_offset) == (
        queue_id,
        queue_offset,
        physical_offset,
    )
    assert (msg.flag, msg.reconsume_times, msg.store_size) == (flag, reconsume, len(rec))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_only_raise_record_error(data):
    try:
        decode_records(data)
    except RecordError:
        pass


def test_batch_round_trip_and_cpp_sample():
    # docs/protocol.md §7.7 observed C++ sub-message: flag 0, body "batch-0".
    props = "KEYS\x01bk0\x02TAGS\x01TagB\x02UNIQ_KEY\x01ABC\x02WAIT\x01true\x02"
    items = [BatchItem(0, b"batch-0", props), BatchItem(7, b"", "TAGS\x01x")]
    body = encode_batch(items)
    assert body[:4] == (20 + 7 + 2 + len(props)).to_bytes(4, "big")
    assert decode_batch(body) == items
    assert decode_properties(decode_batch(body)[0].properties)["TAGS"] == "TagB"


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_batch_garbage_raises_record_error(data):
    try:
        decode_batch(data)
    except RecordError:
        pass


def test_ipv6_hosts_are_stored_as_ipv4():
    # v1 records carry IPv4 only; the C++ decoder reads nothing else (docs/protocol.md §7.1).
    assert encode_host("[::1]:10911") == b"\x7f\x00\x00\x01" + (10911).to_bytes(4, "big")


def test_short_record_with_ipv6_flags_raises_record_error():
    rec = bytearray(VECTOR)
    rec[36:40] = (MessageSysFlag.BORNHOST_V6 | MessageSysFlag.STOREHOST_V6).to_bytes(4, "big")
    with pytest.raises(RecordError):
        decode_record(bytes(rec[:100]).replace(b"\x00\x00\x00\x73", b"\x00\x00\x00\x64", 1))
    with pytest.raises(RecordError):
        parse_layout(bytes(rec))
