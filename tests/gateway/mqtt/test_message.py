"""The stored form of MQTT messages (gateway/mqtt/message.py) and the gateway config."""

from __future__ import annotations

import pytest

from core.common.properties import decode_properties, encode_properties
from gateway.mqtt.config import MqttConfig, load_mqtt_config
from gateway.mqtt.message import MqttMessage, from_properties, to_properties
from gateway.mqtt.packets import NO_PROPERTIES, Properties


def _roundtrip(msg: MqttMessage) -> MqttMessage:
    # Through the RocketMQ properties string, as the broker stores it.
    props = decode_properties(encode_properties(to_properties(msg)))
    out = from_properties(props, msg.payload)
    assert out is not None
    return out


def test_minimal_message():
    out = _roundtrip(MqttMessage("a/b", b"x", 1))
    assert (out.topic, out.payload, out.qos, out.retain, out.props) == ("a/b", b"x", 1, False,
                                                                        NO_PROPERTIES)


def test_all_v5_properties_and_unsafe_text_survive():
    props = Properties(payload_format_indicator=1, content_type="t/p\x01",
                       response_topic="r/\x02", correlation_data=b"\x00\x01\x02",
                       user_properties=(("k", "v"), ("k", "v2"), ("\x01", "é")))
    msg = MqttMessage("weird/\x01/topic", b"", 2, True, props, 123456, "client\x02id")
    out = _roundtrip(msg)
    assert out.topic == "weird/\x01/topic"
    assert out.props == props
    assert (out.qos, out.retain, out.expiry_at, out.sender) == (2, True, 123456, "client\x02id")


def test_not_an_mqtt_record():
    assert from_properties({"KEYS": "x"}, b"") is None


def test_remaining_expiry():
    msg = MqttMessage("t", b"", expiry_at=10_500)
    assert msg.remaining_expiry(10_000) == 1
    assert msg.remaining_expiry(5_000) == 6
    assert msg.expired(10_500) and not msg.expired(10_499)
    assert MqttMessage("t", b"").remaining_expiry(0) is None


def test_config_toml_and_overrides(tmp_path):
    path = tmp_path / "mqtt.toml"
    path.write_text("[mqtt]\nport = 1999\nmax_inflight_out = 7\n")
    cfg = load_mqtt_config(str(path), {"port": 2000, "ws_port": None})
    assert cfg.port == 2000 and cfg.max_inflight_out == 7 and cfg.ws_port is None
    path.write_text("bogus = 1\n")
    with pytest.raises(ValueError, match="bogus"):
        load_mqtt_config(str(path))


@pytest.mark.parametrize("kw", [dict(maximum_qos=3), dict(receive_maximum=0),
                                dict(tls_port=8883), dict(max_packet_size=1)])
def test_config_validation(kw):
    with pytest.raises(ValueError):
        MqttConfig(**kw)


def test_gateway_sweep_timeouts_come_from_the_toml_file(tmp_path):
    from gateway.mqtt.server import MqttGateway

    path = tmp_path / "mqtt.toml"
    path.write_text("[mqtt]\ngateway_orphan_timeout_s = 42.5\ngateway_sweep_interval_s = 3.0\n")
    cfg = load_mqtt_config(str(path), {"data_dir": str(tmp_path / "gw")})
    routes = MqttGateway(cfg, client=None).route_config
    assert (routes.orphan_timeout_s, routes.sweep_interval_s) == (42.5, 3.0)
    with pytest.raises(ValueError, match="gateway_orphan_timeout_s"):
        MqttConfig(gateway_orphan_timeout_s=0)
