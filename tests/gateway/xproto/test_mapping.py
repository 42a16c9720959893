"""The amq.topic bridge without sockets: the routing lookup and the property mapping."""

from __future__ import annotations

from gateway.amqp.mqtt_bridge import mqtt_envelope, mqtt_properties, mqtt_topic_of
from gateway.amqp.properties import BasicProperties, decode_properties
from gateway.mqtt.message import MqttMessage, from_properties, to_properties
from gateway.mqtt.packets import Properties
from gateway.routing.route_table import Route, RouteTable, amqp_key_to_topic, mqtt_topic_to_key


def test_topic_and_key_mapping_is_rabbitmqs():
    assert mqtt_topic_to_key("a/b/c") == "a.b.c"
    assert mqtt_topic_to_key("a/+/#") == "a.*.#"
    assert amqp_key_to_topic("a.*.#") == "a/+/#"
    assert mqtt_topic_to_key("v1.2/x") == "v1.2.x"  # a dot stays a word separator
    assert mqtt_topic_of("a.b") == "a/b"
    for key in ("", "a.*", "a.#", "$SYS.x", "a\x00b"):
        assert mqtt_topic_of(key) is None


def test_mqtt_publish_lmqs_adds_amq_topic_bindings_and_follows_changes():
    t = RouteTable()
    t.add(Route("mqtt", "a/#", "%LMQ%m_x"))
    assert t.mqtt_publish_lmqs("a/b") == ("%LMQ%m_x",)
    bind = Route("topic", "a.*", "%LMQ%a_q", "amq.topic")
    t.add(bind)
    t.add(Route("topic", "a.*", "%LMQ%a_other", "other-exchange"))
    assert t.mqtt_publish_lmqs("a/b") == ("%LMQ%a_q", "%LMQ%m_x")
    assert t.mqtt_publish_lmqs("a/b/c") == ("%LMQ%m_x",)
    assert t.mqtt_publish_lmqs("$SYS/a") == ()
    t.remove(bind)  # the remembered answer goes with the change
    assert t.mqtt_publish_lmqs("a/b") == ("%LMQ%m_x",)


def test_mqtt_message_seen_by_amqp():
    msg = MqttMessage("s/1/t", b"", 1, props=Properties(
        content_type="text/plain", response_topic="s/1/r", correlation_data=b"\xff\x00",
        user_properties=(("k", "v"), ("k", "w"))), expiry_at=10_000)
    exchange, key, raw = mqtt_envelope(to_properties(msg), now_ms=4_000)
    p = decode_properties(raw)
    assert (exchange, key) == ("amq.topic", "s.1.t")
    assert p.content_type == "text/plain" and p.reply_to == "s.1.r"
    assert p.correlation_id is None and p.headers["x-correlation-data"] == b"\xff\x00"
    assert p.headers["k"] == "w" and p.headers["x-mqtt-publish-qos"] == 1
    assert p.delivery_mode == 2 and p.expiration == "6000"
    assert mqtt_envelope({"OTHER": "x"}, 0) is None


def test_amqp_message_seen_by_mqtt_and_back():
    props = BasicProperties(content_type="a/b", correlation_id="id-1", reply_to="r.s",
                            expiration="5000", delivery_mode=2,
                            headers={"s": "x", "i": 7, "t": True, "nested": {"a": 1}})
    stored = mqtt_properties("t/u", props, now_ms=1_000)
    msg = from_properties(stored, b"body")
    assert (msg.topic, msg.qos, msg.retain, msg.expiry_at) == ("t/u", 1, False, 6_000)
    assert msg.props.content_type == "a/b" and msg.props.response_topic == "r/s"
    assert msg.props.correlation_data == b"id-1"
    assert dict(msg.props.user_properties) == {"s": "x", "i": "7", "t": "true"}
    # Back to AMQP: the same properties (headers as text).
    _, key, raw = mqtt_envelope(stored, now_ms=1_000)
    back = decode_properties(raw)
    assert key == "t.u" and back.correlation_id == "id-1" and back.reply_to == "r.s"
    assert back.expiration == "5000" and back.headers["i"] == "7"
    # QoS: delivery mode 1 or none is 0; the header wins when it is 0, 1 or 2.
    assert from_properties(mqtt_properties("t", BasicProperties(), 0), b"").qos == 0
    two = BasicProperties(headers={"x-mqtt-publish-qos": 2})
    assert from_properties(mqtt_properties("t", two, 0), b"").qos == 2
    bad = BasicProperties(delivery_mode=2, headers={"x-mqtt-publish-qos": 7})
    assert from_properties(mqtt_properties("t", bad, 0), b"").qos == 1


def test_expired_mqtt_publish_is_not_delivered_to_amqp():
    from types import SimpleNamespace

    from gateway.amqp.dead_letter import delivery_fault
    from gateway.amqp.queue_args import NO_ARGS

    queue = SimpleNamespace(args=NO_ARGS)

    def popped(props):
        return SimpleNamespace(message=SimpleNamespace(properties=props, store_timestamp=0),
                               delivery_count=1)

    stored = to_properties(MqttMessage("t", b"", 1, expiry_at=5_000))
    assert delivery_fault(queue, popped(stored), now_ms=4_999) is None
    assert delivery_fault(queue, popped(stored), now_ms=5_000) == "expired"
    for bad in ("", "x1", "9" * 5000):  # not ours: ignored, never an error
        assert delivery_fault(queue, popped({"MQTT_EXPIRY_AT": bad}), now_ms=1) is None


def test_user_property_names_too_long_for_a_table_are_left_out():
    long_name = "n" * 300
    msg = MqttMessage("t", b"", 0, props=Properties(
        user_properties=((long_name, "v"), ("ok", "w"))))
    _, _, raw = mqtt_envelope(to_properties(msg), now_ms=0)
    headers = decode_properties(raw).headers
    assert long_name not in headers and headers["ok"] == "w"
