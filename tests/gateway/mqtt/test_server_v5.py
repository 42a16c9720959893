"""MQTT 5 features through the gateway: aliases, expiry, properties, no-local, sub ids."""

from __future__ import annotations

import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.subscribeoptions import SubscribeOptions

from gateway.mqtt.packets import Properties, Publish, Suback, Subscribe, Subscription
from tests.gateway.mqtt.server_harness import Client, GatewayServer, RawClient


@pytest.fixture(scope="module")
def server():
    with GatewayServer(topic_alias_maximum=4) as srv:
        yield srv


def test_inbound_topic_alias(server):
    sub = Client(server.port, "alias-sub", 5)
    sub.subscribe("alias/in", 1)
    raw = RawClient(server.port, 5)
    ack = raw.connect("alias-pub")
    assert ack.properties.topic_alias_maximum == 4
    raw.send(Publish("alias/in", b"1", 0, properties=Properties(topic_alias=2)))
    raw.send(Publish("", b"2", 0, properties=Properties(topic_alias=2)))
    assert [m.payload for m in sub.get_all(2)] == [b"1", b"2"]
    # An alias above our maximum: DISCONNECT 0x94.
    raw.send(Publish("alias/in", b"3", 0, properties=Properties(topic_alias=9)))
    from gateway.mqtt.packets import Disconnect

    assert raw.recv_type(Disconnect).reason_code == 0x94
    sub.disconnect()


def test_outbound_topic_alias_up_to_client_maximum(server):
    raw = RawClient(server.port, 5)
    raw.codec.topic_alias_maximum = 1
    raw.connect("alias-out", properties=Properties(topic_alias_maximum=1))
    raw.send(Subscribe(1, (Subscription("aout/#", 0),)))
    raw.recv_type(Suback)
    pub = Client(server.port, "alias-out-pub", 5)
    for t in ("aout/x", "aout/x", "aout/y"):
        pub.publish(t, b"p", 1)
    first, second, third = (raw.recv_type(Publish) for _ in range(3))
    assert first.topic == "aout/x" and first.properties.topic_alias == 1
    # Sent with an empty topic name; our client codec resolved the alias.
    assert second.topic == "aout/x" and second.properties.topic_alias == 1
    assert third.topic == "aout/y" and third.properties.topic_alias is None
    raw.close()
    pub.disconnect()


def test_message_expiry_remaining_time_and_expired_not_delivered(server):
    sub = Client(server.port, "mexp-sub", 5, clean=False,
                 properties=_connect_props(SessionExpiryInterval=60))
    sub.subscribe("mexp/#", 1)
    pub = Client(server.port, "mexp-pub", 5)
    props = PahoProperties(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = 30
    pub.publish("mexp/live", b"x", 1, properties=props)
    m = sub.get()
    assert 1 <= m.properties.MessageExpiryInterval <= 30
    sub.disconnect()
    short = PahoProperties(PacketTypes.PUBLISH)
    short.MessageExpiryInterval = 1
    pub.publish("mexp/short", b"dies", 1, properties=short)
    pub.publish("mexp/long", b"lives", 1)
    time.sleep(1.3)
    sub = Client(server.port, "mexp-sub", 5, clean=False,
                 properties=_connect_props(SessionExpiryInterval=60))
    assert sub.get().payload == b"lives"
    assert sub.none()
    sub.disconnect()
    pub.disconnect()


def test_publish_properties_forwarded(server):
    sub = Client(server.port, "props-sub", 5)
    sub.subscribe("props/t", 1)
    pub = Client(server.port, "props-pub", 5)
    props = PahoProperties(PacketTypes.PUBLISH)
    props.ContentType = "text/plain"
    props.PayloadFormatIndicator = 1
    props.ResponseTopic = "props/reply\x01odd"
    props.CorrelationData = b"\x00\x01\x02"
    props.UserProperty = [("a", "1"), ("a", "2"), ("b", "\x02")]
    pub.publish("props/t", "héllo".encode(), 1, properties=props)
    m = sub.get()
    p = m.properties
    assert p.ContentType == "text/plain"
    assert p.PayloadFormatIndicator == 1
    assert p.ResponseTopic == "props/reply\x01odd"
    assert p.CorrelationData == b"\x00\x01\x02"
    assert p.UserProperty == [("a", "1"), ("a", "2"), ("b", "\x02")]
    sub.disconnect()
    pub.disconnect()


def test_invalid_utf8_with_payload_format_indicator_refused_0x99(server):
    raw = RawClient(server.port, 5)
    raw.connect("pfi-bad")
    raw.send(Publish("pfi/t", b"\xff\xfe", 1, packet_id=1,
                     properties=Properties(payload_format_indicator=1)))
    from gateway.mqtt.packets import Puback

    assert raw.recv_type(Puback).reason_code == 0x99
    raw.close()


def test_no_local(server):
    c = Client(server.port, "nolocal", 5)
    c.subscribe("nl/t", options=SubscribeOptions(qos=1, noLocal=True))
    c.subscribe("nl/#", options=SubscribeOptions(qos=0))
    other = Client(server.port, "nolocal-other", 5)
    c.publish("nl/t", b"mine", 1)
    m = c.get()  # only through nl/# (no-local does not apply there)
    assert m.payload == b"mine" and m.qos == 0
    other.publish("nl/t", b"theirs", 1)
    m = c.get()
    assert m.payload == b"theirs" and m.qos == 1
    c.disconnect()
    other.disconnect()


def test_no_matching_subscribers_reason_code(server):
    pub = Client(server.port, "nomatch-pub", 5)
    info = pub.c.publish("nobody/listens", b"x", 1)
    info.wait_for_publish(10)
    mid, rc = pub.acks.get(timeout=5)
    assert rc == 0x10
    pub.disconnect()


def test_subscription_identifier_on_delivery(server):
    sub = Client(server.port, "subid", 5)
    props = PahoProperties(PacketTypes.SUBSCRIBE)
    props.SubscriptionIdentifier = 42
    sub.subscribe("subid/t", 1, properties=props)
    pub = Client(server.port, "subid-pub", 5)
    pub.publish("subid/t", b"x", 1)
    assert sub.get().properties.SubscriptionIdentifier == [42]
    sub.disconnect()
    pub.disconnect()


def test_disconnect_session_expiry_after_zero_is_protocol_error(server):
    raw = RawClient(server.port, 5)
    raw.connect("sei-zero")
    from gateway.mqtt.packets import Disconnect

    raw.send(Disconnect(0, Properties(session_expiry_interval=30)))
    assert raw.recv_type(Disconnect).reason_code == 0x82


def test_disconnect_can_shorten_session_expiry(server):
    raw = RawClient(server.port, 5)
    raw.connect("sei-short", clean=False, properties=Properties(session_expiry_interval=60))
    from gateway.mqtt.packets import Disconnect

    raw.send(Disconnect(0, Properties(session_expiry_interval=0)))
    time.sleep(0.3)
    raw = RawClient(server.port, 5)
    ack = raw.connect("sei-short", clean=False, properties=Properties(session_expiry_interval=60))
    assert not ack.session_present
    raw.close()


def test_request_problem_information_zero_still_connects(server):
    c = Client(server.port, "rpi", 5, properties=_connect_props(RequestProblemInformation=0))
    assert c.rc == 0
    c.disconnect()


def _connect_props(**values) -> PahoProperties:
    props = PahoProperties(PacketTypes.CONNECT)
    for k, v in values.items():
        setattr(props, k, v)
    return props
