"""Acceptance: persistent sessions and retained messages — offline QoS 1 messages after a
reconnect and after `kill -9` + restart of the server, session expiry, retained messages
(RETAIN=1 on subscribe, replace, delete, v5 retain handling, retain-as-published, restart).
"""

from __future__ import annotations

import time

import pytest

from gateway.mqtt.packets import Disconnect
from tests.gateway.mqtt.e2e_support import (
    Client,
    PacketTypes,
    RawClient,
    SubscribeOptions,
    clients,
    gateway,
    gateway_only,
    new_gateway,
    props,
    uid,
)

__all__ = ["clients", "gateway", "new_gateway"]  # fixtures used below

KEEP = dict(SessionExpiryInterval=3600)


def _persistent(c: Client, **kw) -> tuple[int, bool, object]:
    if c.version == 5:
        return c.connect(clean_start=False, properties=props(PacketTypes.CONNECT, **KEEP), **kw)
    return c.connect(clean_start=False, **kw)


# ---------------------------------------------------------------- offline messages
@pytest.mark.parametrize("version", [4, 5], ids=["v3.1.1", "v5"])
def test_offline_qos1_messages_delivered_after_reconnect(clients, version):
    topic = f"e2e/off/{uid()}"
    sub, pub = clients(version=version), clients(version=version)
    _persistent(sub)
    sub.subscribe(f"{topic}/#", qos=1)
    sub.disconnect()
    pub.connect()
    for i in range(10):
        pub.publish(f"{topic}/{i % 3}", f"m{i}".encode(), qos=1)
    assert _persistent(sub)[:2] == (0, True)
    got = sub.receive(10)
    assert [(m.topic, m.payload, m.qos) for m in got] == [
        (f"{topic}/{i % 3}", f"m{i}".encode(), 1) for i in range(10)
    ]
    sub.nothing()
    # Delivered and acknowledged: a further reconnect brings nothing again.
    sub.disconnect()
    _persistent(sub)
    sub.nothing()


def test_offline_messages_keep_subscription_qos(clients):
    topic = f"e2e/offq/{uid()}"
    sub, pub = clients(), clients()
    _persistent(sub)
    sub.subscribe((f"{topic}/one", 1), (f"{topic}/two", 2))
    sub.disconnect()
    pub.connect()
    pub.publish(f"{topic}/one", b"a", qos=2)
    pub.publish(f"{topic}/two", b"b", qos=2)
    pub.publish(f"{topic}/two", b"c", qos=1)
    _persistent(sub)
    got = sub.receive(3)
    # (Order across QoS levels is not specified: MQTT 4.6 orders per topic and QoS.)
    assert sorted((m.payload, m.qos) for m in got) == [(b"a", 1), (b"b", 2), (b"c", 1)]


def test_session_keeps_receiving_while_online_and_offline(clients):
    """Messages published across a disconnect arrive once each, in order."""
    topic = f"e2e/mix/{uid()}"
    sub, pub = clients(version=4), clients(version=4)
    _persistent(sub)
    sub.subscribe(topic, qos=1)
    pub.connect()
    pub.publish(topic, b"0", qos=1)
    assert sub.receive_one().payload == b"0"
    sub.disconnect()
    pub.publish(topic, b"1", qos=1)
    pub.publish(topic, b"2", qos=1)
    _persistent(sub)
    pub.publish(topic, b"3", qos=1)
    assert [m.payload for m in sub.receive(3)] == [b"1", b"2", b"3"]
    sub.nothing()


def test_v5_session_expiry_interval_elapses(clients):
    topic = f"e2e/exp/{uid()}"
    sub, pub = clients(), clients()
    short = props(PacketTypes.CONNECT, SessionExpiryInterval=1)
    assert sub.connect(clean_start=False, properties=short)[:2] == (0, False)
    sub.subscribe(topic, qos=1)
    sub.disconnect()
    time.sleep(2.5)
    pub.connect()
    pub.publish(topic, b"too-late", qos=1)
    assert sub.connect(clean_start=False, properties=short)[:2] == (0, False)
    sub.nothing()


def test_v5_session_expiry_can_be_set_at_disconnect(clients):
    topic = f"e2e/expd/{uid()}"
    sub, pub = clients(), clients()
    sub.connect(clean_start=False, properties=props(PacketTypes.CONNECT, SessionExpiryInterval=60))
    sub.subscribe(topic, qos=1)
    # DISCONNECT may lower the Session Expiry Interval, here to 0: the session ends now.
    sub.disconnect(properties=props(PacketTypes.DISCONNECT, SessionExpiryInterval=0))
    pub.connect()
    pub.publish(topic, b"x", qos=1)
    assert sub.connect(clean_start=False)[:2] == (0, False)
    sub.nothing()


