"""A batch's multi-dispatch planned and staged in C (speedups.plan_batch_lmqs /
stage_batch_lmqs, put_batch.py _plan_batch_lmqs): the same records, units, offsets and
refusals as the Python planning (_plan_dicts + _dispatch_native), and the C functions
refuse what they cannot take without crashing or changing anything."""

from __future__ import annotations

import random

import pytest

import core.store.put_batch as put_batch_mod
from core.common.codec import BatchItem, encode_batch
from core.common.message import InnerMessage, MessageBatch

BORN = b"\x0a\x00\x00\x02\x00\x00\xc3\x50"
LMQS = ["%LMQ%m_a", "%LMQ%m_b", "%LMQ%m_c|s|h"]

pytestmark = pytest.mark.skipif(put_batch_mod.plan_batch_lmqs is None,
                                reason="core._speedups not built")


def _batch(items, queue_id=0, props="CLUSTER\x01C"):
    return MessageBatch("T", queue_id, encode_batch(items), props, born_timestamp=1700000000000,
                        born_host=BORN)


def _stamp_free(raw) -> bytes:
    b = bytearray(raw)
    b[56:64] = bytes(8)  # the store timestamp differs between two stores
    return bytes(b)


def _mqtt_like(rng: random.Random, n: int) -> list[BatchItem]:
    items = []
    for i in range(n):
        names = rng.sample(LMQS, rng.randrange(1, len(LMQS) + 1))
        pairs = [("MQTT_TOPIC", f"a/{i}"), ("MQTT_QOS", str(rng.randrange(3)))]
        if rng.random() < 0.9:
            pairs.append(("INNER_MULTI_DISPATCH", ",".join(names)))
        if rng.random() < 0.3:
            pairs.append(("KEYS", "k1 k2"))
        if rng.random() < 0.3:
            pairs.append(("TAGS", rng.choice(["x", "y"])))
        rng.shuffle(pairs)
        text = "\x02".join(k + "\x01" + v for k, v in pairs)
        items.append(BatchItem(rng.randrange(3), rng.randbytes(rng.randrange(0, 400)), text))
    return items


def _counting(monkeypatch) -> list[int]:
    """Count the batches the C planner took (it returned a plan, not None)."""
    taken = [0]
    real = put_batch_mod.plan_batch_lmqs

    def spy(*args):
        out = real(*args)
        if out is not None and len(out) == 3:
            taken[0] += 1
        return out

    monkeypatch.setattr(put_batch_mod, "plan_batch_lmqs", spy)
    return taken


def test_c_planning_writes_what_the_python_planning_writes(open_store, tmp_path, monkeypatch):
    fast = open_store(tmp_path / "fast", commitlog_file_size=32 * 1024, max_properties_size=300)
    slow = open_store(tmp_path / "slow", commitlog_file_size=32 * 1024, max_properties_size=300)
    for store in (fast, slow):  # the LMQs exist: the usual case of a running gateway
        for name in LMQS:
            store.put(InnerMessage("T", b"seed", properties={"INNER_MULTI_DISPATCH": name}))
    rng = random.Random(5)
    batches = [_batch(_mqtt_like(rng, rng.randrange(1, 40)), queue_id=i % 2) for i in range(50)]
    # refusals: properties too long once the offsets are appended, a record too large
    long_props = "MQTT_TOPIC\x01" + "t" * 250 + "\x02INNER_MULTI_DISPATCH\x01" + LMQS[0]
    batches.insert(20, _batch([BatchItem(0, b"ok", "INNER_MULTI_DISPATCH\x01" + LMQS[1]),
                               BatchItem(0, b"x", long_props)]))
    batches.insert(30, _batch([BatchItem(0, b"y" * 40000, "INNER_MULTI_DISPATCH\x01" + LMQS[2])]))
    taken = _counting(monkeypatch)
    results = [fast.put_batch(b) for b in batches]
    assert taken[0] >= 40  # the C planner took the batches (else this compares Python twice)
    monkeypatch.setattr(put_batch_mod, "plan_batch_lmqs", None)
    refused = 0
    for b, a in zip(batches, results, strict=True):
        r = slow.put_batch(b)
        assert (a.status, a.remark, a.queue_offset, a.msg_ids, a.wrote_bytes, a.physical_offset,
                a.lmq_offsets) == \
               (r.status, r.remark, r.queue_offset, r.msg_ids, r.wrote_bytes, r.physical_offset,
                r.lmq_offsets)
        refused += not a.ok
        for mid in a.msg_ids:
            off = int(mid[16:], 16)
            assert _stamp_free(fast.read_record(off)) == _stamp_free(slow.read_record(off))
    assert refused == 2
    for name in LMQS:
        n = fast.max_offset(name, 0)
        assert n == slow.max_offset(name, 0) > 50
        assert fast.units(name, 0, 0, n) == slow.units(name, 0, 0, n)
    for q in range(2):
        n = fast.max_offset("T", q)
        assert fast.units("T", q, 0, n) == slow.units("T", q, 0, n)


