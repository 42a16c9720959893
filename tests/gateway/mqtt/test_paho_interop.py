"""Our codec against a real client: paho-mqtt over a real TCP connection.

The test plays the server with nothing but a socket and MqttCodec: it decodes the bytes
paho writes (CONNECT, SUBSCRIBE, PUBLISH, acks, DISCONNECT) and answers with bytes we
encode (CONNACK, SUBACK, PUBLISH, acks), which paho must parse and act on.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.subscribeoptions import SubscribeOptions

from gateway.mqtt.codec import MqttCodec
from gateway.mqtt.packets import (
    PINGREQ,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
)

PAHO_PROTOCOL = {3: mqtt.MQTTv31, 4: mqtt.MQTTv311, 5: mqtt.MQTTv5}


class Broker:
    """One accepted connection served by MqttCodec, driven step by step from the test."""

    def __init__(self, conn: socket.socket, client: mqtt.Client) -> None:
        self.conn = conn
        self.client = client
        self.codec = MqttCodec()
        self.pending: list[Packet] = []

    def receive(self) -> Packet:
        """The next packet paho sends; runs paho's loop meanwhile so it can answer us."""
        for _ in range(200):
            if self.pending:
                return self.pending.pop(0)
            try:
                data = self.conn.recv(65536)
            except TimeoutError:
                self.client.loop(timeout=0.01)
                continue
            assert data, "paho closed the connection"
            self.pending += self.codec.feed(data)
        raise AssertionError("paho sent nothing")

    def send(self, packet: Packet) -> None:
        self.conn.sendall(self.codec.encode(packet))

    def run_client_until(self, done: Callable[[], bool]) -> None:
        for _ in range(100):
            if done():
                return
            rc = self.client.loop(timeout=0.05)
            assert rc == mqtt.MQTT_ERR_SUCCESS, f"paho loop failed: {rc}"
        raise AssertionError("paho did not get there")


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.create_server(("127.0.0.1", 0))
    sock.settimeout(5)
    yield sock
    sock.close()


def start(
    listener: socket.socket, version: int, events: dict[str, Any], **connect_kw: Any
) -> Broker:
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id="dev-1", protocol=PAHO_PROTOCOL[version]
    )
    client.on_connect = lambda c, u, flags, rc, props: events.update(connack=(flags, rc, props))
    client.on_subscribe = lambda c, u, mid, rcs, props: events.update(suback=(mid, rcs, props))
    client.on_unsubscribe = lambda c, u, mid, rcs, props: events.update(unsuback=(mid, rcs))
    client.on_publish = lambda c, u, mid, rc, props: events.setdefault("published", []).append(mid)
    client.on_message = lambda c, u, msg: events.setdefault("messages", []).append(msg)
    client.username_pw_set("user", "secret")
    client.will_set("will/dev-1", b"gone", qos=1, retain=True)
    client.connect("127.0.0.1", listener.getsockname()[1], keepalive=30, **connect_kw)
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.settimeout(0.02)
    return Broker(conn, client)


@pytest.mark.parametrize("version", [3, 4])
def test_paho_v3_session(listener: socket.socket, version: int) -> None:
    events: dict[str, Any] = {}
    broker = start(listener, version, events)
    try:
        connect = broker.receive()
        assert isinstance(connect, Connect)
        assert (connect.protocol_version, connect.client_id, connect.keepalive) == (
            version,
            "dev-1",
            30,
        )
        assert (connect.username, connect.password) == ("user", b"secret")
        assert connect.will is not None
        assert (connect.will.topic, connect.will.payload, connect.will.qos) == (
            "will/dev-1",
            b"gone",
            1,
        )
        assert connect.will.retain and connect.clean_start

        broker.send(Connack(session_present=False, reason_code=0))
        broker.run_client_until(lambda: "connack" in events)
        assert events["connack"][1] == 0

        _, mid = broker.client.subscribe([("a/+", 1), ("b/#", 2), ("c", 0)])
        sub = broker.receive()
        assert sub == Subscribe(
            mid, (Subscription("a/+", 1), Subscription("b/#", 2), Subscription("c", 0))
        )
        broker.send(Suback(mid, (1, 2, 0x80)))
        broker.run_client_until(lambda: "suback" in events)
        assert [int(rc.value) for rc in events["suback"][1]] == [1, 2, 0x80]

        info = broker.client.publish("a/x", b"\x00payload\xff", qos=1, retain=True)
        pub = broker.receive()
        assert pub == Publish("a/x", b"\x00payload\xff", 1, True, False, info.mid)
        broker.send(Puback(info.mid))
        broker.run_client_until(lambda: info.mid in events.get("published", []))

        # Server -> client at QoS 1 (paho acks) and QoS 2 (the full four-way handshake).
        broker.send(Publish("b/c/d", b"hello", qos=1, packet_id=7))
        assert broker.receive() == Puback(7)
        broker.send(Publish("b/q2", b"x" * 300, qos=2, packet_id=8))
        assert broker.receive() == Pubrec(8)
        broker.send(Pubrel(8))
        assert broker.receive() == Pubcomp(8)
        broker.run_client_until(lambda: len(events.get("messages", [])) == 2)
        first, second = events["messages"]
        assert (first.topic, first.payload, first.qos) == ("b/c/d", b"hello", 1)
        assert (second.topic, second.payload, second.qos) == ("b/q2", b"x" * 300, 2)

        _, mid = broker.client.unsubscribe(["a/+"])
        assert broker.receive() == Unsubscribe(mid, ("a/+",))
        broker.send(Unsuback(mid))
        broker.run_client_until(lambda: "unsuback" in events)

        broker.client.disconnect()
        assert broker.receive() == Disconnect()
    finally:
        broker.conn.close()


