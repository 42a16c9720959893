"""put_batch(MessageBatch): a batch send body stored without an object per message stores
what the list path stores for the same batch (docs/protocol.md §7.7)."""

from __future__ import annotations

import random

import pytest

import core.store.put_batch as put_batch_mod
from core.common.codec import BatchItem, RecordError, decode_batch, decode_record, encode_batch
from core.common.message import InnerMessage, MessageBatch
from core.common.properties import decode_properties, encode_properties
from core.common.taghash import tag_hash
from core.store import PutStatus

BORN = b"\x0a\x00\x00\x02\x00\x00\xc3\x50"
BATCH_PROPS = {"CLUSTER": "DefaultCluster"}


def _batch(items: list[BatchItem], topic: str = "T", queue_id: int = 1,
           props: dict | None = None) -> MessageBatch:
    return MessageBatch(
        topic, queue_id, encode_batch(items), encode_properties(BATCH_PROPS if props is None else props),
        sys_flag=0, born_timestamp=1700000000000, born_host=BORN, reconsume_times=2,
    )


def _as_list(batch: MessageBatch) -> list[InnerMessage]:
    """What the broker built before MessageBatch existed: decode, drop WAIT, add the
    batch-level properties."""
    extra = decode_properties(batch.properties)
    out = []
    for item in decode_batch(batch.body):
        props = decode_properties(item.properties)
        props.pop("WAIT", None)
        props.update(extra)
        out.append(InnerMessage(
            batch.topic, item.body, batch.queue_id, item.flag, props, batch.sys_flag,
            batch.born_timestamp, batch.born_host, batch.store_host, batch.reconsume_times,
        ))
    return out


def _records(store, result) -> list:
    return [decode_record(store.read_record(int(mid[16:], 16))) for mid in result.msg_ids]


def _random_items(rng: random.Random, n: int) -> list[BatchItem]:
    items = []
    for i in range(n):
        pairs = [("UNIQ_KEY", f"U{rng.randrange(10**6)}-{i}")]
        if rng.random() < 0.7:
            pairs.append(("TAGS", rng.choice(["TagA", "TagB", "标签"])))
        if rng.random() < 0.5:
            pairs.append(("WAIT", rng.choice(["true", "false"])))
        if rng.random() < 0.4:
            pairs.append(("KEYS", rng.choice(["k1", "k1 k2", " k3  k4 "])))
        if rng.random() < 0.3:
            pairs.append(("INNER_MULTI_DISPATCH", rng.choice(["%LMQ%a", "%LMQ%a,%LMQ%b"])))
        if rng.random() < 0.2:
            pairs.append(("CLUSTER", "other"))  # the batch level wins
        if rng.random() < 0.2:
            pairs.append(("TAGS", ""))  # empty pairs are skipped
        rng.shuffle(pairs)
        text = "\x02".join(k + "\x01" + v for k, v in pairs)
        if rng.random() < 0.5:
            text += "\x02"  # the C++ client ends with a separator
        items.append(BatchItem(rng.randrange(4), rng.randbytes(rng.randrange(0, 300)), text))
    return items


def test_batch_body_stores_what_the_list_path_stores(open_store, tmp_path):
    raw_store = open_store(tmp_path / "raw")
    list_store = open_store(tmp_path / "list")
    rng = random.Random(3)
    for _ in range(40):
        batch = _batch(_random_items(rng, rng.randrange(1, 20)), queue_id=rng.randrange(3))
        a = raw_store.put_batch(batch)
        b = list_store.put_batch(_as_list(batch))
        assert a.status is b.status is PutStatus.OK
        assert (a.queue_offset, a.lmq_offsets, len(a.msg_ids)) == (b.queue_offset, b.lmq_offsets, len(b.msg_ids))
        for x, y in zip(_records(raw_store, a), _records(list_store, b), strict=True):
            assert x.properties == y.properties
            assert list(x.properties) == list(y.properties)
            assert "WAIT" not in x.properties and x.properties["CLUSTER"] == "DefaultCluster"
            assert (x.body, x.flag, x.queue_id, x.queue_offset, x.sys_flag, x.born_timestamp,
                    x.born_host, x.reconsume_times, x.body_crc) == \
                   (y.body, y.flag, y.queue_id, y.queue_offset, y.sys_flag, y.born_timestamp,
                    y.born_host, y.reconsume_times, y.body_crc)
    for q in range(3):
        assert raw_store.max_offset("T", q) == list_store.max_offset("T", q)
        n = raw_store.max_offset("T", q)
        units_a = raw_store.units("T", q, 0, n)
        units_b = list_store.units("T", q, 0, n)
        assert [u[2] for u in units_a] == [u[2] for u in units_b]  # tag codes
    for lmq in ("%LMQ%a", "%LMQ%b"):
        assert raw_store.max_offset(lmq, 0) == list_store.max_offset(lmq, 0) > 0
    for key in ("k1", "k2", "k3", "k4"):
        assert len(raw_store.query_by_key("T", key, 1000)) == len(list_store.query_by_key("T", key, 1000)) > 0


