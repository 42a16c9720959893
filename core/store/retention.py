"""Retention: delete whole CommitLog files by age or disk use; queue minimums follow.

* A file expires when its newest record is older than `file_reserved_hours`. The newest
  record of a file is older than the first record of the next file, so that record's
  store time decides (no scan of the file); RocketMQ uses the file's mtime instead.
* When the disk holding the store is fuller than `disk_max_used_ratio`, the oldest files
  go regardless of age, until the ratio is met.
* Never the file being written, at most `delete_files_per_pass` files per call.
* Before deleting, everything written is flushed and committed, so no recovery can ever
  need to re-dispatch from a deleted file.
* ConsumeQueue files whose units all point below the new CommitLog minimum are deleted
  (loaded queues and queues only on disk alike); key-index buckets older than the oldest
  remaining record are range-deleted; LMQ minimums are corrected lazily when read.
"""

from __future__ import annotations

import os
import shutil

from core.store.commitlog import store_timestamp
from core.store.consume_queue import delete_expired_files_on_disk


def disk_used_ratio(path: str) -> float:
    """used / (used + available), as `df` computes Use%: blocks reserved for root are
    neither, so `used/total` would under-state how full the disk is for us."""
    usage = shutil.disk_usage(path)
    room = usage.used + usage.free
    return usage.used / room if room else 0.0


def deletion_due(store, now_ms: int) -> bool:
    """Whether a retention pass at `now_ms` would delete the oldest CommitLog file."""
    cfg = store._cfg
    cl = store.commitlog
    cur = store._cur
    if len(cl.files) < 2 or cur is None or cl.files[0].end > cur.start:
        return False
    first = cl.record_at(cl.files[1].start, store._wrote)
    newest_ms = store_timestamp(first) if first is not None else now_ms
    expire_before = now_ms - int(cfg.file_reserved_hours * 3_600_000)
    return newest_ms < expire_before or store.disk_used_ratio() > cfg.disk_max_used_ratio


def clean_expired(store, now_ms: int) -> int:
    """One retention pass; returns the number of CommitLog files deleted."""
    cfg = store._cfg
    cl = store.commitlog
    expire_before = now_ms - int(cfg.file_reserved_hours * 3_600_000)
    deleted = 0
    prepared = False
    while len(cl.files) > 1 and deleted < cfg.delete_files_per_pass:
        # Only files wholly before the one being written: a batch may have created files
        # after it (and been refused), so "not the last file" is not enough.
        cur = store._cur
        if cur is None or cl.files[0].end > cur.start:
            break
        nxt = cl.files[1]
        first = cl.record_at(nxt.start, store._wrote)
        newest_ms = store_timestamp(first) if first is not None else now_ms
        if newest_ms >= expire_before and store.disk_used_ratio() <= cfg.disk_max_used_ratio:
            break
        if not prepared:
            store._commit_kv()
            store.flush(force_checkpoint=True)
            kv = store._kv
            if kv.durable_marker < cl.files[0].end:
                kv.flush_memtable()
            prepared = True
        with store._flush_lock:
            mf = cl.delete_first()
            if not mf.destroy():
                store._zombie_maps += 1  # readers hold slices; freed when they let go
        deleted += 1
    if deleted:
        _follow(store, cl.min_offset)
    return deleted


def _follow(store, clmin: int) -> None:
    """Move queue minimums and the key index after the CommitLog minimum moved."""
    loaded = set()
    for cq in list(store._cqs.values()):
        cq.delete_expired_files(clmin)
        loaded.add(cq.directory)
    root = store._cq_root
    file_bytes = store._cfg.consume_queue_units_per_file * 20
    try:
        topics = os.listdir(root)
    except FileNotFoundError:
        topics = []
    for topic in topics:
        tdir = os.path.join(root, topic)
        try:
            qids = os.listdir(tdir)
        except (NotADirectoryError, FileNotFoundError):
            continue
        for qid in qids:
            qdir = os.path.join(tdir, qid)
            if qdir not in loaded:
                delete_expired_files_on_disk(qdir, file_bytes, clmin)
    first = store.commitlog.record_at(clmin, store._wrote)
    if first is not None:
        store._keys.drop_before(store_timestamp(first))
