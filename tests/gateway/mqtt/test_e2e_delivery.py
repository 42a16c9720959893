"""Acceptance: delivery — QoS 0/1/2 in both directions, outbound QoS = min(published,
granted), exactly-once for QoS 2, redelivery with DUP, wildcard filters, and overlapping
subscriptions delivering one copy at the highest QoS with every subscription identifier.
"""

from __future__ import annotations

import pytest

from gateway.mqtt.packets import (
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Subscription,
)
from tests.gateway.mqtt.e2e_support import (
    PacketTypes,
    SubscribeOptions,
    clients,
    gateway,
    props,
    raw,
    uid,
)

__all__ = ["clients", "gateway", "raw"]  # fixtures used below


# ---------------------------------------------------------------- QoS
@pytest.mark.parametrize("granted", [0, 1, 2])
@pytest.mark.parametrize("version", [4, 5], ids=["v3.1.1", "v5"])
def test_outbound_qos_is_min_of_published_and_granted(clients, version, granted):
    topic = f"e2e/qos/{uid()}"
    sub, pub = clients(version=version), clients(version=version)
    sub.connect()
    assert sub.subscribe(topic, qos=granted) == [granted]
    pub.connect()
    for qos in (0, 1, 2):
        assert pub.publish(topic, f"q{qos}".encode(), qos=qos) == 0
    got = sub.receive(3)
    assert [(m.payload, m.qos) for m in got] == [
        (f"q{q}".encode(), min(q, granted)) for q in (0, 1, 2)
    ]
    assert all(m.topic == topic and not m.retain for m in got)
    sub.nothing()


def test_qos1_publish_is_acknowledged_with_puback(raw, clients):
    topic = f"e2e/ack1/{uid()}"
    sub = clients()
    sub.connect()
    sub.subscribe(topic, qos=1)
    c = raw(version=4)
    c.connect("ack1-" + uid())
    ack = c.publish_qos1(topic, b"one", packet_id=7)
    assert ack == Puback(7)
    assert sub.receive_one().payload == b"one"


def test_qos2_inbound_exactly_once_despite_resend(raw, clients):
    """A QoS 2 PUBLISH re-sent with DUP before PUBREL is not delivered twice."""
    topic = f"e2e/ack2/{uid()}"
    sub = clients()
    sub.connect()
    sub.subscribe(topic, qos=2)
    c = raw(version=5)
    c.connect("ack2-" + uid())
    c.send(Publish(topic, b"once", qos=2, packet_id=9))
    assert c.expect(Pubrec).packet_id == 9
    c.send(Publish(topic, b"once", qos=2, packet_id=9, dup=True))
    assert c.expect(Pubrec).packet_id == 9
    c.send(Pubrel(9))
    comp = c.expect(Pubcomp)
    assert (comp.packet_id, comp.reason_code) == (9, 0)
    msg = sub.receive_one()
    assert (msg.payload, msg.qos) == (b"once", 2)
    sub.nothing()
    # The packet id is free again: a new message with id 9 is a new message.
    c.publish_qos2(topic, b"twice", packet_id=9)
    assert sub.receive_one().payload == b"twice"


def test_qos2_inbound_survives_reconnect_between_pubrec_and_pubrel(raw, clients):
    topic = f"e2e/ack2r/{uid()}"
    cid = "ack2r-" + uid()
    sub = clients()
    sub.connect()
    sub.subscribe(topic, qos=2)
    c = raw(version=4)
    c.connect(cid, clean_start=False)
    c.send(Publish(topic, b"q2", qos=2, packet_id=3))
    assert c.expect(Pubrec).packet_id == 3
    c.close()
    c = raw(version=4)
    assert c.connect(cid, clean_start=False).session_present
    c.send(Pubrel(3))  # the PUBREL of the first connection's exchange
    assert c.expect(Pubcomp).packet_id == 3
    c.disconnect()
    assert [m.payload for m in sub.drain()] == [b"q2"]
    raw(version=4).connect(cid, clean_start=True)


