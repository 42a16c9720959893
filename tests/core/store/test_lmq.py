"""LMQ index and multi-dispatch (docs/protocol.md §10.2)."""

from __future__ import annotations

import os

from core.common.codec import decode_record
from core.common.message import InnerMessage
from core.store import GetStatus, PutStatus

from .conftest import lmq_msg, msg


def _bodies(result):
    return [decode_record(b).body for b in result.buffers]


def test_multi_dispatch_assigns_offsets_before_encoding(open_store):
    store = open_store()
    r1 = store.put(lmq_msg(["%LMQ%a", "%LMQ%b"], body=b"1", WAIT="true"))
    r2 = store.put(lmq_msg(["%LMQ%b", "%LMQ%c"], body=b"2"))
    r3 = store.put(lmq_msg(["%LMQ%a", "%LMQ%b", "%LMQ%c"], body=b"3", queue_id=4))
    assert (r1.lmq_offsets, r2.lmq_offsets, r3.lmq_offsets) == ([0, 0], [1, 0], [1, 2, 1])
    m3 = store.look_message(r3.physical_offset)
    assert m3.properties["INNER_MULTI_QUEUE_OFFSET"] == "1,2,1"
    assert m3.lmq_offsets() == {"%LMQ%a": 1, "%LMQ%b": 2, "%LMQ%c": 1}
    m1 = store.look_message(r1.physical_offset)
    assert "WAIT" not in m1.properties  # dropped from multi-dispatched messages, as RocketMQ
    assert _bodies(store.get("%LMQ%b", 0, 0)) == [b"1", b"2", b"3"]
    assert _bodies(store.get("%LMQ%a", 0, 0)) == [b"1", b"3"]
    assert _bodies(store.get("%LMQ%c", 0, 1)) == [b"3"]
    assert (store.max_offset("%LMQ%b", 0), store.min_offset("%LMQ%b", 0)) == (3, 0)
    # The message's own queue got its unit too.
    assert store.max_offset("T", 0) == 2 and store.max_offset("T", 4) == 1
    assert store.queue_ids("%LMQ%a") == [0] and store.queue_ids("%LMQ%zz") == []
    assert store.stats()["lmq_count"] == 3
    # Records in an LMQ describe the original topic, queue and queue offset.
    rec = decode_record(store.get("%LMQ%c", 0, 1).buffers[0])
    assert (rec.topic, rec.queue_id, rec.queue_offset) == ("T", 4, 0)


def test_duplicate_names_and_own_topic(open_store):
    store = open_store()
    r = store.put(lmq_msg(["%LMQ%a", "%LMQ%a", "T", "Other"], queue_id=1))
    assert r.lmq_offsets == [0, 0, 0, 0]
    assert store.max_offset("%LMQ%a", 0) == 1
    assert store.max_offset("T", 1) == 1  # not dispatched twice to its own queue
    assert store.max_offset("Other", 1) == 1  # a non-LMQ name: that topic, same queue id
    assert _bodies(store.get("Other", 1, 0)) == [b"x"]


def test_put_to_an_lmq_topic_directly(open_store):
    store = open_store()
    r = store.put(InnerMessage("%LMQ%direct", b"d", properties={"INNER_MULTI_DISPATCH": "%LMQ%other"}))
    assert r.ok and r.queue_offset == 0 and r.lmq_offsets == [0]
    assert _bodies(store.get("%LMQ%direct", 0, 0)) == [b"d"]
    assert _bodies(store.get("%LMQ%other", 0, 0)) == [b"d"]
    assert store.topics() == []  # no file queue was created


