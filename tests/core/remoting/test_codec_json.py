"""The JSON header fast paths give what the json module gives (decode and encode)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.remoting import codec
from core.remoting.codec import RemotingCommand, decode_frame, encode_command_bytes
from core.remoting.errors import FrameError

_ENCODER = json.JSONEncoder(separators=(",", ":"))

text = st.text(max_size=20)
scalar = st.one_of(text, st.integers(-(2**70), 2**70), st.booleans(), st.none(),
                   st.floats(allow_nan=True, allow_infinity=True))
ext_maps = st.dictionaries(text, scalar, max_size=8)


@settings(max_examples=150, deadline=None)
@given(ext_maps)
def test_ext_map_json_is_the_encoders(ext):
    normal = codec._normalise_ext(ext)
    assert codec._ext_json(normal) == _ENCODER.encode(normal)
    for mixed_keys in ({1: "a", 2.5: "b", None: "d", "k": "e"}, {True: "c"}):
        assert codec._ext_json(mixed_keys) == _ENCODER.encode(mixed_keys)


def _reference_header(cmd: RemotingCommand) -> bytes:
    """The header as the codec wrote it before the fast path (JSONEncoder throughout)."""
    lang = json.dumps(str(cmd.language))
    parts = ['{"code":', str(int(cmd.code))]
    if cmd.ext_fields is not None:
        parts += [',"extFields":', _ENCODER.encode(codec._normalise_ext(cmd.ext_fields))]
    parts.append(f',"flag":{int(cmd.flag)},"language":{lang},"opaque":{int(cmd.opaque)}')
    if cmd.remark is not None:
        parts += [',"remark":', _ENCODER.encode(str(cmd.remark))]
    parts.append(f',"serializeTypeCurrentRPC":"JSON","version":{int(cmd.version)}}}')
    return "".join(parts).encode("ascii")


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**31 - 1), st.one_of(st.none(), ext_maps), st.one_of(st.none(), text),
       st.integers(-(2**31), 2**31 - 1), st.sampled_from(["JAVA", "CPP", "PYTHON"]))
def test_header_encoding_is_unchanged(code, ext, remark, opaque, language):
    cmd = RemotingCommand(code, language=language, opaque=opaque, flag=1, remark=remark,
                          ext_fields=ext)
    assert codec._encode_json_header(cmd) == _reference_header(cmd)
    back = decode_frame(encode_command_bytes(cmd))
    assert (back.code, back.opaque, back.remark) == (code, opaque, remark)


headers = st.one_of(
    st.dictionaries(text, scalar, max_size=6).map(json.dumps),
    st.builds(lambda o, pad: json.dumps(o) + pad,
              st.fixed_dictionaries({"code": st.integers(0, 400), "opaque": st.integers()}),
              st.sampled_from(["", "\n", " \t\r\n", "x", "{}", "\x0b"])),
    text,
)


@settings(max_examples=250, deadline=None)
@given(headers)
def test_header_loads_is_json_loads(header):
    raw = memoryview(header.encode("utf-8"))
    try:
        expected = json.loads(header)
    except (ValueError, RecursionError) as exc:
        with pytest.raises(FrameError, match="header is not valid JSON") as info:
            codec._loads(raw)
        assert str(exc) in str(info.value)
    else:
        # (compared as JSON text: NaN is not equal to itself)
        assert json.dumps(codec._loads(raw)) == json.dumps(expected)


def test_header_loads_edge_cases():
    assert codec._loads(memoryview(b'{"code":1}\n')) == {"code": 1}
    assert codec._loads(memoryview(b' {"code":1}')) == {"code": 1}
    for bad in (b'{"code":1}x', b'{"code":1', b"\xef\xbb\xbf{}", b"{" * 100000 + b"}" * 100000):
        with pytest.raises(FrameError, match="JSON"):
            codec._loads(memoryview(bad))
