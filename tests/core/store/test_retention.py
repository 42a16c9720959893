"""Retention: whole CommitLog files go by age or disk use; queue minimums follow."""

from __future__ import annotations

import os
import time

from core.common.codec import decode_record
from core.store import GetStatus

from .conftest import lmq_msg, msg

FAR_FUTURE = int(time.time() * 1000) + 10 * 365 * 86_400_000


def fill(store, n=600, **props):
    return [store.put(lmq_msg(["%LMQ%a"], body=b"%d-" % i + b"x" * 300, KEYS=f"k{i}", **props))
            for i in range(n)]


def test_nothing_young_is_deleted(open_store):
    store = open_store()
    fill(store)
    assert store.clean_expired() == 0
    assert store.min_physical_offset == 0


def test_expired_files_go_and_queue_minimums_follow(open_store, tmp_path):
    store = open_store(tmp_path / "s", delete_files_per_pass=100)
    rs = fill(store)
    store.put(msg(topic="Cold", body=b"c" * 300))  # a queue that will not be loaded
    nfiles = len(store.commitlog.files)
    held = store.get("T", 0, 0, 1).buffers[0]  # a reader holding a slice of the first file
    deleted = store.clean_expired(FAR_FUTURE)
    assert deleted == nfiles - 1  # never the current file
    assert len(os.listdir(tmp_path / "s" / "commitlog")) == 1
    clmin = store.min_physical_offset
    assert clmin == store.commitlog.files[0].start > 0
    assert decode_record(held).body.startswith(b"0-")  # still valid after deletion
    assert store.stats()["unreleased_mappings"] >= 1
    first_left = next(i for i, r in enumerate(rs) if r.physical_offset >= clmin)
    assert store.min_offset("T", 0) == first_left
    g = store.get("T", 0, 0)
    assert (g.status, g.next_begin_offset, g.min_offset) == (GetStatus.OFFSET_TOO_SMALL, first_left, first_left)
    g = store.get("T", 0, first_left, 1)
    assert decode_record(g.buffers[0]).body.startswith(b"%d-" % first_left)
    # ConsumeQueue files whose units all point below the minimum are gone.
    cq_files = os.listdir(tmp_path / "s" / "consumequeue" / "T" / "0")
    assert len(cq_files) <= 2 and len(cq_files) < 600 // 64
    # LMQ minimum is corrected lazily on read.
    g = store.get("%LMQ%a", 0, 0)
    assert (g.status, g.next_begin_offset) == (GetStatus.OFFSET_TOO_SMALL, first_left)
    assert store.min_offset("%LMQ%a", 0) == first_left
    assert store.units("%LMQ%a", 0, 0, 3) == [(0, 0, 0)] * 3  # units below it were dropped
    assert store.query_by_key("T", "k0") == []
    assert [decode_record(b).body[:4] for b in store.query_by_key("T", f"k{first_left}")] == [
        b"%d-" % first_left
    ]
    # Reading the cold topic still works (it was written after the minimum).
    assert store.get("Cold", 0, 0).status is GetStatus.FOUND
    held.release()
    # Everything holds after a restart.
    store.shutdown()
    again = open_store(tmp_path / "s")
    assert again.min_physical_offset == clmin
    assert again.min_offset("T", 0) == first_left
    assert again.min_offset("%LMQ%a", 0) == first_left
    assert again.put(lmq_msg(["%LMQ%a"])).lmq_offsets == [600]


def test_disk_pressure_deletes_young_files(open_store):
    store = open_store(disk_max_used_ratio=0.0, delete_files_per_pass=2)
    fill(store)
    assert store.clean_expired() == 2  # bounded per pass
    assert store.min_physical_offset == 2 * 64 * 1024


def test_single_file_is_never_deleted(open_store):
    store = open_store(disk_max_used_ratio=0.0)
    store.put(msg())
    assert store.clean_expired(FAR_FUTURE) == 0
    assert store.get("T", 0, 0).status is GetStatus.FOUND


def test_unloaded_queue_files_follow(open_store, tmp_path):
    store = open_store(tmp_path / "s", delete_files_per_pass=100)
    for _ in range(400):
        store.put(msg(topic="Cold", body=b"x" * 300))
    for _ in range(200):
        store.put(msg(topic="Hot", body=b"x" * 300))
    store.shutdown()
    again = open_store(tmp_path / "s", delete_files_per_pass=100)
    again.put(msg(topic="Hot"))
    assert ("Cold", 0) not in again._cqs
    assert again.clean_expired(FAR_FUTURE) > 0
    cold = os.listdir(tmp_path / "s" / "consumequeue" / "Cold" / "0")
    assert len(cold) == 1  # only the last file is kept
    assert again.get("Cold", 0, 0).status is GetStatus.OFFSET_TOO_SMALL
    assert again.max_offset("Cold", 0) == 400


def test_file_being_written_survives_a_refused_batch_and_disk_pressure(open_store):
    """A batch refused for a full disk may leave a freshly created file after the current
    one; retention must still never delete the file being written."""
    store = open_store(delete_files_per_pass=100)
    acked = [store.put(msg(body=b"a" * 300)) for _ in range(150)]  # a few files
    current_start = store._cur.start
    store._cfg.disk_full_ratio = -1.0  # the disk is "full" from now on
    batch = [msg(body=b"b" * 300) for _ in range(200)]  # would span into new files
    assert not store.put_batch(batch).ok
    store._cfg.disk_max_used_ratio = 0.0  # and retention is under disk pressure
    store.clean_expired(FAR_FUTURE)
    assert store._cur.start == current_start
    assert store.commitlog.files[0].start == current_start  # older files went, not this
    store._cfg.disk_full_ratio = 1.0
    assert store.put(msg(body=b"after")).ok
    last = acked[-1]
    g = store.get("T", 0, last.queue_offset, 1)
    assert g.status is GetStatus.FOUND
    assert decode_record(g.buffers[0]).body == b"a" * 300


def test_retention_due_and_prepare_in_a_worker_thread(open_store):
    """The broker asks `retention_due` on its loop and runs `prepare_retention` (the
    fsyncs) in a worker thread before `clean_expired`."""
    import threading

    store = open_store(delete_files_per_pass=100)
    fill(store)
    assert not store.retention_due()
    assert store.retention_due(FAR_FUTURE)
    worker = threading.Thread(target=store.prepare_retention)
    worker.start()
    worker.join()
    assert store.flushed_offset == store.max_physical_offset
    nfiles = len(store.commitlog.files)
    assert store.clean_expired(FAR_FUTURE) == nfiles - 1
    assert not store.retention_due(FAR_FUTURE)  # only the current file is left
    assert len(store.commitlog.files) == 1
