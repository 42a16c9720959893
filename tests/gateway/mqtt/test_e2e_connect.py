"""Acceptance: connecting — CONNACK per protocol version, session present, clean start,
session takeover, keepalive, malformed input, and amqtt as a second real client.

The server is `lmq serve --mqtt-port` in a child process (see e2e_support.py).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from amqtt.client import MQTTClient
from amqtt.mqtt.constants import QOS_0, QOS_1, QOS_2

from gateway.mqtt.packets import PINGREQ, Disconnect, Pingresp, Properties, Publish
from tests.gateway.mqtt.e2e_support import (
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


# ---------------------------------------------------------------- CONNACK per version
@pytest.mark.parametrize("version", [3, 4, 5], ids=["v3.1", "v3.1.1", "v5"])
def test_connack_accepts_each_version(clients, version):
    c = clients(version=version)
    code, session_present, _ = c.connect(clean_start=True)
    assert (code, session_present) == (0, False)
    # The connection is usable: a round trip through the server.
    topic = f"e2e/conn/{uid()}"
    assert c.subscribe(topic, qos=1) == [1]
    c.publish(topic, b"hello", qos=1)
    msg = c.receive_one()
    assert (msg.topic, msg.payload, msg.qos) == (topic, b"hello", 1)
    c.disconnect()


def test_session_present_v311(clients):
    # (MQTT 3.1 has no Session Present flag: it came with 3.1.1.)
    c = clients(version=4)
    assert c.connect(clean_start=False)[:2] == (0, False)  # new session
    c.subscribe(f"e2e/sp/{uid()}", qos=1)
    c.disconnect()
    assert c.connect(clean_start=False)[:2] == (0, True)  # resumed
    c.disconnect()
    assert c.connect(clean_start=True)[:2] == (0, False)  # clean: discarded
    c.disconnect()
    # The clean session ended at its disconnect, and the old one is gone.
    assert c.connect(clean_start=False)[:2] == (0, False)
    c.disconnect()
    c.connect(clean_start=True)
    c.disconnect()


def test_session_present_v5_follows_session_expiry(clients):
    c = clients(version=5)
    keep = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    assert c.connect(clean_start=False, properties=keep)[:2] == (0, False)
    c.subscribe(f"e2e/sp5/{uid()}", qos=1)
    c.disconnect()
    assert c.connect(clean_start=False, properties=keep)[:2] == (0, True)
    c.disconnect()
    # Session Expiry Interval absent = 0: the session ends with this connection.
    assert c.connect(clean_start=False)[:2] == (0, True)
    c.disconnect()
    assert c.connect(clean_start=False)[:2] == (0, False)
    c.disconnect()


def test_clean_start_discards_subscriptions_and_messages(clients):
    topic = f"e2e/clean/{uid()}"
    sub, pub = clients(version=4), clients(version=4)
    sub.connect(clean_start=False)
    sub.subscribe(topic, qos=1)
    sub.disconnect()
    pub.connect()
    pub.publish(topic, b"queued", qos=1)
    assert sub.connect(clean_start=True)[:2] == (0, False)
    sub.nothing()  # the offline message went with the session
    pub.publish(topic, b"after", qos=1)
    sub.nothing()  # and so did the subscription


def test_v5_assigned_client_identifier(raw):
    c = raw(version=5)
    ack = c.connect("", clean_start=True)
    assert ack.reason_code == 0
    assert ack.properties.assigned_client_identifier  # MQTT-3.2.2-16


def test_v311_empty_client_id(raw):
    ok = raw(version=4)
    assert ok.connect("", clean_start=True).reason_code == 0
    refused = raw(version=4)
    # Zero-byte id with CleanSession=0: return code 2, then close (MQTT-3.1.3-8).
    assert refused.connect("", clean_start=False).reason_code == 2
    refused.until_closed()


def test_v5_connack_advertises_features(raw):
    ack = raw(version=5).connect("adv-" + uid())
    p = ack.properties
    assert ack.reason_code == 0
    # Absent means "available" for these (MQTT-3.2.2.3.*): they must not be 0.
    assert p.retain_available in (None, 1)
    assert p.wildcard_subscription_available in (None, 1)
    assert p.subscription_identifier_available in (None, 1)
    assert p.shared_subscription_available in (None, 1)
    assert p.maximum_qos in (None, 2)  # absent = QoS 2 supported
    assert p.topic_alias_maximum and p.topic_alias_maximum > 0


# ---------------------------------------------------------------- takeover
def test_takeover_v5_closes_old_connection_with_0x8e(raw, clients):
    cid = "take-" + uid()
    old, new = raw(version=5), clients(cid, version=5)
    assert old.connect(cid).reason_code == 0
    new.connect()
    got = old.until_closed()
    assert [(type(p), p.reason_code) for p in got] == [(Disconnect, 0x8E)]  # taken over
    topic = f"e2e/take/{uid()}"
    new.subscribe(topic, qos=1)
    new.publish(topic, b"x", qos=1)
    assert new.receive_one().payload == b"x"
    assert new.is_connected()


def test_takeover_v311_closes_old_connection(raw, clients):
    cid = "take3-" + uid()
    old = raw(version=4)
    assert old.connect(cid).reason_code == 0
    new = clients(cid, version=4)
    new.connect()
    assert old.until_closed() == []  # v3.1.1: no DISCONNECT from a server, just closed
    assert new.is_connected()


def test_takeover_keeps_persistent_session(clients):
    cid = "takes-" + uid()
    topic = f"e2e/takes/{uid()}"
    keep = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    old, new, pub = clients(cid), clients(cid), clients()
    old.connect(clean_start=False, properties=keep)
    old.subscribe(topic, qos=1)
    assert new.connect(clean_start=False, properties=keep)[:2] == (0, True)
    old.wait_closed()
    pub.connect()
    pub.publish(topic, b"to-new", qos=1)
    assert new.receive_one().payload == b"to-new"


# ---------------------------------------------------------------- keepalive / bad input
def test_keepalive_expiry_closes_connection(raw):
    c = raw(version=4)
    assert c.connect("ka-" + uid(), keepalive=SHORT_KEEPALIVE).reason_code == 0
    # Silent past 1.5 x keepalive: the server must close it (MQTT-3.1.2-24).
    assert c.until_closed(timeout=SHORT_KEEPALIVE * 1.5 + TIMEOUT) == []


def test_keepalive_expiry_v5_disconnect_0x8d(raw):
    c = raw(version=5)
    c.connect("ka5-" + uid(), keepalive=SHORT_KEEPALIVE)
    got = c.until_closed(timeout=SHORT_KEEPALIVE * 1.5 + TIMEOUT)
    assert [(type(p), p.reason_code) for p in got] == [(Disconnect, 0x8D)]  # Keep Alive timeout


def test_pingreq_keeps_connection_alive(raw):
    c = raw(version=4)
    c.connect("ping-" + uid(), keepalive=SHORT_KEEPALIVE)
    for _ in range(4):  # 2 s: past 1.5 x keepalive without any other traffic
        c.send(PINGREQ)
        assert isinstance(c.recv(), Pingresp)
        time.sleep(SHORT_KEEPALIVE / 2)
    c.send(PINGREQ)
    assert isinstance(c.recv(), Pingresp)


def test_malformed_packet_v5_disconnect_0x81(raw):
    c = raw(version=5)
    c.connect("bad5-" + uid())
    # PUBLISH with QoS 3 (both QoS bits set) is malformed (MQTT-3.3.1-4).
    c.send_bytes(bytes([0x36, 0x06, 0x00, 0x01, ord("t"), 0x00, 0x01, 0x00]))
    got = c.until_closed()
    assert got == [Disconnect(0x81)] or (
        len(got) == 1 and isinstance(got[0], Disconnect) and got[0].reason_code == 0x81
    )


def test_malformed_packet_v311_closes(raw):
    c = raw(version=4)
    c.connect("bad4-" + uid())
    c.send_bytes(bytes([0x36, 0x05, 0x00, 0x01, ord("t"), 0x00, 0x01]))
    assert c.until_closed() == []


def test_reserved_packet_type_closes(raw):
    c = raw(version=5)
    c.connect("bad0-" + uid())
    c.send_bytes(b"\x00\x00")  # packet type 0 is reserved
    got = c.until_closed()
    assert all(isinstance(p, Disconnect) and p.reason_code >= 0x80 for p in got)


def test_first_packet_not_connect_closes(raw):
    c = raw(version=4)
    c.send_bytes(bytes([0xC0, 0x00]))  # PINGREQ before CONNECT
    assert c.until_closed() == []


def test_silent_connection_closed_after_connect_timeout(raw):
    c = raw(version=4)  # TCP open, no CONNECT (connect_timeout_s = 2 in the tests)
    assert c.until_closed() == []


def test_garbage_does_not_hurt_the_server(raw, clients):
    # (An HTTP request would wait for the connect timeout: "GE" announces a 69-byte body.)
    for blob in (b"\xff" * 64, b"\x10\xff\xff\xff\xff\x7f", b"\x10\x00"):
        c = raw(version=5)
        c.send_bytes(blob)
        try:
            c.until_closed()
        except (TimeoutError, ConnectionResetError):
            pass
    ok = clients()
    assert ok.connect()[0] == 0


def test_publish_after_close_is_not_delivered(raw, clients):
    """Bytes after a malformed packet are not processed (the connection is dead)."""
    topic = f"e2e/dead/{uid()}"
    sub = clients()
    sub.connect()
    sub.subscribe(topic, qos=1)
    c = raw(version=5)
    c.connect("dead-" + uid())
    c.send_bytes(bytes([0x36, 0x06, 0x00, 0x01, ord("t"), 0x00, 0x01, 0x00])
                 + c.codec.encode(Publish(topic, b"after-garbage", qos=0, properties=Properties())))
    c.until_closed()
    sub.nothing()


# ---------------------------------------------------------------- amqtt
def test_amqtt_publish_subscribe_all_qos(gateway):
    topic = f"e2e/amqtt/{uid()}"

    async def scenario() -> list[tuple[str, bytes, int]]:
        sub = MQTTClient(client_id="am-sub-" + uid())
        pub = MQTTClient(client_id="am-pub-" + uid())
        await sub.connect(f"mqtt://127.0.0.1:{gateway.port}/")
        await pub.connect(f"mqtt://127.0.0.1:{gateway.port}/")
        granted = await sub.subscribe([(topic + "/#", QOS_2)])
        assert granted == [QOS_2]
        for qos in (QOS_0, QOS_1, QOS_2):
            await pub.publish(f"{topic}/q{qos}", f"m{qos}".encode(), qos=qos)
        got = []
        for _ in range(3):
            m = await sub.deliver_message(timeout_duration=TIMEOUT)
            got.append((m.topic, bytes(m.data), m.qos))
        await pub.disconnect()
        await sub.disconnect()
        return got

    got = asyncio.run(asyncio.wait_for(scenario(), 3 * TIMEOUT))
    assert got == [(f"{topic}/q{q}", f"m{q}".encode(), q) for q in (0, 1, 2)]


def test_amqtt_persistent_session_and_retained(gateway):
    topic = f"e2e/amqtt-s/{uid()}"
    cid = "am-p-" + uid()

    async def scenario() -> list[tuple[str, bytes, int, bool]]:
        url = f"mqtt://127.0.0.1:{gateway.port}/"
        sub = MQTTClient(client_id=cid)
        await sub.connect(url, cleansession=False)
        await sub.subscribe([(topic + "/live", QOS_1)])
        await sub.disconnect()
        pub = MQTTClient(client_id="am-q-" + uid())
        await pub.connect(url)
        await pub.publish(topic + "/live", b"offline", qos=QOS_1)
        await pub.publish(topic + "/ret", b"kept", qos=QOS_1, retain=True)
        await pub.disconnect()
        sub = MQTTClient(client_id=cid)
        await sub.connect(url, cleansession=False)
        got = []
        m = await sub.deliver_message(timeout_duration=TIMEOUT)
        got.append((m.topic, bytes(m.data), m.qos, bool(m.retain)))
        await sub.subscribe([(topic + "/ret", QOS_1)])
        m = await sub.deliver_message(timeout_duration=TIMEOUT)
        got.append((m.topic, bytes(m.data), m.qos, bool(m.retain)))
        await sub.disconnect()
        cleaner = MQTTClient(client_id=cid)
        await cleaner.connect(url, cleansession=True)
        await cleaner.publish(topic + "/ret", b"", qos=QOS_1, retain=True)
        await cleaner.disconnect()
        return got

    got = asyncio.run(asyncio.wait_for(scenario(), 3 * TIMEOUT))
    assert got == [(topic + "/live", b"offline", 1, False), (topic + "/ret", b"kept", 1, True)]
