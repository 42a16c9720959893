"""core._speedups (C) against core/store/speedups_py.py (the Python reference): same bytes,
same exception types. And the extension must be built where CI runs (a compiler is there)."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.common.codec import decode_record, encode_host
from core.store import speedups
from core.store import speedups_py as ref

try:
    import core._speedups as c
except ImportError:  # pragma: no cover - reported by test_extension_is_built
    c = None

needs_c = pytest.mark.skipif(c is None, reason="core._speedups not built")


def test_extension_is_built():
    if os.environ.get("LMQ_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("pure Python requested")
    assert c is not None, "core._speedups was not built: is a C compiler installed?"
    assert speedups.NATIVE


texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)


@needs_c
@given(st.binary(max_size=3000))
def test_crc32_matches_zlib(data):
    assert c.crc32(data) == zlib.crc32(data) == ref.crc32(data)
    assert c.crc32(memoryview(data)) == zlib.crc32(data)


@needs_c
@settings(max_examples=300)
@given(st.dictionaries(texts, texts, max_size=6),
       st.none() | st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=40))
def test_encode_props_same_bytes(props, offsets):
    if offsets is not None and "INNER_MULTI_DISPATCH" not in props:
        props["INNER_MULTI_DISPATCH"] = "%LMQ%a"
    assert c.encode_props(props, offsets) == ref.encode_props(props, offsets)


@needs_c
def test_encode_props_drops_wait_and_old_offsets_with_offsets():
    props = {"WAIT": "true", "INNER_MULTI_QUEUE_OFFSET": "9", "TAGS": "t",
             "INNER_MULTI_DISPATCH": "%LMQ%a,%LMQ%b"}
    want = b"TAGS\x01t\x02INNER_MULTI_DISPATCH\x01%LMQ%a,%LMQ%b\x02INNER_MULTI_QUEUE_OFFSET\x013,0"
    assert c.encode_props(props, [3, 0]) == ref.encode_props(props, [3, 0]) == want
    # without offsets nothing is dropped
    assert c.encode_props({"WAIT": "x"}, None) == b"WAIT\x01x"


@needs_c
@pytest.mark.parametrize("bad", [{"a": 1}, {1: "a"}, {"a": b"x"}])
def test_encode_props_rejects_non_str(bad):
    for impl in (c, ref):
        with pytest.raises(TypeError):
            impl.encode_props(bad, None)


@needs_c
def test_encode_props_rejects_lone_surrogate():
    for impl in (c, ref):
        with pytest.raises(UnicodeEncodeError):
            impl.encode_props({"k": "\ud800"}, None)


def _record_args(body=b"hello", pb=b"TAGS\x01a", topic=b"T1", pos=16):
    tail = bytes((len(topic),)) + topic
    total = 91 + len(body) + len(tail) - 1 + len(pb)
    return [pos, total, 3, 7, 42, 1 << 40, 5, 1_700_000_000_123, encode_host("10.0.0.1:9"),
            1_700_000_000_456, encode_host("10.0.0.2:10911"), 2, 0, body, tail, pb]


@needs_c
@settings(max_examples=100)
@given(st.binary(max_size=600), st.binary(max_size=200),
       st.text("abcXYZ%_-0123", min_size=1, max_size=40))
def test_write_record_same_bytes(body, pb, topic):
    args = _record_args(body, pb, topic.encode())
    a = bytearray(2048)
    b = bytearray(2048)
    c.write_record(a, *args)
    ref.write_record(b, *args)
    assert a == b
    rec = decode_record(bytes(a[16 : 16 + args[1]]))
    assert rec.body == body and rec.queue_offset == 42 and rec.commitlog_offset == 1 << 40


@needs_c
def test_write_record_into_mmap_and_checks():
    mm = mmap.mmap(-1, 4096)
    args = _record_args()
    c.write_record(mm, *args)
    assert decode_record(mm[16 : 16 + args[1]]).body == b"hello"
    for impl in (c, ref):
        bad = list(args)
        bad[1] += 1  # size does not match the parts
        with pytest.raises(ValueError):
            impl.write_record(mm, *bad)
        bad = list(args)
        bad[0] = 4096 - 10  # does not fit
        with pytest.raises(ValueError):
            impl.write_record(mm, *bad)
        bad = list(args)
        bad[3] = 1 << 40  # flag out of int32
        with pytest.raises(OverflowError):
            impl.write_record(mm, *bad)
        bad = list(args)
        bad[8] = b"short"
        with pytest.raises(ValueError):
            impl.write_record(mm, *bad)
        bad = list(args)
        bad[13] = "not bytes"
        with pytest.raises(TypeError):
            impl.write_record(mm, *bad)
    with pytest.raises((TypeError, BufferError)):
        c.write_record(b"read-only", *args)


@needs_c
def test_stage_and_write_units_match():
    out = []
    for impl in (c, ref):
        staged: dict = {"%LMQ%b": [4, b"old"]}
        cache: dict = {}
        n = impl.stage_units(staged, cache, [("%LMQ%a", 0), ("%LMQ%b", 5), ("%LMQ%c", 0)], b"U")
        assert n == 2
        assert staged == {"%LMQ%b": [4, b"old", 5, b"U"], "%LMQ%a": [0, b"U"], "%LMQ%c": [0, b"U"]}
        assert cache == {"%LMQ%a": 1, "%LMQ%b": 6, "%LMQ%c": 1}
        puts: list = []
        prefixes: dict = {}
        assert impl.write_units(staged, lambda k, v, puts=puts: puts.append((k, v)), prefixes) == 4
        assert prefixes["%LMQ%a"] == b"u%LMQ%a\x00"
        out.append(puts)
    assert out[0] == out[1]
    assert [k for k, _ in out[0]] == sorted(k for k, _ in out[0])


@needs_c
def test_write_units_propagates_put_errors():
    def put(k, v):
        raise RuntimeError("refused")

    for impl in (c, ref):
        with pytest.raises(RuntimeError):
            impl.write_units({"%LMQ%a": [0, b"x"]}, put, {})


@needs_c
def test_plan_lmqs_matches():
    cache = {"%LMQ%a": 3, "%LMQ%b": 0, "T": 9}
    for impl in (c, ref):
        assert impl.plan_lmqs(["%LMQ%a", "%LMQ%b"], cache, "Topic", None) == (
            [3, 0], [("%LMQ%a", 3), ("%LMQ%b", 0)], 1)
        bump = {"%LMQ%b": 2}
        assert impl.plan_lmqs(["%LMQ%a", "%LMQ%b"], cache, "Topic", bump) == (
            [3, 2], [("%LMQ%a", 3), ("%LMQ%b", 2)], 0)
        assert bump == {"%LMQ%a": 1, "%LMQ%b": 3}
        assert impl.plan_lmqs(["%LMQ%a", "%LMQ%x"], cache, "Topic", bump) is None  # not cached
        assert bump == {"%LMQ%a": 1, "%LMQ%b": 3}  # untouched when None
        assert impl.plan_lmqs(["%LMQ%a"], cache, "T", None) is None  # the topic is cached



@pytest.mark.slow
def test_store_tests_pass_without_the_extension():
    """The Python fallback (a machine with no C compiler at install time) runs the store's
    fast tier green: the whole of it, in a child pytest with LMQ_PURE_PYTHON=1."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, LMQ_PURE_PYTHON="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-m", "not slow", "-p", "no:cacheprovider",
         here],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout
