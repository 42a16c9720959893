"""Retained messages and will messages through the gateway."""

from __future__ import annotations

import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.subscribeoptions import SubscribeOptions

from gateway.mqtt.packets import Disconnect, Properties, Will
from tests.gateway.mqtt.server_harness import Client, GatewayServer, RawClient, wait_for


@pytest.fixture(scope="module")
def server():
    with GatewayServer() as srv:
        yield srv


def _retain(server, topic: str, payload: bytes, qos: int = 1) -> None:
    pub = Client(server.port, f"retainer-{topic}", 5)
    pub.publish(topic, payload, qos, retain=True)
    pub.disconnect()
    assert wait_for(lambda: (server.gateway.retained.get(topic) is not None) == bool(payload))


def test_retained_delivered_on_subscribe_with_retain_flag(server):
    _retain(server, "ret/a", b"A", 1)
    _retain(server, "ret/b", b"B", 2)
    sub = Client(server.port, "ret-sub", 4)
    sub.subscribe("ret/+", 2)
    got = {m.topic: m for m in sub.get_all(2)}
    assert got["ret/a"].payload == b"A" and got["ret/a"].retain and got["ret/a"].qos == 1
    assert got["ret/b"].qos == 2
    # Live messages to an existing subscription carry RETAIN=0 (MQTT-3.3.1-12).
    _retain(server, "ret/a", b"A2")
    m = sub.get()
    assert m.payload == b"A2" and not m.retain
    sub.disconnect()


def test_empty_payload_deletes_retained(server):
    _retain(server, "ret/del", b"x")
    _retain(server, "ret/del", b"")
    sub = Client(server.port, "ret-del-sub", 4)
    sub.subscribe("ret/del", 1)
    assert sub.none()
    sub.disconnect()


def test_retain_as_published_and_retain_handling(server):
    _retain(server, "rh/t", b"kept")
    sub = Client(server.port, "rh-sub", 5)
    sub.subscribe("rh/t", options=SubscribeOptions(qos=1, retainHandling=1))
    assert sub.get().payload == b"kept"
    # Retain Handling 1: not sent again for an existing subscription.
    sub.subscribe("rh/t", options=SubscribeOptions(qos=1, retainHandling=1))
    assert sub.none()
    # Retain Handling 0: sent on every SUBSCRIBE.
    sub.subscribe("rh/t", options=SubscribeOptions(qos=1, retainHandling=0))
    assert sub.get().payload == b"kept"
    other = Client(server.port, "rh-sub2", 5)
    other.subscribe("rh/#", options=SubscribeOptions(qos=1, retainHandling=2))
    assert other.none()
    # Retain As Published keeps RETAIN=1 on live delivery.
    rap = Client(server.port, "rap-sub", 5)
    rap.subscribe("rap/t", options=SubscribeOptions(qos=1, retainAsPublished=True))
    plain = Client(server.port, "rap-plain", 5)
    plain.subscribe("rap/t", 1)
    _retain(server, "rap/t", b"r")
    assert rap.get().retain is True
    assert plain.get().retain is False
    for c in (sub, other, rap, plain):
        c.disconnect()


def test_retained_is_durable_across_gateway_restart():
    srv = GatewayServer().start()
    try:
        _retain(srv, "durable/r", b"stays")
        srv.stop()
        again = GatewayServer(data_dir=srv.data_dir).start()
        try:
            sub = Client(again.port, "durable-sub", 4)
            sub.subscribe("durable/#", 1)
            m = sub.get()
            assert (m.topic, m.payload, m.retain) == ("durable/r", b"stays", True)
            sub.disconnect()
        finally:
            again.stop()
    finally:
        srv.cleanup()


def test_will_sent_on_abnormal_close(server):
    watcher = Client(server.port, "will-watch", 4)
    watcher.subscribe("will/#", 1)
    dying = Client(server.port, "will-dying", 4, will=("will/a", b"gone", 1, False))
    dying.drop()
    m = watcher.get()
    assert (m.topic, m.payload) == ("will/a", b"gone")
    watcher.disconnect()


