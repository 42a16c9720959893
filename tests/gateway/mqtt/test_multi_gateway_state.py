"""State that moves between gateways (issue 12, docs/stateless-gateways.md): `$share`
groups read by the broker's POP under one consumer group (members on different gateways
split the messages), and a session's in-flight messages carried in its record. Real
processes: a name server, two brokers in `apache_strict` mode, two gateways, paho."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from gateway.mqtt.packets import Properties, Pubcomp, Publish, Pubrec, Pubrel
from tests.gateway.mqtt.cluster_support import (
    Cluster,
    clients,
    cluster,
    connected,
    new_client,
    publish_unacked,
    resumed_with_dups,
)
from tests.gateway.mqtt.e2e_support import RawClient, collect, uid

__all__ = ["clients", "cluster"]  # fixtures used below

pytestmark = pytest.mark.slow


def test_share_members_on_two_gateways_split_the_messages(cluster: Cluster, clients) -> None:
    a, b = cluster.gateways
    topic = f"shared/{uid()}"
    group = f"g{uid()}"
    members = []
    for gw in (a, b):
        m = connected(clients, gw.port)
        m.subscribe(f"$share/{group}/{topic}", qos=1)
        members.append(m)
    pubs = []
    for gw in (a, b):
        p = connected(clients, gw.port)
        pubs.append(p)
    n = 40
    for i in range(n):
        # Published on both gateways (the store queue, and so the broker, varies too).
        assert pubs[i % 2].publish(f"{topic}", f"m{i}".encode(), qos=1) == 0
    got = collect(members, n)
    payloads = Counter(m.payload for ms in got for m in ms)
    assert sorted(payloads) == sorted(f"m{i}".encode() for i in range(n))
    assert max(payloads.values()) == 1, "a message was delivered twice"
    assert all(ms for ms in got), [len(ms) for ms in got]


def test_member_that_leaves_hands_its_messages_to_the_other_gateway(
        cluster: Cluster, clients) -> None:
    """A QoS 1 member on A that never acknowledges and disconnects: what A popped for it
    becomes visible at once and goes to the member on B (not after the invisible time)."""
    a, b = cluster.gateways
    topic = f"shared/{uid()}"
    group = f"g{uid()}"
    filt = f"$share/{group}/{topic}"
    lazy = connected(clients, a.port)
    lazy.paho.manual_ack_set(True)  # receives, never PUBACKs
    lazy.subscribe(filt, qos=1)
    pub = connected(clients, a.port)
    for i in range(5):
        assert pub.publish(topic, f"x{i}".encode(), qos=1) == 0
    held = lazy.receive(5)
    assert sorted(m.payload for m in held) == [f"x{i}".encode() for i in range(5)]
    other = connected(clients, b.port)
    other.subscribe(filt, qos=1)
    other.nothing()  # A's member holds them
    lazy.close()
    again = other.receive(5, timeout=20.0)  # well under SHARE_INVISIBLE_MS
    assert sorted(m.payload for m in again) == [f"x{i}".encode() for i in range(5)]


def test_unacknowledged_messages_are_resent_with_dup_on_the_other_gateway(
        cluster: Cluster, clients) -> None:
    """A persistent QoS 1 session that received messages on A without acknowledging them,
    then resumed on B: B re-sends exactly those, with DUP and their packet ids, and does
    not deliver them again as new messages."""
    a, b = cluster.gateways
    topic = f"inflight/{uid()}"
    cid = "inf-" + uid()
    x = new_client(clients, a.port, client_id=cid, version=4)
    x.connect(clean_start=False)
    x.paho.manual_ack_set(True)  # receives, never PUBACKs
    x.subscribe(topic, qos=1)
    pub = connected(clients, b.port)
    held = publish_unacked(pub, x, topic)
    x.disconnect()
    time.sleep(0.5)  # A's disconnect record reached the cluster
    y = resumed_with_dups(clients, b.port, cid, held)  # not delivered again as new ones
    assert pub.publish(topic, b"after", qos=1) == 0
    after = y.receive_one()
    assert (after.payload, after.dup) == (b"after", False)


def test_inbound_qos2_id_moves_with_the_session(cluster: Cluster, clients) -> None:
    """A QoS 2 PUBLISH received on A (PUBREC sent), the client gone before its PUBREL, the
    session resumed on B: B knows the packet id, so a retransmitted PUBLISH is not stored
    again and the PUBREL completes normally (not 0x92 Packet Identifier not found)."""
    a, b = cluster.gateways
    topic = f"q2/{uid()}"
    cid = "q2-" + uid()
    sub = connected(clients, b.port)
    sub.subscribe(topic, qos=2)
    keep = Properties(session_expiry_interval=300)
    first = RawClient(a.port)
    try:
        assert first.connect(cid, clean_start=False, properties=keep).reason_code == 0
        first.send(Publish(topic, b"once", qos=2, packet_id=7))
        assert first.expect(Pubrec).packet_id == 7
        first.disconnect()
    finally:
        first.close()
    time.sleep(0.5)  # A's disconnect record reached the cluster
    second = RawClient(b.port)
    try:
        assert second.connect(cid, clean_start=False, properties=keep).session_present
        second.send(Publish(topic, b"once", qos=2, packet_id=7, dup=True))
        assert second.expect(Pubrec).packet_id == 7
        second.send(Pubrel(7))
        done = second.expect(Pubcomp)
        assert (done.packet_id, done.reason_code) == (7, 0)
    finally:
        second.close()
    assert [m.payload for m in sub.drain()] == [b"once"]
