"""Shared subscriptions `$share/<group>/<filter>`: each message to exactly one member."""

from __future__ import annotations

import pytest

from gateway.mqtt.packets import Publish, Suback, Subscribe, Subscription
from tests.gateway.mqtt.server_harness import Client, GatewayServer, RawClient


@pytest.fixture(scope="module")
def server():
    with GatewayServer() as srv:
        yield srv


def _drain(client, n_max: int = 1000, wait: float = 0.5) -> list:
    out = []
    while len(out) < n_max:
        try:
            out.append(client.get(timeout=wait))
        except Exception:
            break
    return out


def test_each_message_to_exactly_one_member(server):
    members = [Client(server.port, f"share-m{i}", v) for i, v in enumerate((4, 5, 5))]
    for m in members:
        m.subscribe("$share/g1/sh/#", 1)
    plain = Client(server.port, "share-plain", 5)
    plain.subscribe("sh/#", 1)
    pub = Client(server.port, "share-pub", 5)
    for i in range(60):
        pub.publish("sh/t", b"%d" % i, 1)
    assert sorted(int(m.payload) for m in plain.get_all(60)) == list(range(60))
    got = [_drain(m) for m in members]
    payloads = sorted(int(x.payload) for g in got for x in g)
    assert payloads == list(range(60))  # every message once, no duplicates
    assert sum(1 for g in got if g) >= 2  # spread over the members
    for c in (*members, plain, pub):
        c.disconnect()


def test_two_groups_each_get_every_message(server):
    a = Client(server.port, "share-ga", 5)
    b = Client(server.port, "share-gb", 5)
    a.subscribe("$share/ga/two/t", 1)
    b.subscribe("$share/gb/two/t", 1)
    pub = Client(server.port, "share-pub2", 5)
    for i in range(10):
        pub.publish("two/t", b"%d" % i, 1)
    assert len(a.get_all(10)) == 10
    assert len(b.get_all(10)) == 10
    for c in (a, b, pub):
        c.disconnect()


def test_unacked_messages_go_to_another_member_when_one_leaves(server):
    greedy = RawClient(server.port, 5)
    greedy.connect("share-greedy")
    greedy.send(Subscribe(1, (Subscription("$share/g3/leave/t", 1),)))
    greedy.recv_type(Suback)
    pub = Client(server.port, "share-pub3", 5)
    for i in range(5):
        pub.publish("leave/t", b"%d" % i, 1)
    held = [greedy.recv_type(Publish) for _ in range(5)]  # never acknowledged
    assert sorted(p.payload for p in held) == [b"%d" % i for i in range(5)]
    other = Client(server.port, "share-other", 5)
    other.subscribe("$share/g3/leave/t", 1)
    assert other.none(0.3)
    greedy.close()  # leaves: its five unacknowledged messages move
    assert sorted(m.payload for m in other.get_all(5)) == [b"%d" % i for i in range(5)]
    other.disconnect()
    pub.disconnect()


def test_shared_group_queues_while_no_member_is_online(server):
    m = Client(server.port, "share-offline", 4, clean=False)
    m.subscribe("$share/g4/off/t", 1)
    m.disconnect()
    pub = Client(server.port, "share-pub4", 4)
    for i in range(5):
        pub.publish("off/t", b"%d" % i, 1)
    m = Client(server.port, "share-offline", 4, clean=False)
    assert [x.payload for x in m.get_all(5)] == [b"%d" % i for i in range(5)]
    m.disconnect()
    pub.disconnect()