@pytest.mark.parametrize("qos", [1, 2])
def test_unacked_outbound_is_resent_with_dup_on_reconnect(raw, clients, qos):
    topic = f"e2e/dup/{uid()}"
    cid = "dup-" + uid()
    c = raw(version=4)
    c.connect(cid, clean_start=False)
    c.subscribe(Subscription(topic, qos=qos))
    pub = clients()
    pub.connect()
    pub.publish(topic, b"unacked", qos=qos)
    first = c.expect(Publish)
    assert (first.payload, first.qos, first.dup) == (b"unacked", qos, False)
    c.close()  # no PUBACK / PUBREC
    c = raw(version=4)
    assert c.connect(cid, clean_start=False).session_present
    again = c.expect(Publish)
    # MQTT-4.4.0-1: resend unacknowledged PUBLISH packets, DUP=1, same packet id.
    assert (again.payload, again.qos, again.dup, again.packet_id) == (
        b"unacked", qos, True, first.packet_id)
    if qos == 1:
        c.send(Puback(again.packet_id))
    else:
        c.send(Pubrec(again.packet_id))
        assert c.expect(Pubrel).packet_id == again.packet_id
        c.send(Pubcomp(again.packet_id))
    c.nothing()
    c.disconnect()
    c = raw(version=4)
    c.connect(cid, clean_start=False)
    c.nothing()  # acknowledged: never again
    c.disconnect()
    raw(version=4).connect(cid, clean_start=True)


def test_outbound_qos2_pubrel_resent_after_reconnect(raw, clients):
    topic = f"e2e/rel/{uid()}"
    cid = "rel-" + uid()
    c = raw(version=5)
    keep = Properties(session_expiry_interval=300)
    c.connect(cid, clean_start=False, properties=keep)
    c.subscribe(Subscription(topic, qos=2))
    pub = clients()
    pub.connect()
    pub.publish(topic, b"q2", qos=2)
    p = c.expect(Publish)
    c.send(Pubrec(p.packet_id))
    assert c.expect(Pubrel).packet_id == p.packet_id
    c.close()  # before PUBCOMP
    c = raw(version=5)
    assert c.connect(cid, clean_start=False, properties=keep).session_present
    # MQTT-4.4.0-1: the server resends the PUBREL, not the PUBLISH.
    rel = c.expect(Pubrel)
    assert rel.packet_id == p.packet_id
    c.send(Pubcomp(rel.packet_id))
    c.nothing()
    c.disconnect()
    raw(version=5).connect(cid, clean_start=True)


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_per_topic_order_is_kept(clients, qos):
    # MQTT 4.6: same topic and QoS from one client -> the same order to every subscriber.
    topic = f"e2e/order/{uid()}"
    sub, pub = clients(), clients()
    sub.connect()
    sub.subscribe(topic, qos=2)
    pub.connect()
    for i in range(50):
        pub.publish(topic, str(i).encode(), qos=qos, wait=False)
    got = sub.receive(50)
    assert [int(m.payload) for m in got] == list(range(50))


# ---------------------------------------------------------------- wildcards
WILDCARD_CASES = [
    # filter, topics that match, topics that do not
    ("{p}/+", ["{p}/a", "{p}/"], ["{p}", "{p}/a/b"]),
    ("{p}/#", ["{p}", "{p}/a", "{p}/a/b/c", "{p}/"], []),
    ("{p}/+/x", ["{p}/a/x", "{p}//x"], ["{p}/a/y", "{p}/a/b/x"]),
    ("{p}/a//b", ["{p}/a//b"], ["{p}/a/b", "{p}/a/x/b"]),
    ("{p}/+/+/+/+/+/+/+/+/#", ["{p}/1/2/3/4/5/6/7/8", "{p}/1/2/3/4/5/6/7/8/9/10/11/12/13/14"],
     ["{p}/1/2/3/4/5/6/7"]),
    ("{p}/a/b/c/d/e/f/g/h/i/j/k", ["{p}/a/b/c/d/e/f/g/h/i/j/k"], ["{p}/a/b/c/d/e/f/g/h/i/j"]),
]


@pytest.mark.parametrize("version", [4, 5], ids=["v3.1.1", "v5"])
@pytest.mark.parametrize("case", range(len(WILDCARD_CASES)), ids=[c[0] for c in WILDCARD_CASES])
def test_wildcard_filter(clients, version, case):
    prefix = f"e2e/wc/{uid()}"
    flt, yes, no = WILDCARD_CASES[case]
    sub, pub = clients(version=version), clients(version=version)
    sub.connect()
    assert sub.subscribe(flt.format(p=prefix), qos=1) == [1]
    pub.connect()
    for t in no + yes:  # non-matching first: they must not show up before the rest
        pub.publish(t.format(p=prefix), t.encode(), qos=1)
    got = sub.receive(len(yes))
    assert [m.topic for m in got] == [t.format(p=prefix) for t in yes]
    sub.nothing()


