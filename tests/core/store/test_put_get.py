"""put/get: statuses of docs/protocol.md §5.2, filters, batches, bad input, lookups, stats."""

from __future__ import annotations

import time

from core.common.codec import decode_record
from core.common.message import InnerMessage
from core.common.msgid import decode_offset_msg_id
from core.common.taghash import tag_hash
from core.store import GetStatus, PutStatus

from .conftest import msg


class TagFilter:
    """A tiny MessageFilter: tag hash at the CQ level, exact TAGS on the record."""

    def __init__(self, *tags: str) -> None:
        self.tags = set(tags)
        self.codes = {tag_hash(t) for t in tags}
        self.record_checks = 0

    def is_matched_by_consume_queue(self, tags_code: int) -> bool:
        return tags_code in self.codes

    def is_matched_by_commit_log(self, record: memoryview) -> bool:
        self.record_checks += 1
        return decode_record(record).tags in self.tags


def test_put_result_fields(open_store):
    store = open_store()
    r1 = store.put(msg(body=b"one", TAGS="A"))
    r2 = store.put(msg(body=b"two"))
    assert r1.status is PutStatus.OK and r1.remark is None
    assert (r1.physical_offset, r1.queue_offset) == (0, 0)
    assert r2.physical_offset == r1.end_offset == r1.wrote_bytes
    assert r2.queue_offset == 1
    assert r2.end_offset == store.max_physical_offset
    assert abs(r1.store_timestamp - time.time() * 1000) < 60_000
    ip, port, offset = decode_offset_msg_id(r2.msg_ids[0])
    assert (ip, port, offset) == ("127.0.0.1", 0, r2.physical_offset)
    m = store.look_message(r2.physical_offset)
    assert m.body == b"two" and m.queue_offset == 1 and m.commitlog_offset == r2.physical_offset
    assert m.store_timestamp == r2.store_timestamp
    assert bytes(store.read_record(r1.physical_offset)) == bytes(store.get("T", 0, 0, 1).buffers[0])
    assert store.read_record(r2.end_offset) is None
    assert store.read_record(3) is None  # not a record boundary


