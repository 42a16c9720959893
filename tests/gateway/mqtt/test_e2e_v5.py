"""Acceptance: MQTT 5.0 features — topic aliases both ways, message expiry, user
properties, content type, payload format, response topic / correlation data, no-local,
Receive Maximum both ways (0x93), Maximum Packet Size both ways (0x95).
"""

from __future__ import annotations

import json
import time

import pytest

from gateway.mqtt.packets import (
    Disconnect,
    Properties,
    Puback,
    Publish,
    Pubrec,
    Subscription,
)
from tests.gateway.mqtt.e2e_support import (
    PacketTypes,
    RawClient,
    SubscribeOptions,
    clients,
    gateway,
    new_gateway,
    props,
    raw,
    uid,
)

__all__ = ["clients", "gateway", "new_gateway", "raw"]  # fixtures used below

#: Server limits set for the tests of limits (names as in the gateway's MqttConfig).
LIMITS = {"receive_maximum": 8, "max_packet_size": 4096, "max_subscriptions_per_client": 3,
          "max_topic_levels": 8, "max_client_id_length": 32, "max_keepalive": 30,
          "max_session_lag": 5}


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    from tests.gateway.mqtt.e2e_support import DEFAULT_TEST_CONFIG, make_gateway

    gw = make_gateway(tmp_path_factory.mktemp("gw-limits"), {**DEFAULT_TEST_CONFIG, **LIMITS})
    gw.start()
    yield gw
    gw.stop()


# ---------------------------------------------------------------- topic aliases
def test_topic_alias_client_to_server(clients, raw):
    topic = f"e2e/alias/{uid()}"
    sub = clients()
    sub.connect()
    sub.subscribe(topic, qos=1)
    pub = clients()
    _, _, ack_props = pub.connect()
    assert getattr(ack_props, "TopicAliasMaximum", 0) >= 1
    pub.publish(topic, b"first", qos=1, properties=props(PacketTypes.PUBLISH, TopicAlias=1))
    pub.publish("", b"by-alias", qos=1, properties=props(PacketTypes.PUBLISH, TopicAlias=1))
    got = sub.receive(2)
    assert [(m.topic, m.payload) for m in got] == [(topic, b"first"), (topic, b"by-alias")]
    # The alias is the publisher's: it never leaks to the subscriber.
    assert all(not hasattr(m.properties, "TopicAlias") for m in got)


def test_topic_alias_above_maximum_disconnect_0x94(raw):
    c = raw(version=5)
    ack = c.connect("alias-max-" + uid())
    maximum = ack.properties.topic_alias_maximum or 0
    c.send(Publish(f"e2e/a/{uid()}", b"x", properties=Properties(topic_alias=maximum + 1)))
    got = c.until_closed()
    assert [(type(p), p.reason_code) for p in got] == [(Disconnect, 0x94)]


def test_unknown_topic_alias_is_protocol_error(raw):
    c = raw(version=5)
    c.connect("alias-unk-" + uid())
    c.send(Publish("", b"x", properties=Properties(topic_alias=1)))  # never set
    got = c.until_closed()
    assert [(type(p), p.reason_code) for p in got] == [(Disconnect, 0x82)]


def test_topic_alias_server_to_client(raw, clients):
    base = f"e2e/salias/{uid()}"
    c = raw(version=5)
    c.connect("salias-" + uid(), properties=Properties(topic_alias_maximum=2))
    c.subscribe(Subscription(f"{base}/#", qos=0))
    pub = clients()
    pub.connect()
    sent = [f"{base}/{name}" for name in "abcabcab"]
    for t in sent:
        pub.publish(t, t.encode(), qos=1)
    got = [c.expect(Publish) for _ in sent]
    # The codec resolved every alias (one above 2 would have failed with 0x94).
    assert [(p.topic, p.payload) for p in got] == [(t, t.encode()) for t in sent]
    aliases = [p.properties.topic_alias for p in got]
    assert all(a is None or 1 <= a <= 2 for a in aliases)
    assert any(a is not None for a in aliases[3:]), "server never used a topic alias"


def test_no_server_aliases_without_topic_alias_maximum(raw, clients):
    topic = f"e2e/nalias/{uid()}"
    c = raw(version=5)
    c.connect("nalias-" + uid())
    c.subscribe(Subscription(topic, qos=0))
    pub = clients()
    pub.connect()
    for i in range(4):
        pub.publish(topic, b"%d" % i, qos=1)
    got = [c.expect(Publish) for _ in range(4)]
    assert [p.topic for p in got] == [topic] * 4
    assert all(p.properties.topic_alias is None for p in got)