def test_paho_v5_session_with_properties(listener: socket.socket) -> None:
    events: dict[str, Any] = {}
    props = PahoProperties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    props.ReceiveMaximum = 20
    props.MaximumPacketSize = 4096
    props.UserProperty = [("region", "eu"), ("region", "us")]
    broker = start(listener, 5, events, properties=props, clean_start=False)
    try:
        connect = broker.receive()
        assert isinstance(connect, Connect)
        assert connect.protocol_version == 5 and not connect.clean_start
        assert connect.properties.session_expiry_interval == 3600
        assert connect.properties.receive_maximum == 20
        assert connect.properties.user_properties == (("region", "eu"), ("region", "us"))
        assert broker.codec.peer_max_packet_size == 4096

        broker.send(
            Connack(
                True,
                0,
                Properties(
                    assigned_client_identifier="srv-1",
                    topic_alias_maximum=10,
                    receive_maximum=100,
                    maximum_qos=1,
                    retain_available=1,
                    wildcard_subscription_available=1,
                    shared_subscription_available=1,
                    server_keep_alive=25,
                    user_properties=(("node", "a"),),
                ),
            )
        )
        broker.run_client_until(lambda: "connack" in events)
        flags, rc, connack_props = events["connack"]
        assert flags.session_present and rc == 0
        assert connack_props.AssignedClientIdentifier == "srv-1"
        assert connack_props.TopicAliasMaximum == 10
        assert connack_props.UserProperty == [("node", "a")]

        sub_props = PahoProperties(PacketTypes.SUBSCRIBE)
        sub_props.SubscriptionIdentifier = 42
        options = SubscribeOptions(qos=1, noLocal=True, retainAsPublished=True, retainHandling=2)
        _, mid = broker.client.subscribe(
            [("$share/g1/a/+", SubscribeOptions(qos=0)), ("s/#", options)], properties=sub_props
        )
        sub = broker.receive()
        assert isinstance(sub, Subscribe) and sub.packet_id == mid
        assert sub.properties.subscription_identifiers == (42,)
        assert sub.subscriptions == (
            Subscription("$share/g1/a/+", 0),
            Subscription("s/#", 1, True, True, 2),
        )
        broker.send(Suback(mid, (0x00, 0x9E), Properties(reason_string="no shared here")))
        broker.run_client_until(lambda: "suback" in events)
        assert [int(rc.value) for rc in events["suback"][1]] == [0x00, 0x9E]

        pub_props = PahoProperties(PacketTypes.PUBLISH)
        pub_props.ContentType = "application/json"
        pub_props.MessageExpiryInterval = 60
        pub_props.ResponseTopic = "reply/dev-1"
        pub_props.CorrelationData = b"\x01\x02"
        pub_props.UserProperty = [("k", "v")]
        info = broker.client.publish("t/json", b"{}", qos=1, properties=pub_props)
        pub = broker.receive()
        assert isinstance(pub, Publish)
        assert (pub.topic, pub.payload, pub.qos, pub.packet_id) == ("t/json", b"{}", 1, info.mid)
        assert pub.properties == Properties(
            content_type="application/json",
            message_expiry_interval=60,
            response_topic="reply/dev-1",
            correlation_data=b"\x01\x02",
            user_properties=(("k", "v"),),
        )
        broker.send(Puback(info.mid, 0x10, Properties(reason_string="nobody listens")))
        broker.run_client_until(lambda: info.mid in events.get("published", []))

        # Server -> client: several subscription identifiers and a topic alias (paho
        # resolves aliases it allowed: it did not, so send the full topic name too).
        broker.send(
            Publish(
                "s/deep/x",
                b"data",
                qos=1,
                packet_id=9,
                properties=Properties(
                    subscription_identifiers=(42, 7),
                    payload_format_indicator=1,
                    user_properties=(("a", "1"), ("b", "2")),
                ),
            )
        )
        assert broker.receive() == Puback(9)
        broker.run_client_until(lambda: len(events.get("messages", [])) == 1)
        [msg] = events["messages"]
        assert (msg.topic, msg.payload) == ("s/deep/x", b"data")
        assert msg.properties.SubscriptionIdentifier == [42, 7]
        assert msg.properties.UserProperty == [("a", "1"), ("b", "2")]

        broker.client.loop(0.01)
        dis_props = PahoProperties(PacketTypes.DISCONNECT)
        dis_props.SessionExpiryInterval = 0
        broker.client.disconnect(reasoncode=None, properties=dis_props)
        dis = broker.receive()
        assert isinstance(dis, Disconnect) and dis.properties.session_expiry_interval == 0
    finally:
        broker.conn.close()


def test_paho_keepalive_ping(listener: socket.socket) -> None:
    events: dict[str, Any] = {}
    broker = start(listener, 4, events)
    try:
        broker.receive()
        broker.send(Connack())
        broker.run_client_until(lambda: "connack" in events)
        broker.client._send_pingreq()  # what paho sends when keepalive expires
        assert broker.receive() == PINGREQ
    finally:
        broker.conn.close()
