"""MessageStore.recent_records: the records of an LMQ whose units are still in memory
(staged since the last RocksDB commit, or written by it), read without committing and
without reading RocksDB — what a POP woken by a dispatch takes (docs/pop.md "Hand-off")."""

from __future__ import annotations

from core.common.codec import decode_record
from core.store import lmq_index
from tests.core.store.conftest import lmq_msg, msg

BIG = 1 << 20


def bodies(bufs):
    return [decode_record(b).body for b in bufs]


def count_calls(obj, name):
    calls = []
    real = getattr(obj, name)

    def wrapper(*a, **kw):
        calls.append(a)
        return real(*a, **kw)

    setattr(obj, name, wrapper)
    return calls


def test_served_from_memory_without_commit_or_read(open_store):
    store = open_store()
    for i in range(3):
        assert store.put(lmq_msg(["%LMQ%a", "%LMQ%b"], body=f"m{i}".encode())).status.name == "OK"
    commits = count_calls(store._kv, "commit")
    reads = count_calls(store._kv, "get_many")
    bufs, max_offset = store.recent_records("%LMQ%a", 0, 32, BIG)
    assert bodies(bufs) == [b"m0", b"m1", b"m2"] and max_offset == 3
    assert bodies(store.recent_records("%LMQ%b", 1, 32, BIG)[0]) == [b"m1", b"m2"]
    assert commits == [] and reads == []
    # The same records a store read gives (that one commits and reads RocksDB).
    got = store.get("%LMQ%a", 0, 0, 32)
    assert [bytes(b) for b in got.buffers] == [bytes(b) for b in bufs]
    assert commits and reads


def test_latest_commits_kept_then_rocksdb(open_store, monkeypatch):
    store = open_store()
    for i in range(3):
        store.put(lmq_msg(["%LMQ%a"], body=f"m{i}".encode()))
    store._commit_kv()  # units of m0..m2 written to RocksDB, and still held
    assert bodies(store.recent_records("%LMQ%a", 1, 32, BIG)[0]) == [b"m1", b"m2"]
    store.put(lmq_msg(["%LMQ%a"], body=b"m3"))
    # Across generations (written by a commit, staged since).
    assert bodies(store.recent_records("%LMQ%a", 0, 32, BIG)[0]) == [b"m0", b"m1", b"m2",
                                                                      b"m3"]
    # Bounded: past the limit the oldest commits' units are let go (read RocksDB).
    monkeypatch.setattr(lmq_index, "RECENT_UNITS_MAX", 2)
    store._commit_kv()
    store.put(lmq_msg(["%LMQ%a"], body=b"m4"))
    store._commit_kv()
    assert store.recent_records("%LMQ%a", 0, 32, BIG) is None
    assert bodies(store.recent_records("%LMQ%a", 4, 32, BIG)[0]) == [b"m4"]
    # At the end: nothing to read (answered from memory); past it: read the store.
    assert store.recent_records("%LMQ%a", 5, 32, BIG) == ([], 5)
    assert store.recent_records("%LMQ%a", 6, 32, BIG) is None
    assert bodies(store.get("%LMQ%a", 0, 0, 32).buffers) == [f"m{i}".encode() for i in range(5)]


def test_bounds_and_refusals(open_store):
    store = open_store()
    for i in range(5):
        store.put(lmq_msg(["%LMQ%a"], body=bytes(100) + bytes([i])))
    assert len(store.recent_records("%LMQ%a", 0, 2, BIG)[0]) == 2
    one = store.recent_records("%LMQ%a", 0, 32, 1)[0]  # the first record always fits
    assert len(one) == 1
    store.put(msg("Plain"))
    assert store.recent_records("Plain", 0, 32, BIG) is None  # file queues: read them
    assert store.recent_records("%LMQ%nope", 0, 32, BIG) is None
    store.delete_topic("%LMQ%a")
    assert store.recent_records("%LMQ%a", 0, 32, BIG) is None