def test_batch_body_layout_and_lookups(open_store):
    store = open_store()
    items = [
        BatchItem(7, b"b0", "KEYS\x01bk0\x02TAGS\x01TagB\x02UNIQ_KEY\x01U0\x02WAIT\x01true\x02"),
        BatchItem(0, b"b1", "WAIT\x01true\x02TAGS\x01TagC\x02UNIQ_KEY\x01U1"),
        BatchItem(0, b"b2", ""),
    ]
    r = store.put_batch(_batch(items))
    assert r.ok and r.queue_offset == 0 and len(r.msg_ids) == 3
    recs = _records(store, r)
    raw = [store.read_record(int(mid[16:], 16)) for mid in r.msg_ids]
    # Java's layout: the sub-message's string (WAIT removed), a separator if it lacks one,
    # then the batch-level properties.
    assert decode_record(raw[0]).properties == {
        "KEYS": "bk0", "TAGS": "TagB", "UNIQ_KEY": "U0", "CLUSTER": "DefaultCluster"}
    assert bytes(raw[0]).endswith(b"UNIQ_KEY\x01U0\x02CLUSTER\x01DefaultCluster")
    assert bytes(raw[1]).endswith(b"TAGS\x01TagC\x02UNIQ_KEY\x01U1\x02CLUSTER\x01DefaultCluster")
    assert bytes(raw[2]).endswith(b"\x00\x16CLUSTER\x01DefaultCluster")
    assert [m.flag for m in recs] == [7, 0, 0]
    assert [m.reconsume_times for m in recs] == [2, 2, 2]
    assert [u[2] for u in store.units("T", 1, 0, 3)] == [tag_hash("TagB"), tag_hash("TagC"), 0]
    assert decode_record(store.query_by_uniq_key("T", "U1")[0]).body == b"b1"
    assert decode_record(store.query_by_key("T", "bk0")[0]).body == b"b0"


def test_batch_level_properties_win(open_store):
    store = open_store()
    items = [BatchItem(0, b"x", "TAGS\x01Own\x02KEYS\x01own")]
    r = store.put_batch(_batch(items, props={"TAGS": "Batch", "KEYS": "bk", "CLUSTER": "C"}))
    assert r.ok
    assert store.units("T", 1, 0, 1)[0][2] == tag_hash("Batch")
    assert store.query_by_key("T", "own") == []
    assert len(store.query_by_key("T", "bk")) == 1


