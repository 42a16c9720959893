"""The one-pass planning of INNER_MULTI_DISPATCH (known LMQs, no duplicates) assigns what
the general loop assigns: same statuses, offsets, LMQ counts and limits."""

from __future__ import annotations

import random

from core.common.message import InnerMessage

from .conftest import lmq_msg


class _NoCache(dict):
    """Disables the split-list cache, so every message takes the general loop."""

    def get(self, key, default=None):
        return default

    def __setitem__(self, key, value):
        pass


def _workload(seed: int):
    rng = random.Random(seed)
    names = [f"%LMQ%n{i}" for i in range(12)] + ["T", "Other"]
    for _ in range(400):
        k = rng.randrange(1, 5)
        picked = [rng.choice(names) for _ in range(k)]
        if rng.random() < 0.3:
            picked = sorted(set(picked))
        if rng.random() < 0.5:
            yield "one", lmq_msg(picked, body=b"x", queue_id=rng.randrange(2))
        else:
            qid = rng.randrange(2)
            yield "batch", [lmq_msg(picked if rng.random() < 0.7 else picked[:1], body=b"y",
                                    queue_id=qid) for _ in range(rng.randrange(1, 6))]


def test_fast_planning_agrees_with_the_general_loop(open_store, tmp_path):
    for seed in range(3):
        fast = open_store(tmp_path / f"fast{seed}", max_lmq_consume_queue_num=9)
        slow = open_store(tmp_path / f"slow{seed}", max_lmq_consume_queue_num=9)
        slow._multi_names = _NoCache()
        for kind, item in _workload(seed):
            put = (lambda s, m=item: s.put(m)) if kind == "one" else (lambda s, m=item: s.put_batch(m))
            a, b = put(fast), put(slow)
            assert (a.status, a.remark, a.lmq_offsets, a.queue_offset) == \
                   (b.status, b.remark, b.lmq_offsets, b.queue_offset)
        assert fast.stats()["lmq_count"] == slow.stats()["lmq_count"] == 9
        for i in range(12):
            name = f"%LMQ%n{i}"
            assert fast.max_offset(name, 0) == slow.max_offset(name, 0)
        for q in range(2):
            assert fast.max_offset("Other", q) == slow.max_offset("Other", q)
        assert fast.put(InnerMessage("T", b"z")).queue_offset == slow.put(InnerMessage("T", b"z")).queue_offset
