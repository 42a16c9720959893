"""Acceptance: Will messages — published on an abnormal close, on keepalive expiry and
after a protocol error; not after a normal DISCONNECT; v5 DISCONNECT 0x04 sends it;
v5 Will Delay Interval (a reconnect within the delay cancels it); retained wills.
"""

from __future__ import annotations

import time

import pytest

from gateway.mqtt.packets import Properties, Will
from tests.gateway.mqtt.e2e_support import (
    QUIET,
    SHORT_KEEPALIVE,
    TIMEOUT,
    PacketTypes,
    clients,
    gateway,
    props,
    raw,
    uid,
)

__all__ = ["clients", "gateway", "raw"]  # fixtures used below


def _watcher(clients, topic: str, version: int = 5):
    w = clients(version=version)
    w.connect()
    w.subscribe(topic, qos=2)
    return w


@pytest.mark.parametrize("version", [3, 4, 5], ids=["v3.1", "v3.1.1", "v5"])
def test_will_on_abnormal_close(clients, version):
    topic = f"e2e/will/{uid()}"
    watcher = _watcher(clients, topic)
    dev = clients(version=version)
    dev.connect(will=(topic, b"device lost", 1, False))
    dev.drop()
    msg = watcher.receive_one()
    assert (msg.topic, msg.payload, msg.qos, msg.retain) == (topic, b"device lost", 1, False)
    watcher.nothing()


@pytest.mark.parametrize("version", [4, 5], ids=["v3.1.1", "v5"])
def test_no_will_after_normal_disconnect(clients, version):
    topic = f"e2e/nowill/{uid()}"
    watcher = _watcher(clients, topic)
    dev = clients(version=version)
    dev.connect(will=(topic, b"should not appear", 1, False))
    dev.disconnect()  # v5: reason 0x00 Normal disconnection
    watcher.nothing(QUIET * 2)


def test_will_on_keepalive_expiry(raw, clients):
    topic = f"e2e/willka/{uid()}"
    watcher = _watcher(clients, topic)
    dev = raw(version=4)
    ack = dev.connect("ka-" + uid(), keepalive=SHORT_KEEPALIVE, will=Will(topic, b"timed out", qos=1))
    assert ack.reason_code == 0
    # Socket left open, nothing sent: after 1.5 x keepalive the server closes it and
    # publishes the will (MQTT-3.1.2-8, 3.1.2-24).
    msg = watcher.receive_one(timeout=SHORT_KEEPALIVE * 1.5 + TIMEOUT)
    assert (msg.topic, msg.payload) == (topic, b"timed out")
    dev.until_closed()


def test_will_after_protocol_error(raw, clients):
    topic = f"e2e/willbad/{uid()}"
    watcher = _watcher(clients, topic)
    dev = raw(version=5)
    dev.connect("bad-" + uid(), will=Will(topic, b"broken client", qos=1))
    dev.send_bytes(bytes([0x36, 0x06, 0x00, 0x01, ord("t"), 0x00, 0x01, 0x00]))  # QoS 3
    dev.until_closed()
    assert watcher.receive_one().payload == b"broken client"


def test_v5_disconnect_with_will_0x04(clients):
    topic = f"e2e/will04/{uid()}"
    watcher = _watcher(clients, topic)
    dev = clients(version=5)
    dev.connect(will=(topic, b"bye with will", 0, False))
    dev.disconnect(reason=0x04)
    msg = watcher.receive_one()
    assert (msg.payload, msg.qos) == (b"bye with will", 0)


def test_retained_will(clients):
    topic = f"e2e/willret/{uid()}"
    dev = clients(version=4)
    dev.connect(will=(topic, b"offline", 1, True))
    dev.drop()
    time.sleep(0.3)
    late = clients(version=4)
    late.connect()
    late.subscribe(topic, qos=1)
    msg = late.receive_one()
    assert (msg.payload, msg.retain) == (b"offline", True)


def test_v5_will_properties_forwarded(clients):
    topic = f"e2e/willprops/{uid()}"
    watcher = _watcher(clients, topic)
    dev = clients(version=5)
    wp = props(PacketTypes.WILLMESSAGE, ContentType="text/plain", UserProperty=[("k", "v")])
    dev.connect(will=(topic, b"w", 1, False), will_properties=wp)
    dev.drop()
    msg = watcher.receive_one()
    assert msg.properties.ContentType == "text/plain"
    assert msg.properties.UserProperty == [("k", "v")]


def test_v5_will_delay(raw, clients):
    topic = f"e2e/willdelay/{uid()}"
    watcher = _watcher(clients, topic)
    dev = raw(version=5)
    dev.connect(
        "wd-" + uid(), clean_start=True,
        properties=Properties(session_expiry_interval=60),
        will=Will(topic, b"late will", qos=1, properties=Properties(will_delay_interval=2)),
    )
    dev.close()
    watcher.nothing(1.0)  # not before the delay
    msg = watcher.receive_one(timeout=TIMEOUT)
    assert msg.payload == b"late will"


def test_v5_will_delay_cancelled_by_reconnect(raw, clients):
    topic = f"e2e/willcancel/{uid()}"
    cid = "wc-" + uid()
    watcher = _watcher(clients, topic)
    dev = raw(version=5)
    dev.connect(
        cid, properties=Properties(session_expiry_interval=60),
        will=Will(topic, b"must not fire", qos=1, properties=Properties(will_delay_interval=2)),
    )
    dev.close()
    time.sleep(0.5)
    back = raw(version=5)
    ack = back.connect(cid, clean_start=False, properties=Properties(session_expiry_interval=60))
    assert (ack.reason_code, ack.session_present) == (0, True)
    watcher.nothing(3.0)  # past the delay: the reconnect cancelled the will
    back.disconnect()


def test_v5_will_at_session_end_when_shorter_than_delay(raw, clients):
    """The will is sent when the session ends, if that comes before the will delay."""
    topic = f"e2e/willsess/{uid()}"
    watcher = _watcher(clients, topic)
    dev = raw(version=5)
    dev.connect(
        "ws-" + uid(), properties=Properties(session_expiry_interval=0),
        will=Will(topic, b"session over", qos=1, properties=Properties(will_delay_interval=60)),
    )
    dev.close()
    assert watcher.receive_one().payload == b"session over"

