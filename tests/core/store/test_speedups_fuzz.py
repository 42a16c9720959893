"""Every C function of core._speedups called with random types and values, not only
well-formed input: ints out of range, negative, bool, float, str, bytes subclasses,
bytearray, memoryview, tuples for lists, objects with a hostile __index__ / __len__ /
__eq__, containers mutated from Python code the call runs.

Each call must raise TypeError, ValueError or OverflowError, or return what the Python
reference (core/store/speedups_py.py) returns for the same input and leave the same state.
Where the reference is refused as well by the same cheap type checks (encode_props), both
must refuse the same inputs. .ci/asan runs this file against an AddressSanitizer build of
the extension: LMQ_SPEEDUPS_EXPECTED names the file that must have been loaded."""

from __future__ import annotations

import copy
import os
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.store import speedups_py as ref
from tests.core.store.speedups_cases import (
    batch_args,
    batch_body,
    record_args,
    split_args,
)

try:
    import core._speedups as c
except ImportError:  # pragma: no cover - test_speedups.test_extension_is_built reports it
    pytest.skip("core._speedups not built", allow_module_level=True)

REFUSED = (TypeError, ValueError, OverflowError)
FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))


def test_the_expected_build_is_loaded():
    """Under .ci/asan the ASan build must be the one these tests call."""
    want = os.environ.get("LMQ_SPEEDUPS_EXPECTED")
    if not want:
        pytest.skip("LMQ_SPEEDUPS_EXPECTED not set (only .ci/asan sets it)")
    assert os.path.realpath(c.__file__) == os.path.realpath(want)


# ------------------------------------------------------------------ hostile values
class BytesSub(bytes):
    pass


class StrSub(str):
    def __eq__(self, other):  # what a C fast path would not call
        return False

    __hash__ = str.__hash__


class IntSub(int):
    pass


class Hostile:
    """__index__, __len__, __eq__, __hash__, __bool__ that run code: they empty or grow
    whatever container they were given, then answer."""

    def __init__(self, victim=None, value=1):
        self.victim = victim
        self.value = value

    def _strike(self):
        v = self.victim
        if isinstance(v, (list, dict, bytearray)):
            if len(v) > 2:
                v.clear()
            elif isinstance(v, list):
                v.extend([Hostile(), "x" * 64, 7])
            elif isinstance(v, dict):
                v.update({f"k{i}": "v" * 50 for i in range(50)})

    def __index__(self):
        self._strike()
        return self.value

    def __len__(self):
        self._strike()
        return 3

    def __eq__(self, other):
        self._strike()
        return False

    def __hash__(self):
        return hash("%LMQ%a")  # collides with a cached name: __eq__ runs in lookups

    def __bool__(self):
        self._strike()
        return True


def _scalars():
    return st.one_of(
        st.integers(-(2**70), 2**70), st.integers(-5, 300), st.booleans(), st.none(),
        st.floats(allow_nan=True), st.text(max_size=6), st.binary(max_size=12),
        st.binary(max_size=12).map(BytesSub), st.binary(max_size=12).map(bytearray),
        st.binary(max_size=12).map(memoryview), st.integers(0, 9).map(IntSub),
        st.text("ab%LMQ", max_size=6).map(StrSub), st.builds(Hostile),
        st.binary(min_size=4, max_size=12).map(lambda b: memoryview(b)[::2]),
    )


def keys():
    """Hashable values for dict keys (Hostile ones collide with "%LMQ%a")."""
    return st.one_of(
        st.integers(-(2**70), 2**70), st.booleans(), st.none(), st.floats(),
        st.text(max_size=6), st.binary(max_size=6), st.binary(max_size=6).map(BytesSub),
        st.integers(0, 9).map(IntSub), st.text("ab%LMQ", max_size=6).map(StrSub),
        st.builds(Hostile), st.just("%LMQ%a"),
    )


def anything():
    return st.recursive(
        _scalars(),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple),
            st.dictionaries(keys(), inner, max_size=3),
        ),
        max_leaves=6,
    )


