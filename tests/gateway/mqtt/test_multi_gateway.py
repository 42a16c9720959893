"""Several `lmq mqtt` gateways on one cluster share the routing table (issue 12,
docs/stateless-gateways.md): a SUBSCRIBE on one gateway is live on every gateway before
its SUBACK, so a publish on another gateway right after reaches it. Real processes: a name
server, brokers in `apache_strict` mode, two gateways, paho clients."""

from __future__ import annotations

import statistics
import time

import pytest

from tests.gateway.mqtt.cluster_support import Cluster, clients, cluster, connected, new_client
from tests.gateway.mqtt.e2e_support import uid

__all__ = ["clients", "cluster"]  # fixtures used below

pytestmark = pytest.mark.slow


def test_publish_on_a_reaches_subscribers_on_a_and_b(cluster: Cluster, clients) -> None:
    a, b = cluster.gateways
    topic = f"multi/{uid()}/t"
    sub_a = connected(clients, a.port)
    sub_a.subscribe(topic, qos=1)
    sub_b = connected(clients, b.port)
    sub_b.subscribe("multi/+/t", qos=1)
    pub = connected(clients, a.port)
    for i in range(20):
        assert pub.publish(topic, f"m{i}".encode(), qos=1) == 0
    want = [f"m{i}".encode() for i in range(20)]
    assert [m.payload for m in sub_a.receive(20)] == want
    assert [m.payload for m in sub_b.receive(20)] == want
    sub_a.nothing()
    sub_b.nothing()


def test_subscribe_on_b_then_publish_on_a_at_once(cluster: Cluster, clients) -> None:
    """The SUBACK on B means the route is live on A: each publish sent on A right after
    it is delivered on B."""
    a, b = cluster.gateways
    pub = connected(clients, a.port, version=5)
    sub = connected(clients, b.port)
    for i in range(15):
        topic = f"race/{uid()}/{i}"
        sub.subscribe(topic, qos=1)
        assert pub.publish(topic, b"now", qos=1) == 0  # not 0x10: a route matched on A
        got = sub.receive_one()
        assert (got.topic, got.payload) == (topic, b"now")


def test_measure_subscribe_time(cluster: Cluster, clients) -> None:
    """SUBSCRIBE to SUBACK on one gateway of two (printed for docs/stateless-gateways.md;
    no publishes on that connection meanwhile: a client's delayed ACKs would show)."""
    _, b = cluster.gateways
    sub = connected(clients, b.port)
    took = []
    for i in range(30):
        t0 = time.perf_counter()
        assert sub.subscribe(f"measure/{uid()}/{i}", qos=1) == [1]
        took.append(time.perf_counter() - t0)
    print(f"\n[measure] SUBSCRIBE on one of two gateways (a new route each): median "
          f"{statistics.median(took) * 1000:.1f} ms, max {max(took) * 1000:.1f} ms "
          f"({len(took)} subscribes)")


def _until_unrouted(pub, topic: str, what: str) -> None:
    """Publishes (v5, QoS 1) until PUBACK 0x10, no matching subscribers: the publisher's
    gateway lost the route (10 s at most)."""
    deadline = time.monotonic() + 10
    while pub.publish(topic, b"2", qos=1) != 0x10:
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_unsubscribe_removes_the_route_everywhere(cluster: Cluster, clients) -> None:
    a, b = cluster.gateways
    topic = f"unsub/{uid()}"
    sub = connected(clients, b.port)
    sub.subscribe(topic, qos=1)
    pub = connected(clients, a.port, version=5)
    assert pub.publish(topic, b"1", qos=1) == 0
    assert sub.receive_one().payload == b"1"
    sub.unsubscribe(topic)
    _until_unrouted(pub, topic, "route still live on A")
    sub.nothing()


def test_clean_session_end_removes_its_routes(cluster: Cluster, clients) -> None:
    a, b = cluster.gateways
    topic = f"clean/{uid()}"
    sub = new_client(clients, b.port)
    sub.connect(clean_start=True)
    sub.subscribe(topic, qos=1)
    pub = connected(clients, a.port, version=5)
    assert pub.publish(topic, b"1", qos=1) == 0
    sub.disconnect()
    _until_unrouted(pub, topic, "route of the ended session still live on A")


def test_persistent_session_routes_stay_when_its_gateway_dies(
        tmp_path_factory: pytest.TempPathFactory, clients) -> None:
    """kill -9 of the gateway holding a persistent session: publishes on the other gateway
    still match its route (PUBACK 0x00, stored in its LMQ), and the session's gateway,
    restarted, delivers them. The route a clean session left there goes when that gateway
    restarts."""
    c = Cluster(tmp_path_factory.mktemp("cluster"), brokers=1).start()
    try:
        a = c.gateway()
        b = c.gateway()
        topic = f"persist/{uid()}"
        sub = new_client(clients, b.port, client_id="p-" + uid(), version=4)
        sub.connect(clean_start=False)
        sub.subscribe(topic, qos=1)
        clean_topic = f"clean/{uid()}"
        brief = new_client(clients, b.port, version=4)
        brief.connect(clean_start=True)
        brief.subscribe(clean_topic, qos=1)
        b.kill9()
        pub = connected(clients, a.port, version=5)
        for i in range(5):
            assert pub.publish(topic, f"o{i}".encode(), qos=1) == 0
        assert pub.publish(clean_topic, b"x", qos=1) == 0  # left behind by the kill
        b.start()
        sub.connect(clean_start=False)
        assert [m.payload for m in sub.receive(5)] == [f"o{i}".encode() for i in range(5)]
        _until_unrouted(pub, clean_topic, "clean session's route outlived the restart")
        assert pub.publish(topic, b"still", qos=1) == 0
    finally:
        c.stop()


