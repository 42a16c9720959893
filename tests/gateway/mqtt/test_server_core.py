"""MQTT gateway core: CONNECT, QoS both ways, subscriptions, sessions, limits, errors.

A real gateway (embedded name server + broker + gateway, in-process transport) on free
ports, driven by paho-mqtt 3.1.1 / 5.0 clients, and by a raw socket + MqttCodec client
where a test needs a client that misbehaves or withholds acknowledgements.
"""

from __future__ import annotations

import struct
import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from gateway.mqtt.packets import (
    Connack,
    Disconnect,
    Properties,
    Puback,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
)
from tests.gateway.mqtt.server_harness import Client, GatewayServer, RawClient, wait_for


@pytest.fixture(scope="module")
def server():
    with GatewayServer(max_packet_size=4096, receive_maximum=5, max_inflight_out=10) as srv:
        yield srv


@pytest.mark.parametrize("version", [3, 4, 5])
def test_connect_publish_subscribe_every_version(server, version):
    sub = Client(server.port, f"core-sub-{version}", version)
    assert sub.rc == 0
    sub.subscribe(f"core/{version}/#", 1)
    pub = Client(server.port, f"core-pub-{version}", version)
    pub.publish(f"core/{version}/a", b"one", 1)
    pub.publish(f"core/{version}/b", b"two", 0)
    got = sub.get_all(2)
    assert [(m.topic, m.payload) for m in got] == [
        (f"core/{version}/a", b"one"), (f"core/{version}/b", b"two")]
    pub.disconnect()
    sub.disconnect()


def test_assigned_client_identifier(server):
    c5 = Client(server.port, "", 5)
    assert c5.connack_props.AssignedClientIdentifier.startswith("lmq-")
    c4 = Client(server.port, "", 4, clean=True)
    assert c4.rc == 0
    c5.disconnect()
    c4.disconnect()


def test_empty_client_id_with_persistent_session_refused(server):
    raw = RawClient(server.port, 4)
    ack = raw.connect("", clean=False)
    assert isinstance(ack, Connack) and ack.reason_code == 2  # identifier rejected
    assert raw.closed()


@pytest.mark.parametrize("pub_qos,sub_qos", [(0, 2), (1, 2), (2, 2), (2, 1), (2, 0), (1, 0)])
def test_outbound_qos_is_min_of_published_and_granted(server, pub_qos, sub_qos):
    topic = f"qos/{pub_qos}{sub_qos}"
    sub = Client(server.port, f"qos-sub-{pub_qos}{sub_qos}", 5)
    sub.subscribe(topic, sub_qos)
    pub = Client(server.port, f"qos-pub-{pub_qos}{sub_qos}", 5)
    pub.publish(topic, b"x", pub_qos)
    assert sub.get().qos == min(pub_qos, sub_qos)
    pub.disconnect()
    sub.disconnect()


def test_unsubscribe_stops_delivery(server):
    sub = Client(server.port, "unsub-sub", 5)
    sub.subscribe("unsub/t", 1)
    pub = Client(server.port, "unsub-pub", 5)
    pub.publish("unsub/t", b"1", 1)
    assert sub.get().payload == b"1"
    sub.c.unsubscribe("unsub/t")
    time.sleep(0.2)
    pub.publish("unsub/t", b"2", 1)
    assert sub.none()
    sub.disconnect()
    pub.disconnect()


def test_unsuback_reports_missing_subscription(server):
    raw = RawClient(server.port, 5)
    raw.connect("unsuback-raw")
    from gateway.mqtt.packets import Unsuback, Unsubscribe

    raw.send(Unsubscribe(3, ("never/subscribed",)))
    ack = raw.recv_type(Unsuback)
    assert ack.reason_codes == (0x11,)
    raw.close()