def test_get_status_table(open_store):
    store = open_store()
    # Empty queue.
    g = store.get("T", 0, 0)
    assert (g.status, g.next_begin_offset) == (GetStatus.NO_MESSAGE_IN_QUEUE, 0)
    g = store.get("T", 0, 5)
    assert (g.status, g.next_begin_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 0)
    for i in range(5):
        store.put(msg(body=b"m%d" % i))
    g = store.get("T", 0, 2, max_count=2)
    assert g.status is GetStatus.FOUND
    assert [decode_record(b).body for b in g.buffers] == [b"m2", b"m3"]
    assert (g.next_begin_offset, g.min_offset, g.max_offset) == (4, 0, 5)
    assert g.message_count == 2 and g.total_size == sum(len(b) for b in g.buffers)
    g = store.get("T", 0, 5)
    assert (g.status, g.next_begin_offset) == (GetStatus.OFFSET_OVERFLOW_ONE, 5)
    g = store.get("T", 0, 9)
    assert (g.status, g.next_begin_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 5)
    # Invalid names / queue ids: no such logic queue, and nothing is created.
    assert store.get("bad/topic", 0, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    assert store.get("T", -1, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    assert store.get("%LMQ%x", 1, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    assert store.topics() == ["T"]


def test_get_limits_count_and_bytes(open_store):
    store = open_store(max_transfer_count=4)
    for _ in range(10):
        store.put(msg(body=b"z" * 100))
    g = store.get("T", 0, 0, max_count=32)
    assert g.message_count == 4  # capped by max_transfer_count
    size = len(g.buffers[0])
    g = store.get("T", 0, 0, max_count=4, max_bytes=size * 2 + 1)
    assert g.message_count == 2 and g.next_begin_offset == 2
    g = store.get("T", 0, 0, max_count=4, max_bytes=1)
    assert g.message_count == 1  # the first message always goes


def test_filters(open_store):
    store = open_store()
    for i in range(10):
        store.put(msg(body=b"%d" % i, TAGS="A" if i % 3 == 0 else "B"))
    f = TagFilter("A")
    g = store.get("T", 0, 0, filter=f)
    assert g.status is GetStatus.FOUND
    assert [decode_record(b).body for b in g.buffers] == [b"0", b"3", b"6", b"9"]
    assert g.next_begin_offset == 10
    assert f.record_checks == 4  # the CQ tag code filtered the rest
    g = store.get("T", 0, 1, max_count=1, filter=f)
    assert [decode_record(b).body for b in g.buffers] == [b"3"] and g.next_begin_offset == 4
    g = store.get("T", 0, 0, filter=TagFilter("C"))
    assert (g.status, g.next_begin_offset, g.message_count) == (GetStatus.NO_MATCHED_MESSAGE, 10, 0)

    class RejectAll(TagFilter):
        def is_matched_by_commit_log(self, record):
            return False

    g = store.get("T", 0, 0, filter=RejectAll("A", "B"))
    assert g.status is GetStatus.NO_MATCHED_MESSAGE and g.next_begin_offset == 10


def test_tags_code_override_and_default(open_store):
    store = open_store()
    store.put(InnerMessage("T", b"x", properties={"TAGS": "TagA"}))
    store.put(InnerMessage("T", b"y", properties={"TAGS": "TagA"}, tags_code=123456789))
    store.put(InnerMessage("T", b"z"))
    assert [u[2] for u in store.units("T", 0, 0, 10)] == [2598919, 123456789, 0]


def test_bad_input_writes_nothing(open_store):
    store = open_store(max_message_size=1000)
    cases = [
        (InnerMessage("bad topic", b"x"), PutStatus.MESSAGE_ILLEGAL),
        (InnerMessage("", b"x"), PutStatus.MESSAGE_ILLEGAL),
        (InnerMessage("T" * 128, b"x"), PutStatus.MESSAGE_ILLEGAL),
        (InnerMessage("T", b"x" * 1001), PutStatus.MESSAGE_ILLEGAL),
        (InnerMessage("T", b"x", properties={"P": "v" * 32767}), PutStatus.PROPERTIES_SIZE_EXCEEDED),
        (InnerMessage("T", b"x", queue_id=-1), PutStatus.QUEUE_ID_ILLEGAL),
        (InnerMessage("T", b"x", queue_id=65536), PutStatus.QUEUE_ID_ILLEGAL),
        (InnerMessage("%LMQ%a", b"x", queue_id=1), PutStatus.QUEUE_ID_ILLEGAL),
        (InnerMessage("T", b"x", born_host=b"\0" * 20), PutStatus.MESSAGE_ILLEGAL),
        (msg(INNER_MULTI_DISPATCH="%LMQ%ok,%LMQ%bad name"), PutStatus.LMQ_NAME_ILLEGAL),
        (msg(INNER_MULTI_DISPATCH="%LMQ%"), PutStatus.LMQ_NAME_ILLEGAL),
        (msg(INNER_MULTI_DISPATCH="%LMQ%a,,%LMQ%b"), PutStatus.LMQ_NAME_ILLEGAL),
        (msg(INNER_MULTI_DISPATCH=",".join(f"%LMQ%q{i}" for i in range(1001))), PutStatus.MESSAGE_ILLEGAL),
        (InnerMessage("T", b"x", properties={"P": 5}), PutStatus.MESSAGE_ILLEGAL),
        (InnerMessage("T", b"x", properties={"P": "\ud800"}), PutStatus.MESSAGE_ILLEGAL),
        (InnerMessage("T", "not bytes"), PutStatus.MESSAGE_ILLEGAL),
        (InnerMessage(None, b"x"), PutStatus.MESSAGE_ILLEGAL),
    ]
    for m, status in cases:
        r = store.put(m)
        assert r.status is status, (m, r)
        assert r.remark
        assert r.msg_ids == [] and r.physical_offset == -1
        r = store.put_batch([InnerMessage(m.topic, b"ok", queue_id=m.queue_id), m])
        assert r.status is status, (m, r)
    assert store.max_physical_offset == 0
    assert store.max_offset("%LMQ%ok", 0) == 0
    assert store.topics() == []
    assert store.stats()["put_errors"] == 2 * len(cases)
    assert store.put_batch([]).status is PutStatus.MESSAGE_ILLEGAL
    mixed = store.put_batch([InnerMessage("T", b"a"), InnerMessage("U", b"b")])
    assert mixed.status is PutStatus.MESSAGE_ILLEGAL


def test_put_batch(open_store):
    store = open_store()
    store.put(msg(body=b"first"))
    batch = [InnerMessage("T", b"b%d" % i, properties={"TAGS": "X", "KEYS": f"k{i}"}) for i in range(50)]
    r = store.put_batch(batch)
    assert r.ok and r.queue_offset == 1 and len(r.msg_ids) == 50
    assert store.max_offset("T", 0) == 51
    assert r.end_offset == store.max_physical_offset
    offs = [decode_offset_msg_id(i)[2] for i in r.msg_ids]
    assert offs[0] == r.physical_offset
    for i, off in enumerate(offs):
        m = store.look_message(off)
        assert (m.body, m.queue_offset, m.tags) == (b"b%d" % i, i + 1, "X")
    assert [decode_record(b).body for b in store.query_by_key("T", "k7")] == [b"b7"]


def test_queue_listing_and_delete_topic(open_store):
    store = open_store()
    store.put(msg(queue_id=0))
    store.put(msg(queue_id=3))
    store.put(msg(topic="U"))
    assert store.topics() == ["T", "U"]
    assert store.queue_ids("T") == [0, 3]
    store.delete_topic("T")
    assert store.topics() == ["U"]
    assert store.max_offset("T", 3) == 0
    assert store.put(msg(queue_id=3)).queue_offset == 0


def test_offsets_by_time_and_store_times(open_store):
    store = open_store()
    assert store.offset_by_time("T", 0, 0) == 0
    assert store.earliest_message_time("T", 0) == -1
    times = []
    for i in range(6):
        times.append(store.put(msg(body=b"%d" % i)).store_timestamp)
        time.sleep(0.003)
    assert store.earliest_message_time("T", 0) == times[0]
    assert store.message_store_time("T", 0, 4) == times[4]
    assert store.message_store_time("T", 0, 6) == -1
    assert store.offset_by_time("T", 0, 0) == 0
    assert store.offset_by_time("T", 0, times[3]) == times.index(times[3])
    assert store.offset_by_time("T", 0, times[5] + 1) == 6


def test_key_and_uniq_lookups(open_store):
    store = open_store()
    store.put(msg(body=b"a", KEYS="order-1 user-9", UNIQ_KEY="U1"))
    store.put(msg(body=b"b", KEYS="order-2", UNIQ_KEY="U2"))
    store.put(msg(body=b"c", KEYS="order-1", UNIQ_KEY="U3"))
    store.put(msg(topic="Other", body=b"d", KEYS="order-1", UNIQ_KEY="U1"))
    bodies = [decode_record(b).body for b in store.query_by_key("T", "order-1")]
    assert bodies == [b"c", b"a"]  # newest first
    assert [decode_record(b).body for b in store.query_by_key("T", "order-1", max_num=1)] == [b"c"]
    assert [decode_record(b).body for b in store.query_by_key("T", "user-9")] == [b"a"]
    assert [decode_record(b).body for b in store.query_by_uniq_key("T", "U1")] == [b"a"]
    assert [decode_record(b).body for b in store.query_by_uniq_key("Other", "U1")] == [b"d"]
    assert store.query_by_key("T", "nope") == []
    assert store.index_last_update_timestamp() >= store.look_message(0).store_timestamp
    assert store.query_by_key("T", "order-1", end_ms=0) == []


def test_key_index_off(open_store):
    store = open_store(index_keys=False)
    store.put(msg(KEYS="k", UNIQ_KEY="U"))
    assert store.query_by_key("T", "k") == [] and store.query_by_uniq_key("T", "U") == []


def test_dispatch_listener(open_store):
    store = open_store()
    seen = []
    store.dispatch_listener = lambda t, q, m: seen.append((t, q, m))
    store.put(msg(queue_id=2, INNER_MULTI_DISPATCH="%LMQ%a,%LMQ%b"))
    store.put_batch([msg(queue_id=2), msg(queue_id=2)])
    assert seen == [("T", 2, 1), ("%LMQ%a", 0, 1), ("%LMQ%b", 0, 1), ("T", 2, 3)]


def test_stats(open_store):
    store = open_store()
    for _ in range(20):
        store.put(msg(body=b"x" * 100))
    store.put_batch([msg(), msg()])
    store.put(msg(topic="bad topic"))
    store.get("T", 0, 0, 5)
    s = store.stats()
    assert s["puts"] == 22 and s["put_calls"] == 21 and s["put_errors"] == 1
    assert s["gets"] == 1 and s["get_msgs"] == 5 and s["get_bytes"] > 500
    assert s["put_bytes"] == store.max_physical_offset
    lat = s["put_latency_us"]
    assert 0 < lat["p50"] <= lat["p99"] <= lat["p999"] <= lat["max"]


def test_not_running(tmp_path):
    from core.store import MessageStore, StoreConfig

    store = MessageStore(StoreConfig(str(tmp_path / "s")))
    assert store.put(msg()).status is PutStatus.SERVICE_NOT_AVAILABLE
    assert store.get("T", 0, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE


def test_full_disk_refuses_puts(open_store):
    store = open_store(disk_full_ratio=0.0)
    r = store.put(msg())
    assert r.status is PutStatus.SERVICE_NOT_AVAILABLE and "disk full" in r.remark
    assert store.put_batch([msg(), msg()]).status is PutStatus.SERVICE_NOT_AVAILABLE
    assert store.max_physical_offset == 0 and store.max_offset("T", 0) == 0
