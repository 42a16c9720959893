"""The slave's RocksDB batch spans chunks (core/store/ha/replica.py, docs/ha.md "How the
slave applies data"): bounded in operations, CommitLog bytes and time; queries see what
is staged; a slave that dies with a batch staged rebuilds it at recovery."""

from __future__ import annotations

import shutil

from core.common.message import InnerMessage
from core.store import MessageStore, StoreConfig
from core.store.ha import append_chunk, read_chunk, replica

RECORDS = 5000  # 256 B bodies, one key-index entry each: ~1.7 MiB, 5000 operations


def _store(path) -> MessageStore:
    s = MessageStore(StoreConfig(str(path)))
    s.start()
    return s


def _chunks(tmp_path):
    m = _store(tmp_path / "m")
    try:
        for i in range(0, RECORDS, 50):
            batch = [InnerMessage("T", b"x" * 256, queue_id=i // 50 % 4,
                                  properties={"UNIQ_KEY": f"U{i + j:08d}"})
                     for j in range(50)]
            assert m.put_batch(batch).ok
        out, off = [], m.min_physical_offset
        while (c := read_chunk(m, off, 64 * 1024)) is not None:
            out.append((off, bytes(c)))
            off += len(c)
        return out
    finally:
        m.shutdown()


def test_slave_batch_spans_chunks_and_recovery_rebuilds_it(tmp_path):
    chunks = _chunks(tmp_path)
    s = _store(tmp_path / "s")
    try:
        first = s._kv.marker
        for off, data in chunks:
            append_chunk(s, off, data, commit=False)
            assert not replica.slave_commit_if_due(s, now=0.0, since=0.0)
        # Past the master's rule (a write per MiB), nothing written yet: one batch so far.
        assert 0 < s._kv.ops < s._kv_max_ops and s._wrote - first > 1 << 20
        assert s._kv.marker == first
        # A crash now (a copy of the files: no shutdown, the batch never written)...
        shutil.copytree(tmp_path / "s", tmp_path / "crashed")
        # ...while a query of the live slave sees the staged entries.
        assert len(s.query_by_uniq_key("T", "U00004999")) == 1
        assert s._kv.marker == s._wrote
    finally:
        s.shutdown()
    r = _store(tmp_path / "crashed")  # recovery re-dispatches past the marker
    try:
        assert len(r.query_by_uniq_key("T", "U00004999")) == 1
    finally:
        r.shutdown()


def test_slave_batch_bounds(tmp_path):
    chunks = _chunks(tmp_path)
    s = _store(tmp_path / "s")
    try:
        off, data = chunks[0]
        append_chunk(s, off, data, commit=False)
        assert not replica.slave_commit_if_due(s, now=0.5, since=0.0)
        assert replica.slave_commit_if_due(s, now=replica.SLAVE_KV_COMMIT_S, since=0.0)  # age
        assert not replica.slave_commit_if_due(s, now=99.0, since=0.0)  # nothing staged
    finally:
        s.shutdown()