def test_overlapping_subscriptions_deliver_once_at_highest_qos(server):
    sub = Client(server.port, "overlap-sub", 5)
    p1 = PahoProperties(PacketTypes.SUBSCRIBE)
    p1.SubscriptionIdentifier = 3
    sub.subscribe("ov/#", 1, properties=p1)
    p2 = PahoProperties(PacketTypes.SUBSCRIBE)
    p2.SubscriptionIdentifier = 4
    sub.subscribe("ov/+/x", 2, properties=p2)
    sub.subscribe("ov/a/x", 0)
    pub = Client(server.port, "overlap-pub", 5)
    for i in range(20):
        pub.publish("ov/a/x", b"%d" % i, 2)
    got = sub.get_all(20)
    # (paho hands a QoS 2 message over at PUBREL, a QoS 1 one at once: publish the
    # next only now, or paho itself could reorder them.)
    pub.publish("ov/b", b"only-one", 2)
    got.append(sub.get())
    assert [m.payload for m in got[:20]] == [b"%d" % i for i in range(20)]
    assert all(m.qos == 2 for m in got[:20])
    assert sorted(got[0].properties.SubscriptionIdentifier) == [3, 4]
    assert got[20].payload == b"only-one" and got[20].qos == 1
    assert got[20].properties.SubscriptionIdentifier == [3]
    assert sub.none()
    sub.disconnect()
    pub.disconnect()


def test_order_is_kept_per_topic_under_load(server):
    sub = Client(server.port, "order-sub", 4)
    sub.subscribe("order/#", 1)
    pubs = [Client(server.port, f"order-pub-{i}", 4, connect=False) for i in range(3)]
    for p in pubs:
        p.c.max_inflight_messages_set(1000)  # paho itself holds back QoS 1 beyond it
        p.connect()
    for n in range(100):
        for i, p in enumerate(pubs):
            p.publish(f"order/{i}", b"%d" % n, i % 2, wait=False)
    got = sub.get_all(300)
    for i in range(3):
        seq = [int(m.payload) for m in got if m.topic == f"order/{i}"]
        assert seq == list(range(100))
    for p in pubs:
        p.disconnect()
    sub.disconnect()


def test_persistent_session_queues_while_offline_and_reports_session_present(server):
    s = Client(server.port, "persist-1", 4, clean=False)
    assert s.flags.session_present is False
    s.subscribe("persist/#", 1)
    s.disconnect()
    pub = Client(server.port, "persist-pub", 4)
    for i in range(10):
        pub.publish("persist/x", b"%d" % i, 1)
    s = Client(server.port, "persist-1", 4, clean=False)
    assert s.flags.session_present is True
    assert [m.payload for m in s.get_all(10)] == [b"%d" % i for i in range(10)]
    s.disconnect()
    # A clean session discards it.
    s = Client(server.port, "persist-1", 4, clean=True)
    assert s.flags.session_present is False
    s.disconnect()
    pub.publish("persist/x", b"after", 1)
    s = Client(server.port, "persist-1", 4, clean=False)
    assert s.flags.session_present is False
    assert s.none()
    s.disconnect()
    pub.disconnect()


def test_v5_session_expiry(server):
    props = PahoProperties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 1
    s = Client(server.port, "expiry-1", 5, clean=False, properties=props)
    s.subscribe("expiry/#", 1)
    s.disconnect()
    s = Client(server.port, "expiry-1", 5, clean=False, properties=props)
    assert s.flags.session_present is True
    s.disconnect()
    time.sleep(1.8)
    s = Client(server.port, "expiry-1", 5, clean=False, properties=props)
    assert s.flags.session_present is False
    s.disconnect()
    # Expiry 0 (the v5 default): the session ends with the connection.
    s = Client(server.port, "expiry-2", 5, clean=False)
    s.subscribe("expiry/#", 1)
    s.disconnect()
    s = Client(server.port, "expiry-2", 5, clean=False)
    assert s.flags.session_present is False
    s.disconnect()


def test_session_takeover_closes_the_older_connection(server):
    first = Client(server.port, "takeover", 5)
    second = Client(server.port, "takeover", 5)
    rc, _ = first.disconnects.get(timeout=10)
    assert rc == 0x8E
    second.subscribe("takeover/t", 0)
    pub = Client(server.port, "takeover-pub", 5)
    pub.publish("takeover/t", b"x")
    assert second.get().payload == b"x"
    second.disconnect()
    pub.disconnect()
    # 3.1.1: the older connection is just closed.
    raw = RawClient(server.port, 4)
    raw.connect("takeover-v4")
    other = RawClient(server.port, 4)
    assert other.connect("takeover-v4").reason_code == 0
    assert raw.closed()
    other.close()


