"""Store side of replication: chunks cut on a master store, applied to a slave store."""

from __future__ import annotations

import pytest

from core.common.message import InnerMessage
from core.store import MessageStore, StoreConfig
from core.store.ha import ReplicaError, append_chunk, read_chunk

FS = 1 << 20


def _store(path) -> MessageStore:
    s = MessageStore(StoreConfig(str(path), commitlog_file_size=FS,
                                 consume_queue_units_per_file=1000, preallocate_files=False))
    s.start()
    return s


def _replicate(master, slave, batch=64 * 1024) -> int:
    chunks = 0
    while True:
        chunk = read_chunk(master, slave.max_physical_offset, batch)
        if chunk is None:
            return chunks
        append_chunk(slave, slave.max_physical_offset, chunk)
        chunks += 1


def test_slave_rebuilds_queues_and_keys_across_files(tmp_path):
    master, slave = _store(tmp_path / "m"), _store(tmp_path / "s")
    try:
        body = b"b" * 3000
        for i in range(800):  # ~2.4 MB: three CommitLog files, BLANK fillers between
            r = master.put(InnerMessage("T", body + b"%d" % i, queue_id=i % 3,
                                        properties={"KEYS": f"k{i}"}))
            assert r.ok
        assert _replicate(master, slave) > 3
        assert slave.max_physical_offset == master.max_physical_offset
        for q in range(3):
            assert slave.max_offset("T", q) == master.max_offset("T", q)
            got = slave.get("T", q, 0, 32)
            want = master.get("T", q, 0, 32)
            assert [bytes(b) for b in got.buffers] == [bytes(b) for b in want.buffers]
        # Restart: recovery over replicated files finds the same end.
        slave.shutdown()
        slave = _store(tmp_path / "s")
        assert slave.max_physical_offset == master.max_physical_offset
        assert slave.max_offset("T", 2) == master.max_offset("T", 2)
    finally:
        master.shutdown()
        slave.shutdown()


def test_corrupt_or_misplaced_chunk_is_refused(tmp_path):
    master, slave = _store(tmp_path / "m"), _store(tmp_path / "s")
    try:
        for i in range(3):
            assert master.put(InnerMessage("T", b"x%d" % i)).ok
        chunk = bytearray(read_chunk(master, 0, 1 << 20))
        with pytest.raises(ReplicaError):
            append_chunk(slave, 100, bytes(chunk))  # not where the slave's CommitLog ends
        first = len(chunk) // 3
        # Last record: body "x2", topic length + "T", properties length 0 (2 bytes).
        chunk[-6] ^= 0xFF  # its body: the CRC no longer matches
        with pytest.raises(ReplicaError):
            append_chunk(slave, 0, bytes(chunk))
        # The valid records before it were kept and dispatched, nothing after them.
        assert slave.max_offset("T", 0) == 2
        assert slave.max_physical_offset == 2 * first
    finally:
        master.shutdown()
        slave.shutdown()


def test_held_pulls_are_woken_once_per_queue_and_chunk(tmp_path):
    master, slave = _store(tmp_path / "m"), _store(tmp_path / "s")
    calls = []
    slave.dispatch_listener = lambda topic, qid, top: calls.append((topic, qid, top))
    try:
        for i in range(10):
            assert master.put(InnerMessage(f"Topic-{i % 2}", b"v" * i, queue_id=i % 2)).ok
        assert master.put(InnerMessage("T", b"", properties={"KEYS": "k"})).ok
        assert _replicate(master, slave) == 1
        assert sorted(calls) == [("T", 0, 1), ("Topic-0", 0, 5), ("Topic-1", 1, 5)]
    finally:
        master.shutdown()
        slave.shutdown()