def test_will_not_sent_after_normal_disconnect(server):
    watcher = Client(server.port, "will-watch2", 4)
    watcher.subscribe("will2/#", 1)
    c = Client(server.port, "will-normal", 4, will=("will2/a", b"no", 1, False))
    c.disconnect()
    assert watcher.none(0.8)
    watcher.disconnect()


def test_v5_disconnect_with_will_message_sends_it(server):
    watcher = Client(server.port, "will-watch3", 5)
    watcher.subscribe("will3/#", 1)
    raw = RawClient(server.port, 5)
    raw.connect("will-04", will=Will("will3/a", b"asked", 1))
    raw.send(Disconnect(0x04))
    assert watcher.get().payload == b"asked"
    watcher.disconnect()


def test_will_on_keepalive_expiry(server):
    watcher = Client(server.port, "will-watch4", 4)
    watcher.subscribe("will4/#", 1)
    raw = RawClient(server.port, 4)
    raw.connect("will-ka", keepalive=1, will=Will("will4/a", b"silent", 1))
    start = time.monotonic()
    assert watcher.get().payload == b"silent"
    assert time.monotonic() - start >= 1.0
    watcher.disconnect()


def test_will_delay_and_reconnect_cancels_it(server):
    watcher = Client(server.port, "will-watch5", 5)
    watcher.subscribe("will5/#", 1)
    props = Properties(session_expiry_interval=60)
    wprops = Properties(will_delay_interval=1)
    raw = RawClient(server.port, 5)
    raw.connect("will-delay", clean=False, properties=props,
                will=Will("will5/a", b"late", 1, properties=wprops))
    raw.close()
    assert watcher.none(0.5)  # delayed
    assert watcher.get(timeout=5).payload == b"late"
    # Reconnecting within the delay: no will.
    raw = RawClient(server.port, 5)
    raw.connect("will-delay2", clean=False, properties=props,
                will=Will("will5/b", b"never", 1, properties=Properties(will_delay_interval=2)))
    raw.close()
    time.sleep(0.3)
    raw = RawClient(server.port, 5)
    assert raw.connect("will-delay2", clean=False, properties=props).session_present
    assert watcher.none(2.5)
    raw.close()
    watcher.disconnect()


def test_will_delay_ends_early_with_session_expiry(server):
    watcher = Client(server.port, "will-watch6", 5)
    watcher.subscribe("will6/#", 1)
    raw = RawClient(server.port, 5)
    raw.connect("will-expiry", clean=False, properties=Properties(session_expiry_interval=1),
                will=Will("will6/a", b"expired", 1, properties=Properties(will_delay_interval=30)))
    raw.close()
    start = time.monotonic()
    assert watcher.get(timeout=5).payload == b"expired"
    assert time.monotonic() - start < 5
    watcher.disconnect()


def test_will_properties_forwarded(server):
    watcher = Client(server.port, "will-watch7", 5)
    watcher.subscribe("will7/#", 1)
    raw = RawClient(server.port, 5)
    raw.connect("will-props", will=Will(
        "will7/a", b"{}", 1, properties=Properties(content_type="application/json",
                                                  user_properties=(("k", "v"),))))
    raw.close()
    m = watcher.get()
    assert m.properties.ContentType == "application/json"
    assert m.properties.UserProperty == [("k", "v")]
    watcher.disconnect()
    assert PahoProperties and PacketTypes  # imported for symmetry with the other modules


def test_subscribe_racing_a_retained_publish_still_gets_it():
    """A retained publish still on its way to the broker when a SUBSCRIBE arrives reaches
    the new subscriber (live or from the retained table), never neither."""
    from tests.gateway.mqtt.server_harness import Client, GatewayServer

    with GatewayServer() as srv:
        pub = Client(srv.port, "race-pub", 4)
        for i in range(20):
            topic = f"race/{i}"
            pub.publish(topic, b"v%d" % i, 0, True)  # QoS 0: no wait for the broker
            sub = Client(srv.port, f"race-sub-{i}", 4)
            sub.subscribe(topic, 0)
            msg = sub.get(timeout=5)
            assert (msg.topic, msg.payload) == (topic, b"v%d" % i)
            sub.disconnect()
        pub.disconnect()