def arm(value, victim):
    """Point every Hostile inside `value` at `victim` (a container of the same call)."""
    if isinstance(value, Hostile):
        value.victim = victim
    elif isinstance(value, (list, tuple)):
        for v in value:
            arm(v, victim)
    elif type(value) is dict:
        for v in value.values():
            arm(v, victim)
    return value


def call(fn, *args):
    """("ok", result) or ("refused", exception type); anything else fails the test."""
    try:
        return "ok", fn(*args)
    except REFUSED as exc:
        return "refused", type(exc)


# ------------------------------------------------------------------ crc32
@FUZZ
@given(anything())
def test_crc32_any_input(data):
    got = call(c.crc32, data)
    if got[0] == "ok":
        assert got[1] == zlib.crc32(data)


# ------------------------------------------------------------------ encode_props
names = st.sampled_from(["TAGS", "KEYS", "WAIT", "INNER_MULTI_QUEUE_OFFSET", "a", "é"])
values = st.text(max_size=8)


@FUZZ
@given(
    st.one_of(st.dictionaries(names, values, max_size=5), anything(),
              st.dictionaries(names | keys(), values | anything(), max_size=4)),
    st.one_of(st.none(), st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6), anything()),
    st.booleans(),
)
def test_encode_props_any_input(props, offsets, hostile_offsets):
    victim = props if hostile_offsets else offsets
    if hostile_offsets and isinstance(offsets, list):
        offsets.insert(0, Hostile())
    arm(props, victim)
    arm(offsets, victim)
    got = call(c.encode_props, props, offsets)
    want = call(ref.encode_props, props, offsets)
    assert got[0] == want[0], (got, want)
    if got[0] == "ok":
        assert got[1] == want[1]


def test_encode_props_agrees_on_what_used_to_differ():
    """True as an offset, a tuple of offsets, a str subclass: the C code gave "1" and the
    reference "True", the C code refused a tuple the reference took. Both refuse now."""
    for impl in (c, ref):
        for offsets in ([True], (1, 2), [1.0], [IntSub(3)]):
            with pytest.raises(TypeError):
                impl.encode_props({"INNER_MULTI_DISPATCH": "%LMQ%a"}, offsets)
        for props in ({StrSub("a"): "b"}, {"a": StrSub("b")}):
            with pytest.raises(TypeError):
                impl.encode_props(props, None)


# ------------------------------------------------------------------ write_record
def _target(kind: str):
    import mmap

    return mmap.mmap(-1, 1024) if kind == "mmap" else bytearray(1024)


@FUZZ
@given(st.binary(max_size=64), st.binary(max_size=40),
       st.lists(st.tuples(st.integers(0, 16), anything()), max_size=3),
       st.sampled_from(["bytearray", "mmap"]))
def test_write_record_any_input(body, pb, spoils, kind):
    """Argument 0 is the target; any spoiled argument is random (hostile ones aimed at
    the target). Refused: nothing written. Accepted: the reference writes the same."""
    a, b = _target(kind), _target(kind)
    args = record_args(body, pb)
    spoiled_target = None
    for where, value in spoils:
        arm(value, a)
        if where == 0:
            spoiled_target = value
        else:
            args[where - 1] = value
    if spoiled_target is not None:
        got = call(c.write_record, spoiled_target, *args)
        assert got[0] == "refused" or type(spoiled_target) in (bytearray, type(a))
        return
    got = call(c.write_record, a, *args)
    if got[0] == "refused":
        assert bytes(a) == bytes(1024), "written although refused"
        return
    want = call(ref.write_record, b, *args)
    assert want[0] == "ok", want
    assert bytes(a) == bytes(b)


@pytest.mark.parametrize("value", [True, False, 1.0, IntSub(1), BytesSub(b"x" * 8),
                                   bytearray(8), memoryview(b"x" * 8), "x" * 8, None])
def test_write_record_inexact_types(value):
    """Where the C code accepts an argument of an inexact type, the reference gives the
    same bytes (bool, int and bytes subclasses are refused by the C code)."""
    for where in range(1, 17):
        args = record_args()
        args[where - 1] = value
        a, b = bytearray(1024), bytearray(1024)
        got = call(c.write_record, a, *args)
        if got[0] == "ok":
            assert call(ref.write_record, b, *args)[0] == "ok"
            assert a == b
        else:
            assert a == bytearray(1024)
    for impl in (c, ref):  # a bytes subclass as a host: both refuse (they used to differ)
        args = record_args()
        args[8] = BytesSub(args[8])
        with pytest.raises(ValueError):
            impl.write_record(bytearray(1024), *args)