def test_keepalive_timeout_closes_with_0x8d(server):
    raw = RawClient(server.port, 5)
    ack = raw.connect("keepalive-5", keepalive=1)
    assert ack.reason_code == 0
    start = time.monotonic()
    p = raw.recv(timeout=5)
    assert isinstance(p, Disconnect) and p.reason_code == 0x8D
    assert raw.recv() is None
    assert time.monotonic() - start >= 1.0


def test_pingreq_keeps_the_connection(server):
    from gateway.mqtt.packets import PINGREQ, Pingresp

    raw = RawClient(server.port, 4)
    raw.connect("ping-4", keepalive=1)
    for _ in range(4):
        time.sleep(0.5)
        raw.send(PINGREQ)
        assert isinstance(raw.recv(), Pingresp)
    raw.close()


def test_malformed_packet_v5_gets_disconnect_0x81(server):
    raw = RawClient(server.port, 5)
    raw.connect("malformed-5")
    # PUBLISH QoS 3 (flags 0b0110) is malformed (MQTT-3.3.1-4).
    raw.send_raw(bytes((0x36, 5, 0, 1, 0x61, 0, 1)))
    p = raw.recv()
    assert isinstance(p, Disconnect) and p.reason_code == 0x81
    assert raw.recv() is None


def test_protocol_error_v5_gets_disconnect_0x82(server):
    raw = RawClient(server.port, 5)
    raw.connect("protoerr-5")
    raw.send_raw(bytes((0x10, 0)))  # a second CONNECT
    p = raw.recv()
    assert isinstance(p, Disconnect) and p.reason_code == 0x82


def test_malformed_packet_v311_closes_without_disconnect(server):
    raw = RawClient(server.port, 4)
    raw.connect("malformed-4")
    raw.send_raw(bytes((0x36, 5, 0, 1, 0x61, 0, 1)))
    assert raw.recv() is None


def test_first_packet_not_connect_closes(server):
    raw = RawClient(server.port, 4)
    raw.send_raw(bytes((0xC0, 0)))
    assert raw.recv() is None


def test_inbound_packet_too_large_0x95(server):
    raw = RawClient(server.port, 5)
    ack = raw.connect("toolarge-in")
    assert ack.properties.maximum_packet_size == 4096
    raw.send(Publish("big/in", b"x" * 5000, 0))
    p = raw.recv()
    assert isinstance(p, Disconnect) and p.reason_code == 0x95


def test_outbound_packet_over_client_maximum_is_dropped(server):
    raw = RawClient(server.port, 5)
    raw.connect("toolarge-out", properties=Properties(maximum_packet_size=200))
    raw.send(Subscribe(1, (Subscription("big/out", 1),)))
    assert isinstance(raw.recv_type(Suback), Suback)
    pub = Client(server.port, "toolarge-pub", 5)
    pub.publish("big/out", b"y" * 500, 1)
    pub.publish("big/out", b"small", 1)
    p = raw.recv_type(Publish)
    assert p.payload == b"small"
    raw.close()
    pub.disconnect()


def test_receive_maximum_exceeded_0x93(server):
    raw = RawClient(server.port, 5)
    ack = raw.connect("rxmax")
    assert ack.properties.receive_maximum == 5
    # QoS 2 publishes stay unacknowledged until PUBREL: the sixth one is one too many.
    for pid in range(1, 7):
        raw.send(Publish("rxmax/t", b"x", 2, packet_id=pid))
    while True:
        p = raw.recv()
        if not isinstance(p, Pubrec):
            break
    assert isinstance(p, Disconnect) and p.reason_code == 0x93


def test_inflight_bounded_by_client_receive_maximum(server):
    raw = RawClient(server.port, 5)
    raw.connect("inflight-rx", properties=Properties(receive_maximum=2))
    raw.send(Subscribe(1, (Subscription("inflight/t", 1),)))
    raw.recv_type(Suback)
    pub = Client(server.port, "inflight-pub", 5)
    for i in range(5):
        pub.publish("inflight/t", b"%d" % i, 1)
    first = [raw.recv_type(Publish), raw.recv_type(Publish)]
    with pytest.raises(TimeoutError):
        raw.recv(timeout=0.5)  # a third would exceed the client's Receive Maximum
    raw.send(Puback(first[0].packet_id))
    assert raw.recv_type(Publish).payload == b"2"
    raw.close()
    pub.disconnect()