# ---------------------------------------------------------------- message expiry
def test_message_expiry_offline_and_retained(clients):
    base = f"e2e/expiry/{uid()}"
    cid = "exp-" + uid()
    keep = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    sub, pub, late = clients(cid), clients(), clients()
    sub.connect(clean_start=False, properties=keep)
    sub.subscribe(f"{base}/q", qos=1)
    sub.disconnect()
    pub.connect()
    pub.publish(f"{base}/q", b"short", qos=1, properties=props(PacketTypes.PUBLISH, MessageExpiryInterval=1))
    pub.publish(f"{base}/q", b"long", qos=1, properties=props(PacketTypes.PUBLISH, MessageExpiryInterval=120))
    pub.publish(f"{base}/r", b"ret-short", qos=1, retain=True,
                properties=props(PacketTypes.PUBLISH, MessageExpiryInterval=1))
    pub.publish(f"{base}/s", b"ret-long", qos=1, retain=True,
                properties=props(PacketTypes.PUBLISH, MessageExpiryInterval=120))
    time.sleep(2.2)
    sub.connect(clean_start=False, properties=keep)
    msg = sub.receive_one()
    assert msg.payload == b"long"  # "short" expired while queued (MQTT-3.3.2-5)
    # The interval forwarded is what is left of it (MQTT-3.3.2-6).
    assert 100 <= msg.properties.MessageExpiryInterval <= 119
    sub.nothing()
    late.connect()
    late.subscribe(f"{base}/#", qos=1)
    got = late.drain()
    assert [(m.topic, m.payload) for m in got] == [(f"{base}/s", b"ret-long")]
    assert 100 <= got[0].properties.MessageExpiryInterval <= 119
    pub.publish(f"{base}/s", b"", qos=1, retain=True)


def test_message_without_expiry_has_no_expiry_property(clients):
    topic = f"e2e/noexp/{uid()}"
    sub, pub = clients(), clients()
    sub.connect()
    sub.subscribe(topic, qos=1)
    pub.connect()
    pub.publish(topic, b"x", qos=1)
    assert not hasattr(sub.receive_one().properties, "MessageExpiryInterval")


# ---------------------------------------------------------------- properties forwarded
def test_user_properties_content_type_payload_format(clients):
    topic = f"e2e/props/{uid()}"
    sub, pub = clients(), clients()
    sub.connect()
    sub.subscribe(topic, qos=2)
    pub.connect()
    user = [("a", "1"), ("b", "zwei"), ("a", "3"), ("ключ", "значение")]
    p = props(PacketTypes.PUBLISH, UserProperty=user, ContentType="application/json",
              PayloadFormatIndicator=1)
    for qos in (0, 1, 2):
        pub.publish(topic, b'{"k": 1}', qos=qos, properties=p)
    for msg in sub.receive(3):
        assert msg.properties.UserProperty == user  # order and repeats kept (MQTT-3.3.2-18)
        assert msg.properties.ContentType == "application/json"
        assert msg.properties.PayloadFormatIndicator == 1
        assert msg.payload == b'{"k": 1}'


def test_request_response_topic_and_correlation_data(clients):
    req_topic = f"e2e/req/{uid()}"
    resp_topic = f"e2e/resp/{uid()}"
    requester, responder = clients(), clients()
    requester.connect()
    requester.subscribe(resp_topic, qos=1)
    responder.connect()
    responder.subscribe(req_topic, qos=1)
    corr = bytes(range(256))  # binary, with every byte value
    requester.publish(req_topic, b"ping", qos=1,
                      properties=props(PacketTypes.PUBLISH, ResponseTopic=resp_topic, CorrelationData=corr))
    req = responder.receive_one()
    assert req.properties.ResponseTopic == resp_topic
    assert req.properties.CorrelationData == corr
    responder.publish(req.properties.ResponseTopic, b"pong", qos=1,
                      properties=props(PacketTypes.PUBLISH, CorrelationData=req.properties.CorrelationData))
    resp = requester.receive_one()
    assert (resp.topic, resp.payload, resp.properties.CorrelationData) == (resp_topic, b"pong", corr)


def test_properties_reach_offline_session(clients):
    topic = f"e2e/propsoff/{uid()}"
    cid = "po-" + uid()
    keep = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    sub, pub = clients(cid), clients()
    sub.connect(clean_start=False, properties=keep)
    sub.subscribe(topic, qos=1)
    sub.disconnect()
    pub.connect()
    pub.publish(topic, b"x", qos=1, properties=props(
        PacketTypes.PUBLISH, UserProperty=[("k", "v")], ContentType="text/plain",
        ResponseTopic="r/t", CorrelationData=b"\x00\x01"))
    sub.connect(clean_start=False, properties=keep)
    p = sub.receive_one().properties
    assert (p.UserProperty, p.ContentType, p.ResponseTopic, p.CorrelationData) == (
        [("k", "v")], "text/plain", "r/t", b"\x00\x01")


