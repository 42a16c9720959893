"""Acceptance: root wildcards on a server of their own (so that `#` sees only this test's
traffic) — `#` and `+/...` receive every topic except those beginning with `$`
(MQTT-4.7.2-1): `$SYS/...` and any other `$` topic need an explicit `$...` filter.
"""

from __future__ import annotations

import time

from tests.gateway.mqtt.e2e_support import TIMEOUT, clients, gateway, uid

__all__ = ["clients", "gateway"]  # fixtures used below


def test_root_wildcards_match_everything_but_dollar_topics(clients):
    token = uid()
    hash_sub, plus_sub, dollar_sub, sys_sub = clients(), clients(), clients(), clients(version=4)
    hash_sub.connect()
    assert hash_sub.subscribe("#", qos=1) == [1]
    plus_sub.connect()
    assert plus_sub.subscribe(f"+/{token}", qos=1) == [1]
    dollar_sub.connect()
    assert dollar_sub.subscribe("$e2e/#", qos=1) == [1]
    sys_sub.connect()
    assert sys_sub.subscribe("$SYS/#", qos=0) == [0]
    pub = clients()
    pub.connect()
    topics = [f"a/{token}", f"/{token}", f"{token}", f"a/b/c/{token}", f"$e2e/{token}"]
    for t in topics:
        pub.publish(t, t.encode(), qos=1)
    got = {m.topic for m in hash_sub.receive(4)}
    assert got == {f"a/{token}", f"/{token}", f"{token}", f"a/b/c/{token}"}
    assert sorted(m.topic for m in plus_sub.receive(2)) == sorted([f"/{token}", f"a/{token}"])
    assert [m.topic for m in dollar_sub.receive(1)] == [f"$e2e/{token}"]
    # $SYS topics exist (the server publishes them) ...
    sys_msgs = sys_sub.receive(1, timeout=TIMEOUT + 5)
    assert all(m.topic.startswith("$SYS/") for m in sys_msgs)
    time.sleep(1.1)  # ... past another $SYS interval of the test configuration,
    # ... yet `#` never received a `$` topic.
    rest = hash_sub.drain()
    assert [m.topic for m in rest if m.topic.startswith("$")] == []
    assert rest == []
    plus_sub.nothing()
