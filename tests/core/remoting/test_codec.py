"""Frame codec: round trips, the C++ header sample, normalisation, binary headers, errors."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.remoting.codec import (
    FrameDecoder,
    RemotingCommand,
    decode_frame,
    encode_command,
    encode_command_bytes,
)
from core.remoting.codes import RequestCode, ResponseCode
from core.remoting.errors import FrameError, HeaderError

# Byte-exact header sent by the C++ client of the rocketmq==0.4.4 wheel (docs/protocol.md §1.2),
# including the trailing newline jsoncpp's FastWriter appends.
CPP_HEADER = (
    b'{"code":105,"extFields":{"AccessKey":"","OnsChannel":"ALIYUN",'
    b'"Signature":"I4kwK+NPjZ2MrjmvxSIwKZpbSzk=","topic":"SniffTopic"},'
    b'"flag":0,"language":"CPP","opaque":0,"remark":"","version":63}\n'
)


def frame(header: bytes, body: bytes = b"", stype: int = 0) -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), (stype << 24) | len(header)) + header + body


def json_frame(obj: object, body: bytes = b"") -> bytes:
    return frame(json.dumps(obj).encode(), body)


def test_cpp_header_sample_parses() -> None:
    cmd = decode_frame(frame(CPP_HEADER))
    assert cmd.code == RequestCode.GET_ROUTEINFO_BY_TOPIC
    assert cmd.language == "CPP"
    assert cmd.version == 63
    assert cmd.opaque == 0
    assert cmd.flag == 0
    assert cmd.remark == ""
    assert cmd.ext_str("topic") == "SniffTopic"
    assert cmd.ext_fields["OnsChannel"] == "ALIYUN"
    assert cmd.body is None
    assert not cmd.is_response and not cmd.is_oneway


def test_json_round_trip_with_body() -> None:
    cmd = RemotingCommand(
        RequestCode.SEND_MESSAGE,
        language="PYTHON",
        version=399,
        opaque=77,
        flag=0,
        remark="héllo \"quoted\"",
        ext_fields={"topic": "T", "queueId": "3"},
        body=b"\x00payload\xff",
    )
    out = decode_frame(encode_command_bytes(cmd))
    assert (out.code, out.language, out.version, out.opaque, out.flag) == (10, "PYTHON", 399, 77, 0)
    assert out.remark == cmd.remark
    assert out.ext_fields == {"topic": "T", "queueId": "3"}
    assert out.body == b"\x00payload\xff"
    assert out.serialize_type == 0


def test_json_header_layout_is_compact_and_alphabetical() -> None:
    resp = RemotingCommand.response(0, ext_fields={"queueId": 1, "msgId": "X", "queueOffset": 7})
    resp.opaque = 5
    head = encode_command(resp)[0]
    total, word = struct.unpack(">iI", head[:8])
    assert word >> 24 == 0 and total == 4 + (word & 0xFFFFFF)
    text = head[8:].decode()
    assert text == (
        '{"code":0,"extFields":{"queueId":"1","msgId":"X","queueOffset":"7"},"flag":1,'
        '"language":"JAVA","opaque":5,"serializeTypeCurrentRPC":"JSON","version":407}'
    )


def test_response_ext_values_always_written_as_strings() -> None:
    resp = RemotingCommand.response(0, ext_fields={"a": 1, "b": True, "c": False, "d": "x"})
    header = json.loads(encode_command(resp)[0][8:])
    assert header["extFields"] == {"a": "1", "b": "true", "c": "false", "d": "x"}
    assert all(isinstance(v, str) for v in header["extFields"].values())
    assert header["flag"] == 1


def test_incoming_numbers_and_booleans_normalised_to_str() -> None:
    data = json_frame(
        {
            "code": 10,
            "flag": 0,
            "opaque": 3,
            "extFields": {"queueId": 2, "sysFlag": 0, "batch": "1", "unitMode": True,
                          "bornTimestamp": "1700000000000", "gone": None},
        }
    )
    cmd = decode_frame(data)
    assert cmd.ext_fields == {
        "queueId": "2",
        "sysFlag": "0",
        "batch": "1",
        "unitMode": "true",
        "bornTimestamp": "1700000000000",
    }
    assert cmd.ext_int("queueId") == 2
    assert cmd.ext_int("bornTimestamp") == 1700000000000
    assert cmd.ext_bool("batch") is True
    assert cmd.ext_bool("unitMode") is True
    assert cmd.language == "JAVA" and cmd.version == 0 and cmd.remark is None


def test_ext_helpers() -> None:
    cmd = RemotingCommand.request(
        11, {"a": "12", "b": "TRUE", "c": "0", "d": "", "e": "x1", "f": "False", "n": 5}
    )
    assert cmd.ext_int("a") == 12
    assert cmd.ext_int("n") == 5
    assert cmd.ext_str("n") == "5"
    assert cmd.ext_int("missing", 9) == 9
    assert cmd.ext_int("d", -1) == -1  # empty string counts as absent
    assert cmd.ext_bool("b") is True
    assert cmd.ext_bool("c") is False
    assert cmd.ext_bool("f") is False
    assert cmd.ext_bool("missing", default=True) is True
    assert cmd.ext_str("missing", "dflt") == "dflt"
    assert cmd.ext_str("d") == ""
    with pytest.raises(HeaderError) as info:
        cmd.ext_int("e")
    assert info.value.name == "e" and "e" in str(info.value)
    with pytest.raises(HeaderError):
        cmd.ext_bool("e")
    with pytest.raises(HeaderError) as info:
        cmd.ext_str("topic", required=True)
    assert "topic" in str(info.value)
    with pytest.raises(HeaderError):
        cmd.ext_int("d", required=True)
    assert RemotingCommand.request(1).ext_str("x") is None


def test_make_response_copies_opaque_and_serialization() -> None:
    req = RemotingCommand(14, opaque=123, serialize_type=1)
    resp = req.make_response(ResponseCode.QUERY_NOT_FOUND, "none", {"offset": "1"})
    assert resp.opaque == 123 and resp.serialize_type == 1
    assert resp.is_response and resp.code == 22 and resp.remark == "none"


def test_binary_header_round_trip() -> None:
    cmd = RemotingCommand(
        RequestCode.PULL_MESSAGE,
        language="GO",
        version=401,
        opaque=-5,
        flag=2,
        remark="r\u00e9mark",
        ext_fields={"topic": "TopicA", "queueId": 3, "empty": ""},
        body=b"abc",
        serialize_type=1,
    )
    data = encode_command_bytes(cmd)
    assert data[4] == 1  # type byte
    out = decode_frame(data)
    assert out.serialize_type == 1
    assert (out.code, out.language, out.version, out.opaque, out.flag) == (11, "GO", 401, -5, 2)
    assert out.remark == "r\u00e9mark"
    assert out.ext_fields == {"topic": "TopicA", "queueId": "3", "empty": ""}
    assert out.body == b"abc"
    assert out.is_oneway


def test_binary_header_hand_built() -> None:
    # code 34, CPP, version 63, opaque 9, flag 0, no remark, one ext pair.
    ext = struct.pack(">h", 1) + b"k" + struct.pack(">i", 2) + b"vv"
    header = struct.pack(">hBhii", 34, 1, 63, 9, 0) + struct.pack(">i", 0)
    header += struct.pack(">i", len(ext)) + ext
    cmd = decode_frame(frame(header, b"B", stype=1))
    assert (cmd.code, cmd.language, cmd.opaque) == (34, "CPP", 9)
    assert cmd.remark is None and cmd.ext_fields == {"k": "vv"} and cmd.body == b"B"


def test_list_body_is_not_joined_by_encoder() -> None:
    buf = bytearray(b"0123456789")
    parts = [memoryview(buf)[0:4], memoryview(buf)[4:10], b"xy"]
    cmd = RemotingCommand.response(0, body=parts)
    assert cmd.body_length == 12
    assert cmd.body_bytes() == b"0123456789xy"
    encoded = encode_command(cmd)
    assert encoded[1] is parts[0] and encoded[2] is parts[1] and encoded[3] is parts[2]
    out = decode_frame(b"".join(encoded))
    assert out.body == b"0123456789xy"


def test_empty_body_decodes_as_none() -> None:
    out = decode_frame(encode_command_bytes(RemotingCommand.request(34, body=b"")))
    assert out.body is None


def test_decoder_handles_split_and_coalesced_frames() -> None:
    frames = [
        encode_command_bytes(RemotingCommand(i, opaque=i, body=bytes([i]) * i)) for i in range(1, 60)
    ]
    stream = b"".join(frames)
    for chunk in (1, 3, 7, 64, len(stream)):
        decoder = FrameDecoder()
        got = []
        for start in range(0, len(stream), chunk):
            got.extend(decoder.feed(stream[start : start + chunk]))
        assert [c.opaque for c in got] == list(range(1, 60))
        assert all(c.body_bytes() == bytes([c.code]) * c.code for c in got)
        assert decoder.buffered == 0


def test_decoder_many_small_frames_in_one_feed() -> None:
    one = encode_command_bytes(RemotingCommand.request(34))
    decoder = FrameDecoder()
    assert len(decoder.feed(one * 20000)) == 20000


@pytest.mark.parametrize(
    "data, message",
    [
        (struct.pack(">iI", 3, 0) + b"xxx", "frame length"),
        (struct.pack(">iI", -1, 0), "frame length"),
        (struct.pack(">iI", 17 * 1024 * 1024, 2), "frame length"),
        (struct.pack(">iI", 8, 100) + b"{}{}", "header length"),
        (frame(b'{"code":1}', stype=2), "serialize type"),
        (frame(b"not json"), "JSON"),
        (frame(b"\xff\xfe{}"), "JSON"),
        (frame(b"[1,2,3]"), "object"),
        (frame(b'{"flag":0}'), "code"),
        (frame(b'{"code":"10"}'), "code"),
        (frame(b'{"code":1,"extFields":[1]}'), "extFields"),
        (frame(b'{"code":1,"opaque":"x"}'), "opaque"),
        (frame(b"[" * 100000), "JSON"),
        (frame(struct.pack(">hBhii", 1, 0, 0, 0, 0), stype=1), "truncated"),
        (frame(struct.pack(">hBhiii", 1, 0, 0, 0, 0, 50), stype=1), "remark"),
    ],
)
def test_frame_errors(data: bytes, message: str) -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameError, match=message):
        decoder.feed(data)
    with pytest.raises(FrameError):  # the stream stays failed
        decoder.feed(encode_command_bytes(RemotingCommand.request(1)))


def test_frame_size_limit_is_configurable() -> None:
    data = encode_command_bytes(RemotingCommand.request(10, body=b"x" * 1000))
    assert FrameDecoder(max_frame_size=2000).feed(data)
    with pytest.raises(FrameError):
        FrameDecoder(max_frame_size=500).feed(data)


def test_header_too_large_to_encode() -> None:
    cmd = RemotingCommand.request(10, {"k": "x" * (0x1000000)})
    with pytest.raises(ValueError):
        encode_command(cmd)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.lists(st.integers(1, 64), min_size=1, max_size=20))
def test_fuzz_arbitrary_bytes_only_raise_frame_error(data: bytes, cuts: list[int]) -> None:
    decoder = FrameDecoder(max_frame_size=4096)
    pos = 0
    i = 0
    try:
        while pos < len(data):
            step = cuts[i % len(cuts)]
            decoder.feed(data[pos : pos + step])
            pos += step
            i += 1
    except FrameError:
        pass


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([0, 1]),
    st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=4),
    st.one_of(st.none(), st.text(max_size=20)),
    st.binary(max_size=40),
    st.lists(st.integers(1, 30), min_size=1, max_size=5),
    st.integers(0, 255),
)
def test_fuzz_valid_frame_with_garbage_prefix_suffix(
    stype: int, ext: dict, remark: str | None, body: bytes, cuts: list[int], junk: int
) -> None:
    cmd = RemotingCommand(17, remark=remark, ext_fields=ext, body=body, serialize_type=stype)
    data = encode_command_bytes(cmd) + bytes([junk]) * 3
    decoder = FrameDecoder()
    got = []
    pos = 0
    i = 0
    try:
        while pos < len(data):
            step = cuts[i % len(cuts)]
            got.extend(decoder.feed(data[pos : pos + step]))
            pos += step
            i += 1
    except FrameError:
        pass
    assert got and got[0].code == 17 and got[0].body_bytes() == body
    if stype == 1 or remark:  # binary reads an empty remark back as None
        assert (got[0].remark or None) == (remark or None)
    assert (got[0].ext_fields or {}) == ext


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 3), st.binary(max_size=200), st.binary(max_size=20))
def test_fuzz_well_framed_garbage_headers(stype: int, header: bytes, body: bytes) -> None:
    data = frame(header, body, stype)
    try:
        cmds = FrameDecoder().feed(data)
    except FrameError:
        return
    assert len(cmds) == 1 and cmds[0].body_bytes() == body


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["code", "flag", "opaque", "version", "language", "remark", "extFields"]),
        _json_values,
    )
)
def test_fuzz_json_headers_decode_or_frame_error(header: dict) -> None:
    try:
        cmds = FrameDecoder().feed(frame(json.dumps(header).encode()))
    except FrameError:
        return
    cmd = cmds[0]
    assert isinstance(cmd.code, int)
    assert cmd.ext_fields is None or all(isinstance(v, str) for v in cmd.ext_fields.values())
    # Whatever decoded can be answered.
    encode_command(cmd.make_response(0, cmd.remark, cmd.ext_fields))


@pytest.mark.parametrize("raw", [" 7 ", "1_0", "7\n", "+-7", "٣", True, 7.0, "0x10"])
def test_ext_int_reads_integers_as_java_does(raw) -> None:
    """Every handler's ext_int parses like Integer.parseInt: sign and ASCII digits only
    (Python's int() would take blanks, underscores, other scripts' digits and True)."""
    cmd = RemotingCommand.request(11, {"v": raw, "ok": "-12", "plus": "+3"})
    assert cmd.ext_int("ok") == -12 and cmd.ext_int("plus") == 3
    with pytest.raises(HeaderError):
        cmd.ext_int("v")