# ---------------------------------------------------------------- no-local
def test_no_local(clients):
    topic = f"e2e/nolocal/{uid()}"
    me, other = clients(), clients()
    me.connect()
    me.subscribe((topic, SubscribeOptions(qos=1, noLocal=True)))
    me.publish(topic, b"mine", qos=1)
    other.connect()
    other.publish(topic, b"theirs", qos=1)
    msg = me.receive_one()
    assert msg.payload == b"theirs"
    me.nothing()


def test_without_no_local_own_messages_come_back(clients):
    topic = f"e2e/local/{uid()}"
    me = clients()
    me.connect()
    me.subscribe(topic, qos=1)
    me.publish(topic, b"mine", qos=1)
    assert me.receive_one().payload == b"mine"


# ---------------------------------------------------------------- receive maximum
def test_receive_maximum_exceeded_disconnect_0x93(limited):
    c = RawClient(limited.port, version=5)
    try:
        ack = c.connect("rm-" + uid())
        maximum = ack.properties.receive_maximum
        assert maximum == LIMITS["receive_maximum"]
        topic = f"e2e/rm/{uid()}"
        # QoS 2 without PUBREL stays in flight: message maximum + 1 is one too many.
        for pid in range(1, maximum + 2):
            c.send(Publish(topic, b"x", qos=2, packet_id=pid))
        got = c.until_closed()
        # Any PUBREC the server got round to sending is for one of the first `maximum`.
        recs = [p.packet_id for p in got if isinstance(p, Pubrec)]
        assert set(recs) <= set(range(1, maximum + 1)) and len(recs) == len(set(recs))
        assert [(type(p), p.reason_code) for p in got if not isinstance(p, Pubrec)] == [
            (Disconnect, 0x93)]
    finally:
        c.close()


def _v5_subscriber_and_publisher(raw, clients, name: str, **connect_properties):
    """(topic e2e/<name>/..., a raw v5 client connected with `connect_properties` and
    subscribed to it at QoS 1, a connected paho publisher)."""
    topic = f"e2e/{name}/{uid()}"
    c = raw(version=5)
    c.connect(f"{name}-" + uid(), properties=Properties(**connect_properties))
    c.subscribe(Subscription(topic, qos=1))
    pub = clients()
    pub.connect()
    return topic, c, pub


def test_server_respects_client_receive_maximum(raw, clients):
    topic, c, pub = _v5_subscriber_and_publisher(raw, clients, "crm", receive_maximum=2)
    for i in range(6):
        pub.publish(topic, b"%d" % i, qos=1)
    first = [c.expect(Publish), c.expect(Publish)]
    assert [p.payload for p in first] == [b"0", b"1"]
    c.nothing()  # two unacknowledged: no third one (MQTT-3.3.4-9)
    c.send(Puback(first[0].packet_id))
    third = c.expect(Publish)
    assert third.payload == b"2"
    c.nothing()
    for p in [first[1], third]:
        c.send(Puback(p.packet_id))
    rest = [c.expect(Publish), c.expect(Publish)]
    assert [p.payload for p in rest] == [b"3", b"4"]
    for p in rest:
        c.send(Puback(p.packet_id))
    assert c.expect(Publish).payload == b"5"


def test_qos0_not_limited_by_receive_maximum(raw, clients):
    topic, c, pub = _v5_subscriber_and_publisher(raw, clients, "crm0", receive_maximum=1)
    pub.publish(topic, b"q1", qos=1)
    pub.publish(topic, b"q0-a", qos=0)
    pub.publish(topic, b"q0-b", qos=0)
    got = [c.expect(Publish) for _ in range(3)]  # q1 unacked, the QoS 0 ones still flow
    assert sorted(p.payload for p in got) == [b"q0-a", b"q0-b", b"q1"]


# ---------------------------------------------------------------- maximum packet size
def test_packet_too_large_disconnect_0x95(limited):
    topic = f"e2e/big/{uid()}"
    sub = RawClient(limited.port, version=5)
    c = RawClient(limited.port, version=5)
    try:
        sub.connect("bigsub-" + uid())
        sub.subscribe(Subscription(topic, qos=1))
        ack = c.connect("big-" + uid())
        limit = ack.properties.maximum_packet_size
        assert limit == LIMITS["max_packet_size"]
        c.codec.peer_max_packet_size = None  # let our codec send what the server refuses
        c.send(Publish(topic, b"x" * limit, qos=1, packet_id=1))
        got = c.until_closed()
        assert [(type(p), p.reason_code) for p in got] == [(Disconnect, 0x95)]
        sub.nothing()
        # Just under the limit is fine.
        ok = RawClient(limited.port, version=5)
        ok.connect("ok-" + uid())
        ok.publish_qos1(topic, b"y" * (limit - 100), packet_id=1)
        assert sub.expect(Publish).payload == b"y" * (limit - 100)
        ok.close()
    finally:
        sub.close()
        c.close()


