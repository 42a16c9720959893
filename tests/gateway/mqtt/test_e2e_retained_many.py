"""A SUBSCRIBE with many wildcard filters over many retained messages, through a real
gateway: every filter gets exactly what a scan would give, capped per subscription by
`max_retained_per_subscription`, and another client is answered meanwhile."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from gateway.mqtt.message import MqttMessage
from gateway.mqtt.packets import PINGREQ, Pingresp, Publish, Suback, Subscribe, Subscription
from gateway.mqtt.topics import topic_matches
from tests.gateway.mqtt.server_harness import GatewayServer, RawClient

CAP = 40  # max_retained_per_subscription of the capped server


def _topics(rng: random.Random, n: int) -> list[str]:
    return sorted({f"site{rng.randrange(5)}/dev{rng.randrange(40)}/{rng.choice('abc')}/{i}"
                   for i in range(n)})


def _fill(server: GatewayServer, topics: list[str]) -> None:
    def put() -> None:
        for t in topics:
            server.gateway.retained.set(MqttMessage(t, b"v", 0, True))
    server.call(put)


def _subscribe_and_collect(server: GatewayServer, filters: list[str], total: int,
                           quiet_after: bool = False):
    sub = RawClient(server.port)
    sub.connect("many-filters")
    pinger = RawClient(server.port)
    pinger.connect("pinger")
    sub.send(Subscribe(1, tuple(Subscription(f, 0) for f in filters)))
    pinger.send(PINGREQ)
    assert isinstance(pinger.recv_type(Pingresp), Pingresp)
    got: Counter[str] = Counter()
    suback = None
    while sum(got.values()) < total or suback is None:
        p = sub.recv()
        assert p is not None, "subscriber closed"
        if isinstance(p, Suback):
            suback = p
        elif isinstance(p, Publish):
            assert p.retain
            got[p.topic] += 1
    if quiet_after:  # nothing beyond `total` follows
        with pytest.raises(TimeoutError):
            sub.recv(0.5)
    pinger.send(PINGREQ)  # still answered after the burst
    assert isinstance(pinger.recv_type(Pingresp), Pingresp)
    sub.close()
    pinger.close()
    return suback, got


def test_many_wildcard_filters_get_what_a_scan_gives():
    rng = random.Random(21)
    topics = _topics(rng, 3000)
    filters = [f"site{rng.randrange(5)}/dev{rng.randrange(40)}/+/+" for _ in range(60)]
    filters += [f"+/dev{rng.randrange(40)}/{rng.choice('abc')}/#" for _ in range(20)]
    expected = Counter(t for f in filters for t in topics if topic_matches(f, t))
    with GatewayServer() as server:
        _fill(server, topics)
        suback, got = _subscribe_and_collect(server, filters, sum(expected.values()))
        assert suback.reason_codes == (0,) * len(filters)
        assert got == expected


def test_retained_sent_per_subscription_are_capped():
    rng = random.Random(22)
    topics = _topics(rng, 600)
    filters = ["#", "site1/#", "+/+/a/+"]
    counts = [sum(topic_matches(f, t) for t in topics) for f in filters]
    assert all(c > CAP for c in counts)
    with GatewayServer(max_retained_per_subscription=CAP) as server:
        _fill(server, topics)
        _, got = _subscribe_and_collect(server, filters, CAP * len(filters), quiet_after=True)
        assert sum(got.values()) == CAP * len(filters)
        for t in got:
            assert any(topic_matches(f, t) for f in filters)


@pytest.mark.parametrize("bad", [0, -1])
def test_cap_must_be_positive(bad):
    from gateway.mqtt.config import MqttConfig
    with pytest.raises(ValueError, match="max_retained_per_subscription"):
        MqttConfig(max_retained_per_subscription=bad)