def test_unacked_qos1_is_retransmitted_with_dup_after_reconnect(server):
    raw = RawClient(server.port, 4)
    raw.connect("dup-1", clean=False)
    raw.send(Subscribe(1, (Subscription("dup/t", 1),)))
    raw.recv_type(Suback)
    pub = Client(server.port, "dup-pub", 4)
    pub.publish("dup/t", b"payload", 1)
    first = raw.recv_type(Publish)
    assert first.dup is False
    raw.close()  # no PUBACK
    raw = RawClient(server.port, 4)
    ack = raw.connect("dup-1", clean=False)
    assert ack.session_present
    again = raw.recv_type(Publish)
    assert again.dup is True and again.packet_id == first.packet_id
    assert again.payload == b"payload"
    raw.send(Puback(again.packet_id))
    raw.close()
    raw = RawClient(server.port, 4)
    raw.connect("dup-1", clean=False)
    with pytest.raises(TimeoutError):
        raw.recv(timeout=0.5)
    raw.close()
    pub.disconnect()


def test_qos2_pubrel_is_retransmitted_after_reconnect(server):
    raw = RawClient(server.port, 5)
    raw.connect("dup-2", clean=False, properties=Properties(session_expiry_interval=60))
    raw.send(Subscribe(1, (Subscription("dup2/t", 2),)))
    raw.recv_type(Suback)
    pub = Client(server.port, "dup2-pub", 5)
    pub.publish("dup2/t", b"exactly-once", 2)
    p = raw.recv_type(Publish)
    raw.send(Pubrec(p.packet_id))
    assert raw.recv_type(Pubrel).packet_id == p.packet_id
    raw.close()  # no PUBCOMP
    raw = RawClient(server.port, 5)
    raw.connect("dup-2", clean=False, properties=Properties(session_expiry_interval=60))
    rel = raw.recv()
    assert isinstance(rel, Pubrel) and rel.packet_id == p.packet_id
    raw.close()
    pub.disconnect()


def test_inbound_qos2_duplicate_is_stored_once(server):
    sub = Client(server.port, "q2dup-sub", 5)
    sub.subscribe("q2dup/t", 2)
    raw = RawClient(server.port, 5)
    raw.connect("q2dup-pub")
    raw.send(Publish("q2dup/t", b"once", 2, packet_id=7))
    assert raw.recv_type(Pubrec).packet_id == 7
    raw.send(Publish("q2dup/t", b"once", 2, dup=True, packet_id=7))
    assert raw.recv_type(Pubrec).packet_id == 7
    from gateway.mqtt.packets import Pubcomp

    raw.send(Pubrel(7))
    assert raw.recv_type(Pubcomp).reason_code == 0
    assert sub.get().payload == b"once"
    assert sub.none()
    raw.send(Pubrel(8))
    assert raw.recv_type(Pubcomp).reason_code == 0x92  # packet identifier not found
    raw.close()
    sub.disconnect()


def test_root_wildcards_do_not_match_dollar_topics(server):
    sub = Client(server.port, "dollar-sub", 4)
    sub.subscribe("#", 0)
    sub.subscribe("+/x", 0)
    sys_sub = Client(server.port, "dollar-sys", 4)
    sys_sub.subscribe("$app/#", 0)
    pub = Client(server.port, "dollar-pub", 4)
    pub.publish("$app/x", b"d", 1)
    assert sys_sub.get().topic == "$app/x"
    assert sub.none()
    sub.disconnect()
    sys_sub.disconnect()
    pub.disconnect()


def test_empty_levels_and_empty_payload(server):
    sub = Client(server.port, "empty-sub", 4)
    sub.subscribe("/empty//+", 1)
    pub = Client(server.port, "empty-pub", 4)
    pub.publish("/empty//x", b"", 1)
    m = sub.get()
    assert m.topic == "/empty//x" and m.payload == b""
    sub.disconnect()
    pub.disconnect()


