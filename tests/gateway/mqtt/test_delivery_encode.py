"""One encoded PUBLISH per message for every 3.1/3.1.1 QoS 0 delivery (delivery.py)."""

from __future__ import annotations

from types import SimpleNamespace

from gateway.mqtt.codec import MqttCodec
from gateway.mqtt.delivery import encode_publish
from gateway.mqtt.message import MqttMessage
from gateway.mqtt.packets import Publish


def _conn(version: int) -> SimpleNamespace:
    codec = MqttCodec(1 << 20)
    codec.protocol_version = version
    return SimpleNamespace(version=version, codec=codec, alias_max=0, alias_out={})


def test_sessions_share_the_encoded_qos0_publish():
    msg = MqttMessage("s/t", b"payload", 1)
    a, b = _conn(4), _conn(3)
    first = encode_publish(a, msg, 0, False, (), None, False, 0)
    assert encode_publish(b, msg, 0, False, (), None, False, 0) is first
    retained = encode_publish(a, msg, 0, True, (), None, False, 0)
    assert retained is not first
    reader = MqttCodec(1 << 20, role="client")
    reader.protocol_version = 4
    (p,) = reader.feed(first)
    assert type(p) is Publish and (p.topic, p.payload, p.qos, p.retain) == ("s/t", b"payload",
                                                                           0, False)
    # QoS 1 (packet ids differ) and v5 (aliases, properties) are encoded per session.
    q1 = encode_publish(a, msg, 1, False, (), 7, False, 0)
    assert q1 != first and encode_publish(_conn(5), msg, 0, False, (), None, False, 0) != first