# ------------------------------------------------------------------ LMQ staging
lmq_names = st.sampled_from(["%LMQ%a", "%LMQ%b", "%LMQ%c", "T"])
offsets_ = st.integers(0, 2**63 - 2)


def _copy_units(x):
    """A copy of a staged-units dict deep enough that staging one leaves the other alone."""
    if type(x) is not dict:
        return x
    return {k: list(v) if type(v) is list else v for k, v in x.items()}


@FUZZ
@given(
    st.one_of(st.lists(lmq_names, max_size=4, unique=True), anything()),
    st.one_of(st.dictionaries(lmq_names, offsets_, max_size=4),
              st.dictionaries(lmq_names | keys(), anything(), max_size=4)),
    lmq_names | anything(),
    st.one_of(st.none(), st.dictionaries(lmq_names, st.integers(0, 5), max_size=3), anything()),
)
def test_plan_lmqs_any_input(names, cache, topic, bump):
    hostile = any(isinstance(x, Hostile) for x in _leaves([names, cache, topic, bump]))
    arm(names, names)
    arm(cache, names)
    bump_c = copy.copy(bump) if type(bump) is dict else bump
    bump_r = copy.copy(bump) if type(bump) is dict else bump
    got = call(c.plan_lmqs, names, cache, topic, bump_c)
    if got[0] == "refused" or hostile:
        return  # hostile code ran: only "no crash, a clean refusal or a result" holds
    want = call(ref.plan_lmqs, names, cache, topic, bump_r)
    assert want == got
    assert bump_c == bump_r


@FUZZ
@given(
    st.one_of(st.dictionaries(lmq_names, st.lists(offsets_ | st.binary(max_size=4), max_size=4),
                              max_size=3), anything()),
    st.one_of(st.dictionaries(lmq_names, offsets_, max_size=3), anything()),
    st.one_of(st.lists(st.tuples(lmq_names, offsets_), max_size=4), anything()),
    st.binary(max_size=4) | anything(),
)
def test_stage_units_any_input(staged, cache, targets, unit):
    hostile = any(isinstance(x, Hostile) for x in _leaves([staged, cache, targets, unit]))
    arm(targets, targets)
    arm(staged, targets)
    s_c, k_c = _copy_units(staged), copy.copy(cache) if type(cache) is dict else cache
    got = call(c.stage_units, s_c, k_c, targets, unit)
    if got[0] == "refused" or hostile:
        return
    s_r, k_r = _copy_units(staged), dict(cache)
    assert call(ref.stage_units, s_r, k_r, targets, unit) == got
    assert (s_c, k_c) == (s_r, k_r)


@FUZZ
@given(
    st.one_of(st.dictionaries(lmq_names, st.lists(offsets_ | st.binary(max_size=4), max_size=6),
                              max_size=3), anything()),
    st.one_of(st.dictionaries(lmq_names, st.binary(max_size=9), max_size=2), anything()),
    st.sampled_from(["record", "clear units", "clear prefixes", "raise", "not callable"]),
)
def test_write_units_any_input(snapshot, prefixes, how):
    puts: list = []

    def put(key, value):
        puts.append((key, value))
        if how == "clear units" and type(snapshot) is dict:
            for v in snapshot.values():
                if type(v) is list:
                    v.clear()
        elif how == "clear prefixes" and type(prefixes) is dict:
            prefixes.clear()
            put.junk = [bytes(9) for _ in range(100)]
        elif how == "raise":
            raise ValueError("refused by put")

    fn = put if how != "not callable" else "put"
    if how == "record":
        pre_r = dict(prefixes) if type(prefixes) is dict else prefixes
        snap_r = _copy_units(snapshot) if not _has_hostile(snapshot) else None
    got = call(c.write_units, snapshot, fn, prefixes)
    if got[0] == "refused" or how != "record" or snap_r is None or _has_hostile(prefixes):
        for key, _value in puts:  # a prefix (given or made) and an int64
            assert type(key) is bytes and len(key) >= 8
        return
    mine, puts[:] = list(puts), []
    assert call(ref.write_units, snap_r, put, pre_r) == got
    assert puts == mine
    assert pre_r == prefixes