def test_batch_body_multi_dispatch(open_store):
    store = open_store()
    store.put(InnerMessage("T", b"first", properties={"INNER_MULTI_DISPATCH": "%LMQ%m"}))
    items = [BatchItem(0, b"%d" % i, f"INNER_MULTI_DISPATCH\x01%LMQ%m,%LMQ%p{i % 2}\x02WAIT\x01true")
             for i in range(4)]
    r = store.put_batch(_batch(items))
    assert r.ok and r.lmq_offsets == [1, 0]
    for i, m in enumerate(_records(store, r)):
        assert m.lmq_offsets() == {"%LMQ%m": i + 1, f"%LMQ%p{i % 2}": i // 2}
        assert "WAIT" not in m.properties
    assert store.max_offset("%LMQ%m", 0) == 5


def test_bad_batch_bodies_write_nothing(open_store):
    """Malformed bodies get the remark the broker gave when it split batches itself."""
    store = open_store()
    good = encode_batch([BatchItem(0, b"ok", "TAGS\x01A")])
    bad_plen = bytearray(good)
    bad_plen[22:24] = b"\x00\x09"  # properties length past the sub-message
    negative = bytearray(good)
    negative[16:20] = b"\xff\xff\xff\xff"  # body length -1
    for body in (good[:10], good + good[:25], good + good[:21], bytes(bad_plen), bytes(negative)):
        try:
            decode_batch(body)
        except RecordError as exc:
            expected = f"bad batch body: {exc}"
        else:
            raise AssertionError("not malformed")
        r = store.put_batch(MessageBatch("T", 0, body, "CLUSTER\x01C", born_host=BORN))
        assert (r.status, r.remark) == (PutStatus.MESSAGE_ILLEGAL, expected)
    r = store.put_batch(MessageBatch("T", 0, b"", "CLUSTER\x01C", born_host=BORN))
    assert (r.status, r.remark) == (PutStatus.MESSAGE_ILLEGAL, "empty batch")
    assert store.max_offset("T", 0) == 0 and store.max_physical_offset == 0
    # Fits alone, not with the batch-level properties appended.
    big = MessageBatch("T", 0, encode_batch([BatchItem(0, b"x", "A\x01" + "v" * 32760)]),
                       "CLUSTER\x01C", born_host=BORN)
    assert store.put_batch(big).status is PutStatus.PROPERTIES_SIZE_EXCEEDED
    assert store.put_batch(MessageBatch("T", 0, good, born_host=b"short")).status is PutStatus.MESSAGE_ILLEGAL
    assert store.put_batch(MessageBatch("bad topic", 0, good, born_host=BORN)).status is PutStatus.MESSAGE_ILLEGAL
    assert store.max_physical_offset == 0


def test_invalid_utf8_properties_are_replaced(open_store, tmp_path):
    store = open_store()
    body = bytearray(encode_batch([BatchItem(0, b"x", "TAGS\x01AB\x02K\x01vv")]))
    body[-2:] = b"\xff\xfe"  # invalid UTF-8 in a value
    r = store.put_batch(MessageBatch("T", 0, bytes(body), "CLUSTER\x01C", born_host=BORN))
    assert r.ok
    [m] = _records(store, r)
    assert m.properties == {"TAGS": "AB", "K": "\ufffd\ufffd", "CLUSTER": "C"}


def _stamp_free(raw) -> bytes:
    b = bytearray(raw)
    b[56:64] = bytes(8)  # the store timestamp differs between two stores
    return bytes(b)


@pytest.mark.skipif(put_batch_mod.split_batch is None, reason="core._speedups not built")
def test_native_batch_path_writes_the_python_path_bytes(open_store, tmp_path, monkeypatch):
    """The C passes (speedups.split_batch / write_batch) against the Python passes, byte for
    byte: records, ConsumeQueue units, key index, results and refusals; across file rolls."""
    native = open_store(tmp_path / "native", commitlog_file_size=16 * 1024)
    python = open_store(tmp_path / "python", commitlog_file_size=16 * 1024)
    rng = random.Random(11)
    batches = []
    for i in range(60):
        items = _random_items(rng, rng.randrange(1, 25))
        # ASCII-only mostly, so C takes them (non-ASCII sends the batch to Python)
        items = [BatchItem(it.flag, it.body, it.properties.replace("标签", "TagZ"))
                 if rng.random() < 0.9 else it for it in items]
        if rng.random() < 0.2:  # a dict-path item whose properties shrink when re-encoded
            items.append(BatchItem(0, b"d", "TAGS\x01a\x02TAGS\x01b\x02INNER_MULTI_DISPATCH\x01"))
        props = rng.choice([BATCH_PROPS, {}, {"CLUSTER": "C", "TAGS": "BT"},
                            {"KEYS": "bk1 bk2", "UNIQ_KEY": "BU", "CLUSTER": "C"}])
        batches.append(_batch(items, queue_id=i % 3, props=props))
    # and refusals
    good = encode_batch([BatchItem(0, b"ok", "TAGS\x01A")])
    batches.append(MessageBatch("T", 0, good + good[:25], "CLUSTER\x01C", born_host=BORN))
    batches.append(MessageBatch("T", 0, encode_batch([BatchItem(0, b"x", "A\x01" + "v" * 32760)]),
                                "CLUSTER\x01C", born_host=BORN))
    batches.append(MessageBatch("T", 0, encode_batch([BatchItem(0, b"x" * 20000, "A\x01b")]),
                                "", born_host=BORN))
    # a refused multi-dispatch item before a malformed one: the first refusal is reported
    bad_lmq = encode_batch([BatchItem(0, b"x", "INNER_MULTI_DISPATCH\x01%LMQ%bad name")])
    batches.append(MessageBatch("T", 0, bad_lmq + good[:25], "", born_host=BORN))
    batches.append(MessageBatch("T", 0, good + bad_lmq, "", born_host=BORN))
    results = []
    for b in batches:
        results.append(native.put_batch(b))
    monkeypatch.setattr(put_batch_mod, "split_batch", None)
    for b, a in zip(batches, results, strict=True):
        r = python.put_batch(b)
        assert (a.status, a.remark, a.queue_offset, a.msg_ids, a.wrote_bytes, a.physical_offset,
                a.lmq_offsets) == \
               (r.status, r.remark, r.queue_offset, r.msg_ids, r.wrote_bytes, r.physical_offset,
                r.lmq_offsets)
        for mid in a.msg_ids:
            off = int(mid[16:], 16)
            assert _stamp_free(native.read_record(off)) == _stamp_free(python.read_record(off))
    assert native.max_physical_offset == python.max_physical_offset
    for q in range(3):
        n = native.max_offset("T", q)
        assert n == python.max_offset("T", q) > 0
        assert native.units("T", q, 0, n) == python.units("T", q, 0, n)
    for key in ("k1", "k2", "k3", "k4", "bk1", "bk2"):
        a = native.query_by_key("T", key, 1000)
        assert a, key
        assert sorted(map(_stamp_free, a)) == sorted(map(_stamp_free, python.query_by_key("T", key, 1000)))
    assert len(native.query_by_uniq_key("T", "BU")) == len(python.query_by_uniq_key("T", "BU")) > 0
    for lmq in ("%LMQ%a", "%LMQ%b"):
        n = native.max_offset(lmq, 0)
        assert n == python.max_offset(lmq, 0) > 0
        assert native.units(lmq, 0, 0, n) == python.units(lmq, 0, 0, n)
