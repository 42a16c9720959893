"""Restart: torn tails, truncated files, bounded recovery work, rebuilt indexes."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys

from core.common.codec import decode_record
from core.store import GetStatus

from .conftest import lmq_msg, msg
from .store_writer import body_of, lmq_names

WRITER = os.path.join(os.path.dirname(__file__), "store_writer.py")


def crashed_writer(path, flushed: int, unflushed: int) -> list[tuple]:
    """Run a writer that puts `flushed` messages, flushes, puts `unflushed` more and exits
    without shutdown (a crash). Returns (seq, queue offset, phys, lmq offsets) per ack."""
    out = subprocess.run(
        [sys.executable, WRITER, "--dir", str(path), "--tag", "w", "--count", str(flushed),
         "--unflushed", str(unflushed), "--flush-ms", "0"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    acks = []
    for line in out.splitlines():
        if line.startswith("ACK"):
            _, _t, seq, qoff, phys, lmqs = line.split()
            acks.append((int(seq), int(qoff), int(phys), [int(x) for x in lmqs.split(",")]))
    return acks


def commitlog_file(path, phys, fs=64 * 1024):
    return os.path.join(path, "commitlog", str(phys // fs * fs).zfill(20))


def assert_readable(store, acks):
    for seq, qoff, phys, lmq_offsets in acks:
        g = store.get("T", 0, qoff, 1)
        assert g.status is GetStatus.FOUND, (seq, g)
        assert decode_record(g.buffers[0]).body == body_of("w", seq)
        for name, off in zip(lmq_names("w", seq), lmq_offsets, strict=True):
            g = store.get(name, 0, off, 1)
            assert g.status is GetStatus.FOUND and decode_record(g.buffers[0]).commitlog_offset == phys


def test_torn_last_record_is_cut(open_store, tmp_path):
    path = tmp_path / "s"
    acks = crashed_writer(path, flushed=120, unflushed=5)
    seq, qoff, phys, lmq_offsets = acks[-1]
    size = 0
    # Garble a random byte inside the last record (not in the trailing properties padding).
    fname = commitlog_file(path, phys)
    with open(fname, "r+b") as fh:
        fh.seek(phys % (64 * 1024))
        size = int.from_bytes(fh.read(4), "big")
        at = phys % (64 * 1024) + random.choice([0, 5, 30, 88, size // 2])
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0x5A]))
    store = open_store(path)
    rep = store.recovery_report
    assert rep.end == phys
    assert store.max_offset("T", 0) == qoff
    assert store.max_offset("%LMQ%all", 0) == lmq_offsets[0]
    assert_readable(store, acks[:-1])
    # The rest of the file was zeroed and the next record goes where the torn one was.
    with open(fname, "rb") as fh:
        fh.seek(phys % (64 * 1024))
        assert fh.read(size) == bytes(size)
    r = store.put(lmq_msg(["%LMQ%all"]))
    assert (r.physical_offset, r.queue_offset, r.lmq_offsets) == (phys, qoff, [lmq_offsets[0]])


def test_truncated_file_is_cut_and_regrown(open_store, tmp_path):
    path = tmp_path / "s"
    acks = crashed_writer(path, flushed=60, unflushed=3)
    seq, qoff, phys, _ = acks[-1]
    fname = commitlog_file(path, phys)
    os.truncate(fname, phys % (64 * 1024) + 50)  # inside the last record
    store = open_store(path)
    assert os.path.getsize(fname) == 64 * 1024
    assert store.recovery_report.end == phys
    assert store.max_offset("T", 0) == qoff
    assert_readable(store, acks[:-1])
    assert store.put(msg()).physical_offset == phys


def test_crash_without_checkpoint_keeps_unflushed_messages(open_store, tmp_path):
    path = tmp_path / "s"
    acks = crashed_writer(path, flushed=40, unflushed=30)
    store = open_store(path)
    assert_readable(store, acks)
    assert store.max_offset("T", 0) == len(acks)


def test_restart_work_is_bounded_by_the_checkpoint(open_store, tmp_path):
    path = tmp_path / "s"
    store = open_store(path)
    for i in range(3000):  # ~15 files of 64 KiB
        store.put(lmq_msg([f"%LMQ%q{i % 7}"], body=b"x" * 300))
    store.shutdown()
    again = open_store(path)
    rep = again.recovery_report
    assert rep.end == again.max_physical_offset > 10 * 64 * 1024
    assert rep.bytes_scanned == 0 and rep.records_scanned == 0
    assert again.max_offset("%LMQ%q3", 0) == 3000 // 7 + (1 if 3 < 3000 % 7 else 0)


def test_crash_restart_rescans_only_the_tail(open_store, tmp_path):
    path = tmp_path / "s"
    acks = crashed_writer(path, flushed=1500, unflushed=20)
    store = open_store(path)
    rep = store.recovery_report
    # The writer bounds RocksDB replay to 256 KiB (kv_max_replay_bytes): far less than the log.
    assert rep.end > 3 * 256 * 1024
    assert rep.bytes_scanned <= 256 * 1024 + 64 * 1024
    assert_readable(store, acks)


def test_lost_rocksdb_is_rebuilt_from_the_commitlog(open_store, tmp_path):
    path = tmp_path / "s"
    store = open_store(path)
    rs = [store.put(lmq_msg(["%LMQ%a", "%LMQ%b"], body=b"%d" % i, KEYS=f"k{i}")) for i in range(300)]
    store.shutdown()
    shutil.rmtree(path / "lmq")
    again = open_store(path)
    assert again.recovery_report.scan_start == 0
    assert again.max_offset("%LMQ%b", 0) == 300
    g = again.get("%LMQ%a", 0, 290)
    assert [decode_record(b).body for b in g.buffers] == [b"%d" % i for i in range(290, 300)]
    assert [decode_record(b).commitlog_offset for b in again.query_by_key("T", "k7")] == [
        rs[7].physical_offset
    ]


def test_lost_consume_queue_is_rebuilt_when_the_checkpoint_is_gone(open_store, tmp_path):
    path = tmp_path / "s"
    store = open_store(path)
    for i in range(100):
        store.put(msg(body=b"%d" % i, queue_id=i % 2, TAGS="A"))
    store.shutdown()
    shutil.rmtree(path / "consumequeue")
    os.unlink(path / "checkpoint")
    again = open_store(path)
    assert again.max_offset("T", 1) == 50
    assert [u[2] for u in again.units("T", 1, 0, 2)] == [65, 65]  # tag hash of "A"
    assert decode_record(again.get("T", 1, 49, 1).buffers[0]).body == b"99"


def test_consume_queue_units_past_the_end_are_cut(open_store, tmp_path):
    """Simulates a power loss that kept CQ pages but lost the CommitLog tail."""
    path = tmp_path / "s"
    store = open_store(path)
    rs = [store.put(msg(body=b"%d" % i)) for i in range(40)]
    store.shutdown()
    cut = rs[30].physical_offset
    fname = commitlog_file(path, cut)
    os.truncate(fname, cut % (64 * 1024))  # lose records 30..39 (all in the same file?)
    for r in rs[31:]:
        if r.physical_offset // (64 * 1024) != cut // (64 * 1024):
            os.unlink(commitlog_file(path, r.physical_offset))
    os.unlink(path / "checkpoint")  # the checkpoint would have been older
    again = open_store(path)
    assert again.recovery_report.end == cut
    assert again.max_offset("T", 0) == 30
    assert again.put(msg(body=b"new")).queue_offset == 30
