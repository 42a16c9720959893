"""flush(): thread-safe against concurrent puts, checkpoint, group-commit support."""

from __future__ import annotations

import threading

from core.store.checkpoint import Checkpoint

from .conftest import lmq_msg


def test_flush_from_a_worker_thread_while_putting(open_store, tmp_path):
    store = open_store(tmp_path / "s")
    seen = []
    errors = []
    stop = threading.Event()

    def flusher():
        try:
            while not stop.is_set():
                seen.append(store.flush())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=flusher)
    t.start()
    try:
        for i in range(3000):  # crosses many 64 KiB files and CQ files
            assert store.put(lmq_msg(["%LMQ%a"], queue_id=i % 3, body=b"y" * 200)).ok
    finally:
        stop.set()
        t.join()
    assert not errors
    assert seen == sorted(seen)  # flushed offset never goes back
    assert store.flush() == store.max_physical_offset == store.flushed_offset
    # The checkpoint is written at most once per flush interval, unless forced.
    assert Checkpoint(str(tmp_path / "s" / "checkpoint")).physical_offset <= store.flushed_offset
    store.flush(force_checkpoint=True)
    assert Checkpoint(str(tmp_path / "s" / "checkpoint")).physical_offset == store.flushed_offset


def test_sync_flush_group_commit(open_store):
    """The broker's SYNC_FLUSH: acknowledge once flushed_offset covers end_offset."""
    store = open_store(flush_mode="sync")
    results = [store.put(lmq_msg(["%LMQ%g"])) for _ in range(10)]
    done = threading.Event()
    flushed = []
    threading.Thread(target=lambda: (flushed.append(store.flush()), done.set())).start()
    assert done.wait(10)
    assert all(r.end_offset <= flushed[0] for r in results)
    assert store.flushed_offset >= results[-1].end_offset


def test_checkpoint_slots_survive_a_torn_write(tmp_path):
    path = str(tmp_path / "ck")
    ck = Checkpoint(path)
    assert ck.physical_offset is None
    ck.write(100)
    ck.write(200)
    ck.close()
    # Tear the newest slot: the previous checkpoint is used.
    with open(path, "r+b") as fh:
        fh.seek(0)  # sequence 2 lives in slot 0
        fh.write(b"\xff" * 8)
    assert Checkpoint(path).physical_offset == 100
