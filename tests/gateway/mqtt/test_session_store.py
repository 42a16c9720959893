"""The gateway's RocksDB state (gateway/mqtt/session_store.py)."""

from __future__ import annotations

from gateway.mqtt.session_store import P_OFFSETS, SessionStore


def test_sessions_state_retained_names_groups(tmp_path):
    store = SessionStore(str(tmp_path / "db"))
    store.put_session("c1", {"v": 5, "exp": 60, "subs": [["a/#", 1, False, False, 0, None, "L"]],
                             "gone": None})
    store.put_session("c/2é", {"v": 4, "exp": None, "subs": [], "gone": 5})
    store.stage(P_OFFSETS, "c1", {"b\x00L": [3, 5]})
    # Staged values are visible to load_state before the commit...
    assert store.load_state("c1")[0] == {"b\x00L": [3, 5]}
    store.put_retained("t/1", [b"payload", {"MQTT_TOPIC": "t/1"}])
    store.put_group_offset("b\x00G", 9)
    store.put_name("%LMQ%m-abc", "very/long/filter")
    assert store.commit() == 2  # retained is written at once, not staged
    store.close()
    store = SessionStore(str(tmp_path / "db"))
    sessions = dict(store.load_sessions())
    assert sorted(sessions) == ["c/2é", "c1"]
    assert sessions["c1"]["subs"][0][0] == "a/#"
    assert store.load_state("c1") == ({"b\x00L": [3, 5]}, [], [])
    assert dict(store.load_retained()) == {"t/1": [b"payload", {"MQTT_TOPIC": "t/1"}]}
    assert store.load_group_offsets() == {"b\x00G": 9}
    assert store.get_name("%LMQ%m-abc") == "very/long/filter"
    store.delete_session("c1")
    assert store.get_session("c1") is None
    assert store.load_state("c1") == ({}, [], [])
    store.close()