def test_server_respects_client_maximum_packet_size(raw, clients):
    topic, c, pub = _v5_subscriber_and_publisher(raw, clients, "cmax", maximum_packet_size=200)
    pub.publish(topic, b"L" * 500, qos=1)  # too large for this client: discarded for it
    pub.publish(topic, b"small", qos=1)
    p = c.expect(Publish)
    assert p.payload == b"small"
    c.send(Puback(p.packet_id))
    c.nothing()


# ---------------------------------------------------------------- other limits and refusals
def test_subscriptions_per_client_limit(limited):
    for version, refused in ((5, 0x97), (4, 0x80)):
        c = RawClient(limited.port, version=version)
        try:
            c.connect("subs-" + uid())
            ack = c.subscribe(*(Subscription(f"e2e/lim/{i}", qos=1) for i in range(4)))
            assert list(ack.reason_codes) == [1, 1, 1, refused]  # Quota exceeded
        finally:
            c.close()


def test_topic_levels_limit(limited):
    deep = "/".join("abcdefghi")  # 9 levels, one more than max_topic_levels
    c = RawClient(limited.port, version=5)
    try:
        c.connect("lvl-" + uid())
        assert list(c.subscribe(Subscription(deep, qos=1)).reason_codes) == [0x8F]
        assert c.publish_qos1(deep, b"x", packet_id=1).reason_code == 0x90  # Topic Name invalid
    finally:
        c.close()


@pytest.mark.parametrize("version,code", [(5, 0x85), (4, 2)], ids=["v5", "v3.1.1"])
def test_client_id_length_limit(limited, version, code):
    c = RawClient(limited.port, version=version)
    try:
        ack = c.connect("x" * 33)  # max_client_id_length = 32
        assert (ack.reason_code, ack.session_present) == (code, False)
        c.until_closed()
    finally:
        c.close()


def test_server_keep_alive(limited):
    c = RawClient(limited.port, version=5)
    try:
        ack = c.connect("ska-" + uid(), keepalive=60)
        assert ack.properties.server_keep_alive == 30  # max_keepalive
    finally:
        c.close()


def test_max_session_lag_keeps_the_newest(limited):
    cid = "lag-" + uid()
    topic = f"e2e/lag/{uid()}"
    keep = Properties(session_expiry_interval=300)
    watcher = RawClient(limited.port, version=5)
    sub = RawClient(limited.port, version=5)
    pub = RawClient(limited.port, version=5)
    try:
        watcher.connect("lagw-" + uid())
        watcher.subscribe(Subscription(f"$SYS/broker/clients/{cid}/skipped", qos=1))
        sub.connect(cid, clean_start=False, properties=keep)
        sub.subscribe(Subscription(topic, qos=1))
        sub.disconnect()
        pub.connect("lagp-" + uid())
        for i in range(12):
            pub.publish_qos1(topic, b"m%d" % i, packet_id=i + 1)
        sub = RawClient(limited.port, version=5)
        assert sub.connect(cid, clean_start=False, properties=keep).session_present
        got = []
        for _ in range(5):
            p = sub.expect(Publish)
            sub.send(Puback(p.packet_id))
            got.append(p.payload)
        assert got == [b"m%d" % i for i in range(7, 12)]  # max_session_lag = 5: the newest
        sub.nothing()
        notice = watcher.expect(Publish)
        assert json.loads(notice.payload)["count"] == 7
    finally:
        for c in (watcher, sub, pub):
            c.close()


def test_no_matching_subscribers_puback_0x10(raw):
    c = raw(version=5)
    c.connect("nomatch-" + uid())
    assert c.publish_qos1(f"e2e/nobody/{uid()}", b"x", packet_id=1).reason_code == 0x10


def test_invalid_utf8_with_payload_format_indicator_0x99(raw, clients):
    topic = f"e2e/pfi/{uid()}"
    sub = clients()
    sub.connect()
    sub.subscribe(topic, qos=1)
    c = raw(version=5)
    c.connect("pfi-" + uid())
    ack = c.publish_qos1(topic, b"\xff\xfe", packet_id=1,
                         properties=Properties(payload_format_indicator=1))
    assert ack.reason_code == 0x99  # Payload format invalid
    sub.nothing()


def test_clients_may_not_publish_to_sys(raw, clients):
    watcher = clients()
    watcher.connect()
    watcher.subscribe("$SYS/e2e/#", qos=1)
    c = raw(version=5)
    c.connect("sys-" + uid())
    assert c.publish_qos1(f"$SYS/e2e/{uid()}", b"fake", packet_id=1).reason_code == 0x87
    watcher.nothing()