@pytest.mark.slow
@gateway_only
@pytest.mark.parametrize("version", [4, 5], ids=["v3.1.1", "v5"])
def test_persistent_session_survives_kill9_restart(new_gateway, version):
    gw = new_gateway()
    topic = f"e2e/crash/{uid()}"
    sub, pub = Client(gw.port, version=version), Client(gw.port, version=version)
    try:
        _persistent(sub)
        sub.subscribe((f"{topic}/#", 1))
        sub.disconnect()
        pub.connect()
        for i in range(20):
            pub.publish(f"{topic}/{i % 2}", f"m{i}".encode(), qos=1)  # each PUBACKed
        pub.close()
        gw.restart(hard=True)  # kill -9, then start on the same data
        assert _persistent(sub)[:2] == (0, True)
        got = sub.receive(20)
        assert [m.payload for m in got] == [f"m{i}".encode() for i in range(20)]
        assert all(m.qos == 1 for m in got)
        sub.nothing()
        # The subscription itself survived too: live messages keep flowing.
        pub.connect()
        pub.publish(f"{topic}/x", b"live", qos=1)
        assert sub.receive_one().payload == b"live"
    finally:
        sub.close()
        pub.close()


@pytest.mark.slow
@gateway_only
def test_acknowledged_messages_not_redelivered_after_restart(new_gateway):
    gw = new_gateway()
    topic = f"e2e/crash2/{uid()}"
    sub, pub = Client(gw.port, version=4), Client(gw.port, version=4)
    try:
        _persistent(sub)
        sub.subscribe((topic, 1))
        pub.connect()
        for i in range(5):
            pub.publish(topic, f"a{i}".encode(), qos=1)
        assert len(sub.receive(5)) == 5
        sub.disconnect()  # everything acked before the crash
        for i in range(3):
            pub.publish(topic, f"b{i}".encode(), qos=1)
        pub.close()
        # Session state is written behind (state_flush_interval_s, 0.5 s): a crash within
        # that window may redeliver at QoS 1 (at least once); past it, it must not.
        time.sleep(1.5)
        gw.restart(hard=True)
        assert _persistent(sub)[:2] == (0, True)
        assert [m.payload for m in sub.receive(3)] == [b"b0", b"b1", b"b2"]
        sub.nothing()
    finally:
        sub.close()
        pub.close()


# ---------------------------------------------------------------- retained messages
@pytest.mark.parametrize("version", [4, 5], ids=["v3.1.1", "v5"])
def test_retained_delivered_on_subscribe_with_retain_flag(clients, version):
    topic = f"e2e/ret/{uid()}"
    pub, live, late = clients(version=version), clients(version=version), clients(version=version)
    live.connect()
    live.subscribe(topic, qos=1)
    pub.connect()
    pub.publish(topic, b"state-1", qos=1, retain=True)
    msg = live.receive_one()
    # To an existing subscription the RETAIN flag is cleared (3.1.1: MQTT-3.3.1-9;
    # v5 without Retain As Published).
    assert (msg.payload, msg.retain) == (b"state-1", False)
    late.connect()
    late.subscribe(topic, qos=1)
    msg = late.receive_one()
    assert (msg.topic, msg.payload, msg.qos, msg.retain) == (topic, b"state-1", 1, True)
    late.nothing()


def test_retained_replaced_and_qos_capped(clients):
    topic = f"e2e/ret2/{uid()}"
    pub, sub0, sub2 = clients(), clients(), clients()
    pub.connect()
    pub.publish(topic, b"old", qos=2, retain=True)
    pub.publish(topic, b"new", qos=2, retain=True)
    sub0.connect()
    sub0.subscribe(topic, qos=0)
    msg = sub0.receive_one()
    assert (msg.payload, msg.qos, msg.retain) == (b"new", 0, True)
    sub0.nothing()  # only the latest retained message per topic
    sub2.connect()
    sub2.subscribe(topic, qos=2)
    msg = sub2.receive_one()
    assert (msg.payload, msg.qos) == (b"new", 2)


def test_retained_empty_payload_deletes(clients):
    topic = f"e2e/retdel/{uid()}"
    pub, live, late = clients(), clients(), clients()
    pub.connect()
    pub.publish(topic, b"x", qos=1, retain=True)
    live.connect()
    live.subscribe(topic, qos=1)
    assert live.receive_one().payload == b"x"
    pub.publish(topic, b"", qos=1, retain=True)
    # The empty message is forwarded to current subscribers like any other ...
    msg = live.receive_one()
    assert (msg.payload, msg.retain) == (b"", False)
    # ... but nothing is retained any more.
    late.connect()
    late.subscribe(topic, qos=1)
    late.nothing()


