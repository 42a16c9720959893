"""Retained messages read back from the retained LMQ (several gateways): the commitlog
position of a topic's broker orders them, whichever gateway stored them."""

from __future__ import annotations

import pytest

from gateway.mqtt.message import MqttMessage
from gateway.mqtt.retained import RetainedStore
from gateway.mqtt.session_store import SessionStore


@pytest.fixture
def store(tmp_path):
    kv = SessionStore(str(tmp_path / "db"))
    yield RetainedStore(kv, max_retained=1000)
    kv.close()


def stored(topic: str, payload: bytes, clog: int, broker: str = "b1") -> MqttMessage:
    return MqttMessage(topic, payload, 1, True, broker=broker, commitlog_offset=clog)


def test_newer_entries_apply_older_ones_do_not(store: RetainedStore) -> None:
    store.set(stored("t", b"mine", 200))  # stored by this gateway
    assert not store.apply_stored(stored("t", b"mine", 200))  # read back: same entry
    assert not store.apply_stored(stored("t", b"older", 150))  # another gateway, earlier
    assert store.get("t").payload == b"mine"
    assert store.apply_stored(stored("t", b"newer", 250))
    assert store.get("t").payload == b"newer"


def test_a_delete_is_not_undone_by_an_older_message(store: RetainedStore) -> None:
    store.set(stored("t", b"v1", 100))
    store.set(stored("t", b"", 300))  # cleared here
    assert store.get("t") is None
    assert not store.apply_stored(stored("t", b"v2", 200))  # older: stays deleted
    assert store.get("t") is None
    assert store.apply_stored(stored("t", b"v3", 400))
    assert store.get("t").payload == b"v3"


def test_sys_topics_stay_each_gateways_own(store: RetainedStore) -> None:
    assert not store.apply_stored(stored("$SYS/broker/uptime", b"5", 10))
    assert store.get("$SYS/broker/uptime") is None