def _leaves(x):
    if isinstance(x, (list, tuple)):
        for v in x:
            yield from _leaves(v)
    elif type(x) is dict:
        for k, v in x.items():
            yield from _leaves(k)
            yield from _leaves(v)
    else:
        yield x


def _has_hostile(x) -> bool:
    return any(isinstance(v, Hostile) for v in _leaves(x))


# ------------------------------------------------------------------ batch sends
def _mutate(data: bytes, edits) -> bytes:
    b = bytearray(data)
    for at, byte in edits:
        if b:
            b[at % len(b)] = byte
    return bytes(b)


@FUZZ
@given(st.integers(1, 4), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4),
       st.lists(st.tuples(st.integers(1, 9), anything()), max_size=2), st.binary(max_size=8))
def test_split_batch_any_input(n, edits, spoils, extra):
    body = _mutate(batch_body(n), edits)
    args = split_args(body, extra)
    for where, value in spoils:
        args[where] = value
    got = call(c.split_batch, *args)
    if got[0] == "refused" or got[1] is None:
        return
    items = got[1]
    if type(items) is tuple:  # (status, remark, the items before the refused one)
        status, remark, items = items
        assert type(status) is str and type(remark) is str
    for it in items:
        flag, b0, blen, pb, tc, total, crc = it[:7]
        assert 0 <= b0 and b0 + blen <= len(body)
        assert crc == zlib.crc32(body[b0 : b0 + blen]) & 0x7FFFFFFF
        assert type(pb) is bytes and total == args[2] + blen + len(pb)


@FUZZ
@given(st.integers(1, 4), st.lists(st.tuples(st.integers(0, 23), anything()), max_size=2),
       st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9), anything()), max_size=2),
       st.integers(-300, 5000), st.integers(-300, 5000), st.booleans())
def test_write_batch_any_input(n, spoils, item_spoils, pos, limit, index_on):
    """Random arguments and item fields: refused with nothing written, or the records
    written between pos and the returned position are what write_record writes."""
    body = batch_body(n)
    items = c.split_batch(*split_args(body))
    mm = bytearray(4096)
    args = batch_args(items, body, mm, pos=pos, limit=limit, pending=[] if index_on else None)
    for which, field, value in item_spoils:
        k = which % len(items)
        items[k] = items[k][:field] + (value,) + items[k][field + 1:]
    for where, value in spoils:
        args[where] = arm(value, items)
    target = args[0]
    before = bytes(target) if type(target) is bytearray else None
    # The output list / buffer are appended to: a spoiled one may already hold entries.
    had = [len(a) if type(a) in (list, bytearray) else 0 for a in args[17:19]]
    got = call(c.write_batch, *args)
    if got[0] == "refused":
        if before is not None:
            assert bytes(target) == before, "written although refused"
        return
    i, end = got[1]
    assert type(target) is bytearray and 0 <= args[1] <= end <= len(target)
    assert target[: args[1]] == before[: args[1]] and target[end:] == before[end:]
    assert len(args[17]) - had[0] == i - args[4] and len(args[18]) - had[1] == 20 * (i - args[4])
    # the same records through write_record
    want = bytearray(before)
    at = args[1]
    for k in range(args[4], i):
        flag, b0, blen, pb, _tc, total = items[k][:6]
        ref.write_record(want, at, total, args[5], flag, args[6] + k, args[7] + at, args[8],
                         args[9], args[10], args[11], args[12], args[13], 0,
                         body[b0 : b0 + blen], args[15], pb)
        if zlib.crc32(body[b0 : b0 + blen]) & 0x7FFFFFFF != items[k][6]:
            want[at + 8 : at + 12] = (items[k][6]).to_bytes(4, "big")  # the caller's CRC
        at += total
    assert at == end and target == want