def test_new_lmqs_and_mixed_batches_take_the_python_path(open_store, monkeypatch):
    store = open_store()
    taken = _counting(monkeypatch)
    items = [BatchItem(0, b"a", "INNER_MULTI_DISPATCH\x01%LMQ%new")]
    r = store.put_batch(_batch(items * 3))  # a new LMQ: counted by the Python path
    assert r.ok and r.lmq_offsets == [0] and store.max_offset("%LMQ%new", 0) == 3
    assert taken[0] == 0
    r = store.put_batch(_batch(items * 3))
    assert r.ok and r.lmq_offsets == [3] and store.max_offset("%LMQ%new", 0) == 6
    assert taken[0] == 1
    # an item with a non-canonical properties string (dict path) sends the batch to Python
    odd = BatchItem(0, b"b", "TAGS\x01a\x02TAGS\x01b\x02INNER_MULTI_DISPATCH\x01%LMQ%new")
    r = store.put_batch(_batch([items[0], odd]))
    assert r.ok and r.lmq_offsets == [6] and store.max_offset("%LMQ%new", 0) == 8
    assert taken[0] == 1


def _item(how, pb=b"P\x01v", blen=1):
    return (0, 0, blen, pb, 0, 100, 0, None, None, how)


def test_plan_batch_lmqs_refuses_without_changing_anything():
    from core.store.speedups import plan_batch_lmqs as plan
    memo = {"%LMQ%a,%LMQ%b": ["%LMQ%a", "%LMQ%b"], "%LMQ%d": ["%LMQ%a", "%LMQ%a"],
            "%LMQ%x": [1], "%LMQ%e": []}
    cache = {"%LMQ%a": 5, "%LMQ%b": 1, "%LMQ%z": 0}
    items = [_item(False), _item("%LMQ%a,%LMQ%b"), _item("%LMQ%a,%LMQ%b")]
    before = list(items)
    for bad in (
        [_item("%LMQ%unknown")],  # not in the memo
        [_item("%LMQ%d")],  # a duplicate name
        [_item("%LMQ%x")],  # not a str
        [_item("%LMQ%e")],  # empty
        [_item(True)],  # the dict path
    ):
        assert plan(bad, memo, cache, "T", 100, 10_000, 1000) is None
    assert plan(items, memo, cache, "%LMQ%a", 100, 10_000, 1000) is None  # topic cached
    assert plan(items, memo, {"%LMQ%a": 0, "%LMQ%b": 1}, "T", 100, 10_000, 1000) is None
    with pytest.raises(TypeError):
        plan(items, memo, {"%LMQ%a": "5", "%LMQ%b": 1}, "T", 100, 10_000, 1000)
    with pytest.raises(TypeError):
        plan([("short",)], memo, cache, "T", 100, 10_000, 1000)
    with pytest.raises(TypeError):
        plan(tuple(items), memo, cache, "T", 100, 10_000, 1000)
    with pytest.raises(TypeError):
        plan(items, memo, cache, "T", True, 10_000, 1000)
    assert items == before and cache == {"%LMQ%a": 5, "%LMQ%b": 1, "%LMQ%z": 0}
    assert plan(items, memo, cache, "T", 100, 10_000, 10) == \
        ("PROPERTIES_SIZE_EXCEEDED", "properties size 32 exceeds 10")
    assert plan(list(before), memo, cache, "T", 100, 120, 1000)[0] == "MESSAGE_ILLEGAL"
    names, bases, first = plan(items, memo, cache, "T", 100, 10_000, 1000)
    assert first is None and bases == {"%LMQ%a": 5, "%LMQ%b": 1}
    assert names == [None, ("%LMQ%a", "%LMQ%b"), ("%LMQ%a", "%LMQ%b")]
    assert items[0] is before[0]
    assert items[1][3] == b"P\x01v\x02INNER_MULTI_QUEUE_OFFSET\x015,1" and items[1][9] is False
    assert items[2][3].endswith(b"\x016,2") and items[2][5] == 100 + 1 + len(items[2][3])
    assert cache == {"%LMQ%a": 5, "%LMQ%b": 1, "%LMQ%z": 0}  # staging moves the cache


def test_stage_batch_lmqs_checks_before_staging():
    from core.store.speedups import stage_batch_lmqs as stage
    units = bytearray(range(40))
    names = [("%LMQ%a",), ("%LMQ%a", "%LMQ%b")]
    for args in (
        ({}, {}, names, {"%LMQ%a": 3}, units, 7),  # %LMQ%b has no base
        ({}, {}, names, {"%LMQ%a": 3, "%LMQ%b": -1}, units, 7),
        ({}, {}, names, {"%LMQ%a": 3, "%LMQ%b": 2}, bytearray(39), 7),
        ({"%LMQ%a": (1,)}, {}, names, {"%LMQ%a": 3, "%LMQ%b": 2}, units, 7),
        ({}, {}, [["%LMQ%a"]], {"%LMQ%a": 3}, units, 7),
        ({}, {}, [(b"%LMQ%a",)], {b"%LMQ%a": 3}, units, 7),
        ({}, {}, names, {"%LMQ%a": 3, "%LMQ%b": 2}, bytes(units), 7),
    ):
        staged, cache = args[0], args[1]
        snapshot = (dict(staged), dict(cache))
        with pytest.raises((TypeError, ValueError)):
            stage(*args)
        assert (staged, cache) == snapshot
    staged, cache = {"%LMQ%a": [2, b"old"]}, {"%LMQ%a": 3, "%LMQ%b": 2}
    assert stage(staged, cache, names, {"%LMQ%a": 3, "%LMQ%b": 2}, units, 7) == 3
    u0 = bytes(range(20)) + (7).to_bytes(8, "big")
    u1 = bytes(range(20, 40)) + (7).to_bytes(8, "big")
    assert staged == {"%LMQ%a": [2, b"old", 3, u0, 4, u1], "%LMQ%b": [2, u1]}
    assert cache == {"%LMQ%a": 5, "%LMQ%b": 3}
