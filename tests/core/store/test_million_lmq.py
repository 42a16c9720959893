"""A million LMQs, one message each, then a restart (slow tier)."""

from __future__ import annotations

import os
import random

import pytest

from core.common.codec import decode_record
from core.common.message import InnerMessage
from core.store import GetStatus

N = 1_000_000


@pytest.mark.slow
def test_a_million_lmqs(open_store, tmp_path):
    path = tmp_path / "s"
    cfg = {"commitlog_file_size": 64 << 20, "consume_queue_units_per_file": 300_000}
    store = open_store(path, **cfg)
    for start in range(0, N, 1000):
        batch = [
            InnerMessage("Devices", b"%d" % i, properties={"INNER_MULTI_DISPATCH": f"%LMQ%dev{i}"})
            for i in range(start, start + 1000)
        ]
        r = store.put_batch(batch)
        assert r.ok
    assert store.stats()["lmq_count"] == N
    # No file, directory or handle per LMQ.
    assert os.listdir(path / "consumequeue") == ["Devices"]
    store.shutdown()
    again = open_store(path, **cfg)
    assert again.recovery_report.bytes_scanned == 0
    assert again.stats()["lmq_count"] == N
    for i in random.Random(7).sample(range(N), 200) + [0, N - 1]:
        name = f"%LMQ%dev{i}"
        assert again.max_offset(name, 0) == 1
        g = again.get(name, 0, 0)
        assert g.status is GetStatus.FOUND and decode_record(g.buffers[0]).body == b"%d" % i
    assert again.max_offset("Devices", 0) == N
    assert again.put(InnerMessage("Devices", b"x", properties={"INNER_MULTI_DISPATCH": "%LMQ%dev5"})).lmq_offsets == [1]