def test_leading_slash_and_plus_first_level(clients):
    """`+/x` matches `/x` (the first level is empty), and `/+` matches it too."""
    token = uid()
    sub, pub = clients(), clients()
    sub.connect()
    assert sub.subscribe(f"+/{token}", qos=1) == [1]
    pub.connect()
    pub.publish(f"/{token}", b"empty-first-level", qos=1)
    pub.publish(f"a/{token}", b"a-level", qos=1)
    pub.publish(f"a/b/{token}", b"too-deep", qos=1)
    assert [m.topic for m in sub.receive(2)] == [f"/{token}", f"a/{token}"]
    sub.nothing()


def test_unsubscribe_stops_delivery(clients):
    topic = f"e2e/unsub/{uid()}"
    sub, pub = clients(), clients()
    sub.connect()
    sub.subscribe(topic, qos=1)
    pub.connect()
    pub.publish(topic, b"before", qos=1)
    assert sub.receive_one().payload == b"before"
    assert sub.unsubscribe(topic) == [0]
    pub.publish(topic, b"after", qos=1)
    sub.nothing()
    # v5: unsubscribing a filter that is not subscribed -> 0x11 No subscription existed.
    assert sub.unsubscribe(topic) == [0x11]


def test_resubscribe_replaces_qos(clients):
    topic = f"e2e/resub/{uid()}"
    sub, pub = clients(), clients()
    sub.connect()
    sub.subscribe(topic, qos=2)
    assert sub.subscribe(topic, qos=0) == [0]
    pub.connect()
    pub.publish(topic, b"x", qos=2)
    msg = sub.receive_one()
    assert msg.qos == 0  # the new subscription replaced the old one, no second copy
    sub.nothing()


# ---------------------------------------------------------------- overlapping subscriptions
def test_overlapping_subscriptions_v5_one_copy_all_identifiers(clients):
    base = f"e2e/ovl/{uid()}"
    sub, pub = clients(), clients()
    sub.connect()
    for sid, (flt, qos) in enumerate([(f"{base}/#", 1), (f"{base}/+", 2), (f"{base}/x", 0)], 1):
        p = props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=sid)
        assert sub.subscribe((flt, SubscribeOptions(qos=qos)), properties=p) == [qos]
    pub.connect()
    pub.publish(f"{base}/x", b"both", qos=2)
    msg = sub.receive_one()
    assert (msg.topic, msg.payload, msg.qos) == (f"{base}/x", b"both", 2)
    assert sorted(msg.properties.SubscriptionIdentifier) == [1, 2, 3]
    sub.nothing()  # exactly one copy
    pub.publish(f"{base}/y", b"two-of-three", qos=1)
    msg = sub.receive_one()
    assert (msg.payload, msg.qos) == (b"two-of-three", 1)
    assert sorted(msg.properties.SubscriptionIdentifier) == [1, 2]
    sub.nothing()
    pub.publish(f"{base}/y/z", b"one", qos=2)
    msg = sub.receive_one()
    assert (msg.payload, msg.qos) == (b"one", 1)
    assert msg.properties.SubscriptionIdentifier == [1]


def test_overlapping_subscriptions_v311_one_copy_highest_qos(clients):
    base = f"e2e/ovl3/{uid()}"
    sub, pub = clients(version=4), clients(version=4)
    sub.connect()
    assert sub.subscribe((f"{base}/#", 0), (f"{base}/+/c", 2), (f"{base}/b/+", 1)) == [0, 2, 1]
    pub.connect()
    for i in range(5):
        pub.publish(f"{base}/b/c", str(i).encode(), qos=2)
    got = sub.receive(5)
    assert [(m.payload, m.qos) for m in got] == [(str(i).encode(), 2) for i in range(5)]
    sub.nothing()


def test_subscription_identifier_not_sent_when_not_given(clients):
    topic = f"e2e/nosid/{uid()}"
    sub, pub = clients(), clients()
    sub.connect()
    sub.subscribe(topic, qos=1)
    pub.connect()
    pub.publish(topic, b"x", qos=1)
    msg = sub.receive_one()
    assert not hasattr(msg.properties, "SubscriptionIdentifier")