def test_server_keep_alive_when_limited():
    with GatewayServer(max_keepalive=30) as srv:
        c = Client(srv.port, "ska", 5, keepalive=120)
        assert c.connack_props.ServerKeepAlive == 30
        c.disconnect()


def test_long_topic_refused_with_0x90():
    with GatewayServer(max_topic_length=16) as srv:
        raw = RawClient(srv.port, 5)
        raw.connect("longtopic")
        raw.send(Publish("a" * 20, b"x", 1, packet_id=1))
        ack = raw.recv_type(Puback)
        assert ack.reason_code == 0x90
        raw.send(Subscribe(2, (Subscription("b" * 20, 0),)))
        assert raw.recv_type(Suback).reason_codes == (0x8F,)
        raw.close()


def test_max_connections_refused():
    # Sockets count from accept; one over the limit is closed before CONNECT, no CONNACK
    # (as Mosquitto does). More in test_server_review_fixes.
    with GatewayServer(max_connections=1) as srv:
        a = RawClient(srv.port, 5)
        assert a.connect("mc-a").reason_code == 0
        b = RawClient(srv.port, 5)
        assert b.closed()
        a.close()
        assert wait_for(lambda: srv.gateway.stats.connections == 0)
        c = RawClient(srv.port, 4)
        assert c.connect("mc-c").reason_code == 0
        c.close()


def test_subscription_limit_refused():
    with GatewayServer(max_subscriptions_per_client=2) as srv:
        raw = RawClient(srv.port, 5)
        raw.connect("sublimit")
        raw.send(Subscribe(1, tuple(Subscription(f"l/{i}", 0) for i in range(3))))
        assert raw.recv_type(Suback).reason_codes == (0, 0, 0x97)
        raw4 = RawClient(srv.port, 4)
        raw4.connect("sublimit4")
        raw4.send(Subscribe(1, tuple(Subscription(f"l/{i}", 0) for i in range(3))))
        assert raw4.recv_type(Suback).reason_codes == (0, 0, 0x80)


def test_qos_above_maximum_disconnects_0x9b():
    with GatewayServer(maximum_qos=1) as srv:
        raw = RawClient(srv.port, 5)
        ack = raw.connect("maxqos")
        assert ack.properties.maximum_qos == 1
        raw.send(Subscribe(1, (Subscription("mq/t", 2),)))
        assert raw.recv_type(Suback).reason_codes == (1,)
        raw.send(Publish("mq/t", b"x", 2, packet_id=3))
        p = raw.recv_type(Disconnect)
        assert p.reason_code == 0x9B


def test_server_shutdown_sends_0x8b():
    srv = GatewayServer().start()
    try:
        raw = RawClient(srv.port, 5)
        raw.connect("shutdown")
        srv.call(srv.service.stop)
        p = raw.recv_type(Disconnect)
        assert p.reason_code == 0x8B
    finally:
        srv.cleanup()


def test_stats_count_clients(server):
    c = Client(server.port, "stats-1", 4)
    assert wait_for(lambda: server.gateway.stats.clients >= 1)
    c.disconnect()
    assert struct  # keep the import used by the malformed tests' byte strings


def test_offline_backlog_bounded_by_max_session_lag():
    with GatewayServer(max_session_lag=5) as srv:
        s = Client(srv.port, "lagger", 4, clean=False)
        s.subscribe("lag/#", 1)
        s.disconnect()
        notices = Client(srv.port, "lag-watch", 4)
        notices.subscribe("$SYS/broker/clients/lagger/skipped", 0)
        pub = Client(srv.port, "lag-pub", 4)
        for i in range(20):
            pub.publish("lag/t", b"%d" % i, 1)
        s = Client(srv.port, "lagger", 4, clean=False)
        assert [m.payload for m in s.get_all(5)] == [b"%d" % i for i in range(15, 20)]
        assert s.none()
        import json

        notice = json.loads(notices.get().payload)
        assert notice["count"] == 15 and notice["filter"] == "lag/#"
        assert srv.gateway.stats.dropped >= 15
        s.disconnect()
        pub.disconnect()