def test_switches_off(open_store, tmp_path):
    off = open_store(tmp_path / "off", enable_multi_dispatch=False)
    r = off.put(lmq_msg(["%LMQ%a"]))
    assert r.ok and r.lmq_offsets == []
    assert off.max_offset("%LMQ%a", 0) == 0
    assert "INNER_MULTI_QUEUE_OFFSET" not in off.look_message(r.physical_offset).properties
    # enable_lmq off: %LMQ% names are ordinary topics (file queues with the message's qid).
    nolmq = open_store(tmp_path / "nolmq", enable_lmq=False)
    r = nolmq.put(lmq_msg(["%LMQ%a"], queue_id=2))
    assert r.ok and r.lmq_offsets == [0]
    assert nolmq.max_offset("%LMQ%a", 2) == 1
    assert "%LMQ%a" in nolmq.topics()


def test_lmq_survives_restart_and_tiny_cache(open_store, tmp_path):
    path = tmp_path / "s"
    store = open_store(path, lmq_offset_cache_size=3, kv_batch_max_ops=7)
    for i in range(60):
        r = store.put(lmq_msg([f"%LMQ%q{i % 10}", "%LMQ%all"], body=b"%d" % i))
        assert r.lmq_offsets == [i // 10, i]
    assert store.max_offset("%LMQ%q3", 0) == 6
    assert _bodies(store.get("%LMQ%q3", 0, 0)) == [b"3", b"13", b"23", b"33", b"43", b"53"]
    store.shutdown()
    again = open_store(path, lmq_offset_cache_size=3)
    assert again.max_offset("%LMQ%all", 0) == 60
    assert again.stats()["lmq_count"] == 11
    r = again.put(lmq_msg(["%LMQ%q3"]))
    assert r.lmq_offsets == [6]
    got = again.get("%LMQ%all", 0, 50, 32)
    assert _bodies(got) == [b"%d" % i for i in range(50, 60)]
    assert again.get("%LMQ%all", 0, 60).status is GetStatus.OFFSET_OVERFLOW_ONE


def test_lmq_units_offset_by_time_and_delete(open_store):
    store = open_store()
    rs = [store.put(lmq_msg(["%LMQ%t"], body=b"%d" % i)) for i in range(5)]
    units = store.units("%LMQ%t", 0, 1, 10)
    assert [u[0] for u in units] == [r.physical_offset for r in rs[1:]]
    assert store.offset_by_time("%LMQ%t", 0, rs[2].store_timestamp) <= 2
    assert store.offset_by_time("%LMQ%t", 0, rs[4].store_timestamp + 1) == 5
    assert store.earliest_message_time("%LMQ%t", 0) == rs[0].store_timestamp
    store.delete_topic("%LMQ%t")
    assert store.max_offset("%LMQ%t", 0) == 0
    assert store.stats()["lmq_count"] == 0
    assert store.put(lmq_msg(["%LMQ%t"])).lmq_offsets == [0]


def test_lmq_count_limit(open_store, tmp_path):
    store = open_store(max_lmq_consume_queue_num=3)
    assert store.put(lmq_msg(["%LMQ%a", "%LMQ%b"])).ok
    r = store.put(lmq_msg(["%LMQ%a", "%LMQ%c", "%LMQ%d"]))
    assert r.status is PutStatus.LMQ_CONSUME_QUEUE_NUM_EXCEEDED
    assert store.put(lmq_msg(["%LMQ%a", "%LMQ%c"])).ok  # existing + one new: fits
    assert store.put(InnerMessage("%LMQ%e", b"x")).status is PutStatus.LMQ_CONSUME_QUEUE_NUM_EXCEEDED
    # In a batch, LMQs created by earlier messages count too.
    other = open_store(tmp_path / "other", max_lmq_consume_queue_num=2)
    r = other.put_batch([lmq_msg(["%LMQ%a"]), lmq_msg(["%LMQ%b"]), lmq_msg(["%LMQ%c"])])
    assert r.status is PutStatus.LMQ_CONSUME_QUEUE_NUM_EXCEEDED
    assert other.put_batch([lmq_msg(["%LMQ%a"]), lmq_msg(["%LMQ%b", "%LMQ%a"])]).ok


def test_batch_with_lmq_dispatch(open_store):
    store = open_store()
    store.put(lmq_msg(["%LMQ%a"]))
    batch = [lmq_msg(["%LMQ%a", f"%LMQ%p{i % 2}"], body=b"%d" % i) for i in range(6)]
    r = store.put_batch(batch)
    assert r.ok and r.lmq_offsets == [1, 0]
    assert store.max_offset("%LMQ%a", 0) == 7
    assert store.max_offset("%LMQ%p1", 0) == 3
    for i, mid in enumerate(r.msg_ids):
        m = store.look_message(int(mid[16:], 16))
        assert m.lmq_offsets() == {"%LMQ%a": i + 1, f"%LMQ%p{i % 2}": i // 2}
    assert _bodies(store.get("%LMQ%p0", 0, 0)) == [b"0", b"2", b"4"]


def test_a_million_lmqs_cost_no_files(open_store, tmp_path):
    """Small version of the slow test: LMQs create no files or directories."""
    store = open_store(tmp_path / "s")
    for i in range(2000):
        store.put(lmq_msg([f"%LMQ%dev{i}"]))
    assert os.listdir(tmp_path / "s" / "consumequeue") == ["T"]
    assert store.stats()["lmq_count"] == 2000
    assert store.get("%LMQ%dev1999", 0, 0).message_count == 1


def test_unknown_lmq_reads(open_store):
    store = open_store()
    g = store.get("%LMQ%none", 0, 0)
    assert g.status is GetStatus.NO_MESSAGE_IN_QUEUE
    assert store.get("%LMQ%none", 0, 3).status is GetStatus.OFFSET_OVERFLOW_BADLY
    assert store.get("%LMQ%bad name", 0, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    assert store.min_offset("%LMQ%none", 0) == 0
    store.put(msg())
    assert store.units("%LMQ%none", 0, 0, 5) == []


def test_rocksdb_write_failure_refuses_puts_until_it_works(open_store):
    store = open_store(kv_batch_max_ops=1)
    real = store._kv.db

    class Failing:
        def __getattr__(self, name):
            return getattr(real, name)

        def write(self, *args):
            raise OSError("simulated RocksDB failure")

    store._kv.db = Failing()
    r = store.put(lmq_msg(["%LMQ%f"], body=b"a"))
    assert r.ok  # appended and in its queue; the LMQ unit stays staged
    r = store.put(lmq_msg(["%LMQ%f"], body=b"b"))
    assert r.status is PutStatus.SERVICE_NOT_AVAILABLE and "RocksDB" in r.remark
    store._kv.db = real
    r = store.put(lmq_msg(["%LMQ%f"], body=b"c"))
    assert r.ok and r.lmq_offsets == [1]
    assert _bodies(store.get("%LMQ%f", 0, 0)) == [b"a", b"c"]


def test_deleted_lmq_stays_deleted_after_kill_9(tmp_path):
    """DELETE_TOPIC on an LMQ survives a crash right after it (RocksDB WAL off)."""
    import signal
    import subprocess
    import sys
    import textwrap

    from core.store import MessageStore, StoreConfig

    from .conftest import SMALL

    script = textwrap.dedent(f"""
        import os, signal, sys
        from core.common.message import InnerMessage
        from core.store import MessageStore, StoreConfig
        store = MessageStore(StoreConfig({str(tmp_path / "s")!r}, **{SMALL!r}))
        store.start()
        for i in range(50):
            store.put(InnerMessage(topic="T", body=b"m%d" % i, properties={{
                "INNER_MULTI_DISPATCH": "%LMQ%gone,%LMQ%kept"}}))
        store.delete_topic("%LMQ%gone")
        print("deleted", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -signal.SIGKILL and "deleted" in proc.stdout, proc.stderr
    store = MessageStore(StoreConfig(str(tmp_path / "s"), **SMALL))
    store.start()
    try:
        assert store.max_offset("%LMQ%gone", 0) == 0
        assert store.max_offset("%LMQ%kept", 0) == 50
        assert store.stats()["lmq_count"] == 1
    finally:
        store.shutdown()