def test_takeover_across_gateways(cluster: Cluster, clients) -> None:
    """A client id connected on A that connects on B: A closes the old connection with
    0x8E (session taken over, MQTT-3.1.4-3); the new one on B stays."""
    a, b = cluster.gateways
    cid = "take-" + uid()
    old = connected(clients, a.port, client_id=cid)
    new = connected(clients, b.port, client_id=cid)
    assert old.wait_closed() == 0x8E
    new.nothing()  # (QUIET seconds) and still connected: B is not kicked in turn
    assert new.is_connected()
    # Back to A: now B's connection goes.
    again = connected(clients, a.port, client_id=cid)
    assert new.wait_closed() == 0x8E
    assert again.is_connected()


def test_persistent_session_taken_over_keeps_its_routes(cluster: Cluster, clients) -> None:
    """A persistent session taken over on B (no clean start) continues there: A forgets
    its copy, and A's copy expiring later must not remove the routes B's session uses."""
    from paho.mqtt.packettypes import PacketTypes

    from tests.gateway.mqtt.e2e_support import props

    a, b = cluster.gateways
    cid = "move-" + uid()
    topic = f"move/{uid()}"
    old = new_client(clients, a.port, client_id=cid)
    old.connect(clean_start=False, properties=props(PacketTypes.CONNECT,
                                                    SessionExpiryInterval=1))
    old.subscribe(topic, qos=1)
    new = new_client(clients, b.port, client_id=cid)
    new.connect(clean_start=False, properties=props(PacketTypes.CONNECT,
                                                    SessionExpiryInterval=300))
    new.subscribe(topic, qos=1)
    assert old.wait_closed() == 0x8E
    time.sleep(2.0)  # > A's session expiry (1 s) and its expiry checks (0.2 s)
    pub = connected(clients, a.port, version=5)
    assert pub.publish(topic, b"still", qos=1) == 0
    assert new.receive_one().payload == b"still"


def _retained_on(port: int, clients, topic: str, timeout: float = 10.0):
    """The retained message a new subscription to `topic` gets on `port` (None: none),
    asked again until `timeout` while none comes (gateways learn others' retained
    messages by a long poll: shortly after the PUBACK)."""
    c = connected(clients, port)
    deadline = time.monotonic() + timeout
    while True:
        c.subscribe(topic, qos=1)
        got = c.drain(quiet=0.3)
        c.unsubscribe(topic)
        if got or time.monotonic() > deadline:
            c.close()
            return got[0] if got else None


def test_retained_message_across_gateways(cluster: Cluster, clients) -> None:
    a, b = cluster.gateways
    topic = f"ret/{uid()}"
    pub = connected(clients, a.port)
    pub.publish(topic, b"kept", qos=1, retain=True)
    got = _retained_on(b.port, clients, topic)
    assert got is not None and (got.payload, got.retain) == (b"kept", True)
    # Cleared on B: gone on A too (the delete is newer than the message A holds).
    other = connected(clients, b.port)
    other.publish(topic, b"", qos=1, retain=True)
    deadline = time.monotonic() + 10
    while _retained_on(a.port, clients, topic, timeout=0) is not None:
        assert time.monotonic() < deadline, "retained message still on A"
        time.sleep(0.1)
    # A newer retained message on B replaces it on A.
    other.publish(topic, b"newer", qos=1, retain=True)
    deadline = time.monotonic() + 10
    while True:
        got = _retained_on(a.port, clients, topic)
        if got is not None and got.payload == b"newer":
            break
        assert time.monotonic() < deadline, got


