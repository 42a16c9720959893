"""kill -9 a writer mid-stream, restart, and find every acknowledged message."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from core.common.codec import decode_record
from core.store import GetStatus, MessageStore, StoreConfig

from .conftest import SMALL
from .store_writer import body_of, lmq_names

WRITER = os.path.join(os.path.dirname(__file__), "store_writer.py")


def run_writer(path, tag: str, *, min_acks: int, extra=()) -> list[tuple]:
    """Start a writer, kill -9 it after at least `min_acks` acknowledged messages (plus a
    random delay), and return the acknowledgements it printed."""
    proc = subprocess.Popen(
        [sys.executable, WRITER, "--dir", str(path), "--tag", tag, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    acks = []
    try:
        while len(acks) < min_acks:
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"writer died: {proc.stderr.read()}")
            if line.startswith("ACK"):
                acks.append(line)
        time.sleep(random.random() * 0.05)
        os.kill(proc.pid, signal.SIGKILL)
        rest = proc.stdout.read()
    finally:
        proc.kill()
        proc.wait()
    acks.extend(x for x in rest.splitlines(keepends=True) if x.endswith("\n"))
    out = []
    for line in acks:
        _, t, seq, qoff, phys, lmqs = line.split()
        out.append((t, int(seq), int(qoff), int(phys), [int(x) for x in lmqs.split(",")]))
    return out


def verify(store: MessageStore, acks: list[tuple]) -> None:
    """Every acknowledged message is readable from its queue and from each of its LMQs,
    and each LMQ holds them in order."""
    last_in_lmq: dict[str, int] = {}
    for tag, seq, qoff, phys, lmq_offsets in acks:
        g = store.get("T", 0, qoff, 1)
        assert g.status is GetStatus.FOUND, (tag, seq, qoff, g)
        m = decode_record(g.buffers[0])
        assert m.body == body_of(tag, seq) and m.commitlog_offset == phys
        for name, off in zip(lmq_names(tag, seq), lmq_offsets, strict=True):
            g = store.get(name, 0, off, 1)
            assert g.status is GetStatus.FOUND, (name, off, g)
            assert decode_record(g.buffers[0]).commitlog_offset == phys
            assert off > last_in_lmq.get(name, -1)
            last_in_lmq[name] = off


def crash_loop(tmp_path, kills: int, extra=()) -> None:
    path = tmp_path / "store"
    acks: list[tuple] = []
    for k in range(kills):
        acks += run_writer(path, f"k{k}", min_acks=random.randint(30, 300), extra=extra)
    store = MessageStore(StoreConfig(str(path), **SMALL))
    store.start()
    try:
        verify(store, acks)
        assert store.max_offset("%LMQ%all", 0) >= len(acks)
        assert store.put(store_writer_msg()).ok
        # key and uniq index entries were rebuilt too
        tag, seq = acks[-1][0], acks[-1][1]
        assert [decode_record(b).body for b in store.query_by_key("T", f"{tag}-{seq}")] == [
            body_of(tag, seq)
        ]
    finally:
        store.shutdown()


def store_writer_msg():
    from .store_writer import make

    return make("after", 0)


def test_kill_9_loses_no_acknowledged_message(tmp_path):
    crash_loop(tmp_path, kills=2)


@pytest.mark.slow
def test_kill_9_loop(tmp_path):
    crash_loop(tmp_path, kills=20)


@pytest.mark.slow
def test_kill_9_loop_with_rocksdb_wal(tmp_path):
    crash_loop(tmp_path, kills=4, extra=("--wal",))
