"""Memory under a flood is bounded by bytes, not by message counts (docs/mqtt.md,
"Overload"): the publishes queued towards the broker (`max_pending_bytes`) and the recent
entries kept for readers across all LMQs (`max_recent_bytes`). Large payloads make a
count-only bound hold orders of magnitude more. No assertion is about time."""

from __future__ import annotations

import pytest

from gateway.mqtt import lmq_state
from tests.gateway.mqtt.server_harness import GatewayServer, wait_for
from tests.gateway.mqtt.test_overload import Flood, Reader

SIZE = 16 * 1024  # payload bytes of each flooding PUBLISH
LIMIT = 256 * 1024


def test_queued_publish_bytes_stay_under_max_pending_bytes():
    """Four unpaced publishers of 16 KiB messages: the dispatch queue never holds more
    than `max_pending_bytes`, plus the one PUBLISH each connection hands over before it
    pauses. Message counts would allow 2,000 of them (32 MiB)."""
    per, floods_n = 150, 4
    with GatewayServer(max_pending_bytes=LIMIT) as srv:
        link = srv.gateway.link
        peak = [0]
        submit = link.submit

        def counting_submit(msg, done=None, pid=-1):
            step = submit(msg, done, pid)
            if link.backlog_bytes > peak[0]:
                peak[0] = link.backlog_bytes
            return step  # FULL makes the reader wait for room

        link.submit = counting_submit
        floods = [Flood(srv.port, i, f"mem/q/{i}", per, 0, size=SIZE) for i in range(floods_n)]
        for f in floods:
            f.start()
        for f in floods:
            f.join(60)
        stored = per * floods_n
        assert wait_for(lambda: link.stats["stored"] >= stored, timeout=30)
        assert peak[0] > SIZE  # the queue did fill (the bound is what stopped it)
        assert peak[0] <= LIMIT + floods_n * (SIZE + 64)


def test_recent_entries_of_all_lmqs_stay_under_max_recent_bytes(monkeypatch):
    """One subscriber of four filters, each flooded with 16 KiB messages: the recent
    entries of the four LMQs together hold about `max_recent_bytes` at most (each may
    keep one entry above it), where each LMQ alone could keep 2 MiB; the accounting
    matches what the LMQs really hold, and every message still arrives."""
    per, n = 150, 4
    peak = [0]
    remember = lmq_state.LmqState.remember

    def watched(self, offset, msg):
        remember(self, offset, msg)
        if self.budget.used > peak[0]:
            peak[0] = self.budget.used

    monkeypatch.setattr(lmq_state.LmqState, "remember", watched)
    with GatewayServer(max_recent_bytes=LIMIT) as srv:
        reader = Reader(srv.port, "mem-sub", [(f"mem/r/{i}", 0) for i in range(n)], per * n)
        floods = [Flood(srv.port, i, f"mem/r/{i}", per, 0, size=SIZE) for i in range(n)]
        for f in floods:
            f.start()
        got, _ = reader.result()
        link = srv.gateway.link
        assert sum(len(v) for v in got.values()) == per * n
        held = sum(len(m.payload) for st in link.states.values() for m in st.recent.values())
        assert link.recent_budget.used == held
        assert peak[0] > SIZE
        assert peak[0] <= LIMIT + n * (SIZE + 64)


@pytest.mark.parametrize("entries, limit", [(100, 40_000), (3, 1 << 20)])
def test_message_cache_bounded_by_entries_and_bytes(entries, limit):
    class Msg:
        def __init__(self, size: int) -> None:
            self.payload = b"x" * size

    cache = lmq_state.MessageCache(entries, limit)
    for i in range(50):
        cache[("b", i)] = Msg(1000)
    assert len(cache) <= entries and cache.bytes <= limit
    assert cache.bytes == sum(len(m.payload) for m in cache.values())
    assert ("b", 49) in cache  # the newest stay


class _Msg:
    def __init__(self, size: int) -> None:
        self.payload = b"x" * size


def test_recent_budget_takes_from_the_lmq_written_longest_ago():
    """Past `max_recent_bytes`, an idle LMQ's entries go before a busy one's: the busy
    LMQ's readers keep reading from memory instead of pulling."""
    budget = lmq_state.RecentBudget(10_000)
    idle = lmq_state.LmqState("b", "%LMQ%idle", budget)
    busy = lmq_state.LmqState("b", "%LMQ%busy", budget)
    for i in range(9):
        idle.remember(i, _Msg(1000))
    for i in range(50):
        busy.remember(i, _Msg(1000))
    assert budget.used <= 10_000
    assert not idle.recent and list(busy.recent) == list(range(40, 50))
    assert budget.used == busy.recent_bytes + idle.recent_bytes
    busy.forget_recent()
    assert budget.used == 0 and not budget.order
