"""Acceptance: shared subscriptions (`$share/<group>/<filter>`) — each message to exactly
one member of a group, groups independent of each other and of plain subscribers, and
the unacknowledged messages of a member that leaves go to another member.
"""

from __future__ import annotations

import pytest

from gateway.mqtt.packets import Disconnect, Properties, Publish, Subscribe, Subscription
from tests.gateway.mqtt.e2e_support import clients, collect, gateway, raw, uid

__all__ = ["clients", "gateway", "raw"]  # fixtures used below


@pytest.mark.parametrize("version", [4, 5], ids=["v3.1.1", "v5"])
def test_each_message_to_exactly_one_member(clients, version):
    base = f"e2e/share/{uid()}"
    group = "g" + uid()
    members = [clients(version=version) for _ in range(3)]
    for m in members:
        m.connect()
        assert m.subscribe(f"$share/{group}/{base}/#", qos=1) == [1]
    pub = clients(version=version)
    pub.connect()
    sent = [f"m{i}".encode() for i in range(30)]
    for i, payload in enumerate(sent):
        pub.publish(f"{base}/{i % 4}", payload, qos=1)
    per_member = [[msg.payload for msg in got] for got in collect(members, len(sent))]
    received = [p for got in per_member for p in got]
    assert sorted(received) == sorted(sent), per_member  # all of them, none twice


def test_shared_message_topic_is_the_published_topic(clients):
    base = f"e2e/sharet/{uid()}"
    member, pub = clients(), clients()
    member.connect()
    member.subscribe(f"$share/g1/{base}/+", qos=2)
    pub.connect()
    pub.publish(f"{base}/x", b"payload", qos=2)
    msg = member.receive_one()
    assert (msg.topic, msg.payload, msg.qos) == (f"{base}/x", b"payload", 2)


def test_groups_are_independent_and_plain_subscribers_get_everything(clients):
    base = f"e2e/shareg/{uid()}"
    g1 = [clients(), clients()]
    g2 = [clients()]
    plain = clients()
    for m in g1:
        m.connect()
        m.subscribe(f"$share/one/{base}", qos=1)
    for m in g2:
        m.connect()
        m.subscribe(f"$share/two/{base}", qos=1)
    plain.connect()
    plain.subscribe(base, qos=1)
    pub = clients()
    pub.connect()
    sent = [b"%d" % i for i in range(20)]
    for payload in sent:
        pub.publish(base, payload, qos=1)
    assert [m.payload for m in plain.receive(20)] == sent
    per_client = collect(g1 + g2, 2 * len(sent))
    got1 = [m.payload for got in per_client[:2] for m in got]
    got2 = [m.payload for m in per_client[2]]
    assert sorted(got1) == sorted(sent)
    assert got2 == sent  # a single member gets the whole stream, in order


def test_unacked_messages_of_a_leaving_member_go_to_another(raw, clients):
    base = f"e2e/shareleave/{uid()}"
    flt = f"$share/g/{base}"
    # A holds its messages without acknowledging them, then its connection drops.
    a = raw(version=5)
    a.connect("share-a-" + uid(), properties=Properties(receive_maximum=5))
    a.subscribe(Subscription(flt, qos=1))
    b = clients()
    b.connect()
    b.subscribe(flt, qos=1)
    pub = clients()
    pub.connect()
    sent = [b"%d" % i for i in range(20)]
    for payload in sent:
        pub.publish(base, payload, qos=1)
    held = []
    try:
        while True:
            p = a.recv(0.5)
            if isinstance(p, Publish):
                held.append(p.payload)
    except TimeoutError:
        pass
    assert held, "member A was given nothing: the hand-over would not be exercised"
    a.close()  # abnormal close, session ends: its 5 unacked messages must not be lost
    got_b = [m.payload for m in b.drain(1.0)]
    assert sorted(got_b) == sorted(sent), f"A held {held}"
    assert set(held) <= set(got_b)


def test_member_leaving_normally_leaves_the_rest_to_others(clients):
    base = f"e2e/shareleft/{uid()}"
    a, b, pub = clients(), clients(), clients()
    for m in (a, b):
        m.connect()
        m.subscribe(f"$share/g/{base}", qos=1)
    a.unsubscribe(f"$share/g/{base}")
    pub.connect()
    for i in range(10):
        pub.publish(base, b"%d" % i, qos=1)
    assert [m.payload for m in b.receive(10)] == [b"%d" % i for i in range(10)]
    a.nothing()


def test_invalid_share_name_is_malformed(raw):
    c = raw(version=5)
    c.connect("sharebad-" + uid())
    # A ShareName must not contain "+" or "#" (MQTT 4.8.2): the SUBSCRIBE is malformed.
    c.send(Subscribe(1, (Subscription("$share/g+x/a", qos=1),)))
    got = c.until_closed()
    assert [(type(p), p.reason_code) for p in got] == [(Disconnect, 0x81)]


def test_retained_messages_not_sent_to_shared_subscriptions(clients):
    topic = f"e2e/shareret/{uid()}"
    pub, member, plain = clients(), clients(), clients()
    pub.connect()
    pub.publish(topic, b"retained", qos=1, retain=True)
    member.connect()
    member.subscribe(f"$share/g/{topic}", qos=1)
    plain.connect()
    plain.subscribe(topic, qos=1)
    assert plain.receive_one().retain  # the message is retained ...
    member.nothing()  # ... yet a shared subscription does not get it (MQTT 4.8.2)
    pub.publish(topic, b"", qos=1, retain=True)


def test_no_local_on_shared_subscription_is_protocol_error(raw):
    c = raw(version=5)
    c.connect("sharenl-" + uid())
    c.send(Subscribe(1, (Subscription("$share/g/a", qos=1, no_local=True),)))
    got = c.until_closed()
    assert [(type(p), p.reason_code) for p in got] == [(Disconnect, 0x82)]  # MQTT-3.8.3-4
