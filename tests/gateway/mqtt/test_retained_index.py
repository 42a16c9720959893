"""The retained table's level index: same answers as a scan, cost bounded on the loop."""

from __future__ import annotations

import random

import pytest
import trio

from gateway.mqtt.message import MqttMessage, now_ms
from gateway.mqtt.retained import RetainedStore
from gateway.mqtt.session_store import SessionStore
from gateway.mqtt.topics import topic_matches

LEVELS = ["a", "b", "c", "", "$x", "dev"]


def _brute(store: RetainedStore, topic_filter: str) -> set[str]:
    """The old matching: every retained topic tested against the filter."""
    return {t for t in store.messages if topic_matches(topic_filter, t)}


def _random_topic(rng: random.Random) -> str:
    return "/".join(rng.choice(LEVELS) for _ in range(rng.randint(1, 4)))


def _random_filter(rng: random.Random) -> str:
    n = rng.randint(1, 4)
    levels = [rng.choice(LEVELS + ["+", "+"]) for _ in range(n)]
    if rng.random() < 0.3:
        levels[-1] = "#"
    return "/".join(levels)


@pytest.fixture
def store(tmp_path):
    kv = SessionStore(str(tmp_path / "db"))
    yield RetainedStore(kv, max_retained=1_000_000)
    kv.close()


def _put(store: RetainedStore, topic: str, payload: bytes = b"x", expiry_at=None) -> None:
    store.set(MqttMessage(topic, payload, 1, True, expiry_at=expiry_at))


def test_index_matches_brute_force_over_random_topics_and_filters(store):
    rng = random.Random(2109)
    topics = {_random_topic(rng) for _ in range(400)}
    for t in topics:
        _put(store, t)
    # deletions prune the index; the reference sees the same table
    for t in rng.sample(sorted(topics), 80):
        _put(store, t, b"")
    filters = [_random_filter(rng) for _ in range(600)] + ["#", "+", "+/#", "$x/#", "a/#"]
    for f in filters:
        expected = _brute(store, f)
        assert {m.topic for m in store.match(f)} == expected, f
        found, cut = trio.run(store.match_bounded, f, 1_000_000)
        assert not cut and {m.topic for m in found} == expected, f
        assert len(found) == len(expected)  # no duplicates


def test_index_survives_reload_and_drops_expired(tmp_path):
    kv = SessionStore(str(tmp_path / "db"))
    store = RetainedStore(kv, max_retained=100)
    _put(store, "s/1")
    _put(store, "s/2", expiry_at=now_ms() - 1)
    _put(store, "s")
    assert {m.topic for m in store.match("s/#")} == {"s", "s/1"}
    assert store.get("s/2") is None  # expired: removed when found
    kv.close()
    kv = SessionStore(str(tmp_path / "db"))
    again = RetainedStore(kv, max_retained=100)
    again.load()
    assert {m.topic for m in again.match("+/+")} == {"s/1"}
    assert {m.topic for m in again.match("#")} == {"s", "s/1"}
    kv.close()


def test_match_bounded_caps_messages(store):
    for i in range(50):
        _put(store, f"cap/{i}")
    found, cut = trio.run(store.match_bounded, "cap/+", 7)
    assert cut and len(found) == 7
    assert {m.topic for m in found} <= _brute(store, "cap/+")
    found, cut = trio.run(store.match_bounded, "cap/+", 50)
    assert not cut and len(found) == 50


def test_many_wildcard_filters_let_other_tasks_run(store):
    """A big match yields to the loop: a task that only checkpoints gets turns meanwhile
    (with a match that never yields, it would get none until the match is done)."""
    for i in range(3000):
        _put(store, f"load/{i % 30}/{i}")
    filters = [f"load/{i}/+" for i in range(30)] + ["load/#", "+/+/+"]
    expected = [_brute(store, f) for f in filters]

    async def main():
        turns = 0
        done = trio.Event()
        results = []

        async def other_client():
            nonlocal turns
            while not done.is_set():
                await trio.lowlevel.checkpoint()
                turns += 1

        async def subscriber():
            for f in filters:
                found, _ = await store.match_bounded(f, 1_000_000)
                results.append({m.topic for m in found})
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(subscriber)
            nursery.start_soon(other_client)
        return turns, results

    turns, results = trio.run(main)
    assert results == expected
    # 9000 matches across 32 filters: the other task must have run many times
    assert turns > 10