def test_retained_wildcard_subscribe_gets_every_match(clients):
    base = f"e2e/retwc/{uid()}"
    pub, sub = clients(), clients()
    pub.connect()
    topics = [f"{base}/a", f"{base}/b/c", f"{base}/d"]
    for t in topics:
        pub.publish(t, t.encode(), qos=1, retain=True)
    pub.publish(f"{base}/b/c", b"", qos=1, retain=True)  # deleted again
    pub.publish(f"{base}/not-retained", b"n", qos=1)
    sub.connect()
    sub.subscribe(f"{base}/#", qos=1)
    got = sub.drain()
    assert sorted((m.topic, m.payload, m.retain) for m in got) == [
        (f"{base}/a", f"{base}/a".encode(), True),
        (f"{base}/d", f"{base}/d".encode(), True),
    ]


def test_non_retained_publish_does_not_touch_retained(clients):
    topic = f"e2e/retkeep/{uid()}"
    pub, sub = clients(), clients()
    pub.connect()
    pub.publish(topic, b"kept", qos=1, retain=True)
    pub.publish(topic, b"transient", qos=1)
    sub.connect()
    sub.subscribe(topic, qos=1)
    assert [(m.payload, m.retain) for m in sub.drain()] == [(b"kept", True)]


@pytest.mark.parametrize("handling", [0, 1, 2])
def test_v5_retain_handling(clients, handling):
    topic = f"e2e/rh/{uid()}"
    pub, sub = clients(), clients()
    pub.connect()
    pub.publish(topic, b"r", qos=1, retain=True)
    sub.connect()
    opts = SubscribeOptions(qos=1, retainHandling=handling)
    sub.subscribe((topic, opts))
    first = [m.payload for m in sub.drain()]
    sub.subscribe((topic, opts))  # the subscription exists now
    second = [m.payload for m in sub.drain()]
    # 0: send at every subscribe; 1: only if the subscription did not exist; 2: never.
    assert (first, second) == {0: ([b"r"], [b"r"]), 1: ([b"r"], []), 2: ([], [])}[handling]


@pytest.mark.parametrize("rap", [False, True])
def test_v5_retain_as_published(clients, rap):
    topic = f"e2e/rap/{uid()}"
    pub, sub = clients(), clients()
    sub.connect()
    sub.subscribe((topic, SubscribeOptions(qos=1, retainAsPublished=rap)))
    pub.connect()
    pub.publish(topic, b"with-retain", qos=1, retain=True)
    pub.publish(topic, b"without", qos=1, retain=False)
    got = sub.receive(2)
    assert [(m.payload, m.retain) for m in got] == [(b"with-retain", rap), (b"without", False)]
    pub.publish(topic, b"", qos=1, retain=True)


@pytest.mark.slow
@gateway_only
def test_retained_survives_restart(new_gateway):
    gw = new_gateway()
    base = f"e2e/retrs/{uid()}"
    pub = Client(gw.port, version=5)
    sub = Client(gw.port, version=5)
    try:
        pub.connect()
        pub.publish(f"{base}/a", b"A", qos=1, retain=True)
        pub.publish(f"{base}/b", b"B", qos=1, retain=True)
        pub.publish(f"{base}/b", b"", qos=1, retain=True)
        pub.publish(f"{base}/c", b"C", qos=0, retain=True)
        time.sleep(0.3)  # QoS 0 has no acknowledgement to wait for
        pub.close()
        watcher = RawClient(gw.port, version=5)
        watcher.connect("shutdown-" + uid())
        gw.restart(hard=False)  # orderly restart: everything retained comes back
        # SIGTERM: connected v5 clients were told 0x8B Server shutting down.
        assert [(type(p), p.reason_code) for p in watcher.until_closed()] == [(Disconnect, 0x8B)]
        watcher.close()
        sub.connect()
        sub.subscribe(f"{base}/#", qos=1)
        got = sub.drain()
        assert sorted((m.topic, m.payload, m.retain) for m in got) == [
            (f"{base}/a", b"A", True), (f"{base}/c", b"C", True)]
        sub.close()
        gw.restart(hard=True)  # and acknowledged ones survive kill -9
        sub.connect()
        sub.subscribe(f"{base}/a", qos=1)
        assert [(m.payload, m.retain) for m in sub.drain()] == [(b"A", True)]
    finally:
        pub.close()
        sub.close()