def test_persistent_session_resumes_on_b_after_a_is_killed(
        tmp_path_factory: pytest.TempPathFactory, clients) -> None:
    """A persistent QoS 1 session made on A, A killed with -9, the client back on B: the
    session is there (session present, its subscription) and delivers every PUBACKed
    message it missed, once: none of those it had acknowledged on A again."""
    c = Cluster(tmp_path_factory.mktemp("cluster"), brokers=2).start()
    try:
        a = c.gateway({"state_flush_interval_s": 0.1})
        b = c.gateway({"state_flush_interval_s": 0.1})
        topic = f"resume/{uid()}"
        cid = "r-" + uid()
        sub = new_client(clients, a.port, client_id=cid, version=4)
        assert sub.connect(clean_start=False)[1] is False
        sub.subscribe(topic, qos=1)
        pub = connected(clients, b.port, version=5)
        for i in range(5):
            assert pub.publish(topic, f"seen{i}".encode(), qos=1) == 0
        assert [m.payload for m in sub.receive(5)] == [f"seen{i}".encode() for i in range(5)]
        sub.disconnect()
        for i in range(5):  # missed while offline, on both gateways
            assert pub.publish(topic, f"missed{i}".encode(), qos=1) == 0
        time.sleep(0.5)  # A's state flush (0.1 s) reached the cluster
        a.kill9()
        for i in range(5, 10):
            assert pub.publish(topic, f"missed{i}".encode(), qos=1) == 0
        sub2 = new_client(clients, b.port, client_id=cid, version=4)
        assert sub2.connect(clean_start=False)[1] is True  # session present
        want = [f"missed{i}".encode() for i in range(10)]
        assert [m.payload for m in sub2.receive(10)] == want
        sub2.nothing()
        # The resumed session is live on B: new messages keep coming.
        assert pub.publish(topic, b"after", qos=1) == 0
        assert sub2.receive_one().payload == b"after"
    finally:
        c.stop()


def test_will_across_gateways(cluster: Cluster, clients) -> None:
    """A client on A that drops: its (retained) will reaches a subscriber on B, and a
    later subscriber on B gets it as the retained message."""
    a, b = cluster.gateways
    topic = f"will/{uid()}"
    watcher = connected(clients, b.port)
    watcher.subscribe(topic, qos=1)
    dev = new_client(clients, a.port)
    dev.connect(will=(topic, b"gone", 1, True))
    dev.drop()
    got = watcher.receive_one()
    assert got.payload == b"gone"
    late = _retained_on(b.port, clients, topic)
    assert late is not None and (late.payload, late.retain) == (b"gone", True)


def test_lmq_serve_gateway_and_a_joining_lmq_mqtt(
        tmp_path_factory: pytest.TempPathFactory, clients) -> None:
    """`lmq serve`'s embedded gateway predicts LMQ tails while alone; a `lmq mqtt` that
    joins makes it stop before the newcomer listens: publishes on both, interleaved,
    reach a subscriber on the embedded gateway each once, in order per publisher."""
    from tests.gateway.mqtt.cluster_support import MqttGatewayProcess
    from tests.gateway.mqtt.e2e_support import (
        BROKER_TEST_CONFIG,
        DEFAULT_TEST_CONFIG,
        Gateway,
        write_toml,
    )

    class Serve(Gateway):
        def argv(self) -> list[str]:
            argv = super().argv()  # the lmq mqtt process multi-dispatches over TCP
            write_toml(self.root / "broker.toml", {"broker": dict(
                BROKER_TEST_CONFIG, allow_inner_properties_without_acl=True)})
            return argv

    root = tmp_path_factory.mktemp("serve")
    a = Serve(root / "serve").start()
    b = MqttGatewayProcess(root / "gw", a.namesrv_addr, DEFAULT_TEST_CONFIG)
    try:
        topic = f"mixed/{uid()}"
        sub = connected(clients, a.port)
        sub.subscribe(topic, qos=1)
        pub_a = connected(clients, a.port)
        assert pub_a.publish(topic, b"a-first", qos=1) == 0  # a tail learnt while alone
        assert sub.receive_one().payload == b"a-first"
        b.start()
        pub_b = connected(clients, b.port)
        for i in range(20):
            assert pub_b.publish(topic, f"b{i}".encode(), qos=1) == 0
            assert pub_a.publish(topic, f"a{i}".encode(), qos=1) == 0
        got = [m.payload.decode() for m in sub.receive(40)]
        sub.nothing()
        assert sorted(got) == sorted([f"a{i}" for i in range(20)] + [f"b{i}" for i in range(20)])
        assert [g for g in got if g[0] == "a"] == [f"a{i}" for i in range(20)]
        assert [g for g in got if g[0] == "b"] == [f"b{i}" for i in range(20)]
    finally:
        b.stop()
        a.stop()


def test_resumed_session_with_a_shared_subscription_does_not_replay(cluster: Cluster,
                                                                     clients) -> None:
    """A persistent session with a `$share` subscription taken to B: the group, new on B,
    starts at the end of its LMQ (as a SUBSCRIBE does), not at the start."""
    a, b = cluster.gateways
    topic = f"share/{uid()}"
    cid = "sh-" + uid()
    x = new_client(clients, a.port, client_id=cid, version=4)
    x.connect(clean_start=False)
    x.subscribe(f"$share/g{uid()}/{topic}", qos=1)
    pub = connected(clients, a.port, version=5)
    for i in range(5):
        assert pub.publish(topic, f"old{i}".encode(), qos=1) == 0
    assert len(x.receive(5)) == 5
    x.disconnect()
    x2 = new_client(clients, b.port, client_id=cid, version=4)
    assert x2.connect(clean_start=False)[1] is True
    assert pub.publish(topic, b"new", qos=1) == 0
    assert [m.payload for m in x2.drain()] == [b"new"]
