"""`gateway.grpc5.mqtt_out.prepare` without sockets: which 5.x sends are MQTT traffic and
their stored form (docs/grpc.md "MQTT and AMQP subscribers"); end to end with real
clients in tests/gateway/xproto/test_grpc5_mqtt.py."""

from __future__ import annotations

import pytest

from gateway.grpc5.config import GrpcConfig
from gateway.grpc5.convert import GrpcError, OutgoingMessage
from gateway.grpc5.mqtt_out import prepare
from gateway.grpc5.proto import messaging_pb2 as pb
from gateway.mqtt.message import from_properties


def _msg(topic: str, props: dict[str, str], mtype: int = pb.NORMAL) -> OutgoingMessage:
    props = dict(props, UNIQ_KEY="id-1", TAGS="t")
    return OutgoingMessage(topic, props, b"x", 0, "id-1", mtype, None, False)


def test_send_with_mqtt_topic_gets_the_stored_mqtt_form():
    out = _msg("MQTT_MESSAGES", {"MQTT_TOPIC": "a/b", "site": "north"})
    prepare(out, GrpcConfig())
    assert out.mqtt_topic == "a/b"
    stored = from_properties(out.properties, b"x")
    assert (stored.topic, stored.qos, stored.retain) == ("a/b", 1, False)
    assert stored.props.user_properties == (("site", "north"),)
    assert out.properties["site"] == "north" and out.properties["TAGS"] == "t"
    out = _msg("MQTT_MESSAGES", {"MQTT_TOPIC": "a/b", "MQTT_QOS": "0"}, pb.FIFO)
    prepare(out, GrpcConfig())
    assert from_properties(out.properties, b"x").qos == 0


@pytest.mark.parametrize("topic, props", [
    ("Other", {"MQTT_TOPIC": "a/b"}),  # another topic: an ordinary property
    ("ns%MQTT_MESSAGES", {"MQTT_TOPIC": "a/b"}),  # a namespace's topic is another one
    ("MQTT_MESSAGES", {"site": "north"}),  # no MQTT topic: stored as before
])
def test_other_sends_are_left_alone(topic, props):
    out = _msg(topic, props)
    before = dict(out.properties)
    prepare(out, GrpcConfig())
    assert out.mqtt_topic is None and out.properties == before


def test_no_mqtt_traffic_when_the_store_topic_is_off():
    out = _msg("MQTT_MESSAGES", {"MQTT_TOPIC": "a/b"})
    prepare(out, GrpcConfig(mqtt_store_topic=""))
    assert out.mqtt_topic is None


@pytest.mark.parametrize("props, mtype, code", [
    ({"MQTT_TOPIC": "a/+"}, pb.NORMAL, pb.BAD_REQUEST),
    ({"MQTT_TOPIC": "a/#"}, pb.NORMAL, pb.BAD_REQUEST),
    ({"MQTT_TOPIC": ""}, pb.NORMAL, pb.BAD_REQUEST),
    ({"MQTT_TOPIC": "$SYS/x"}, pb.NORMAL, pb.BAD_REQUEST),
    ({"MQTT_TOPIC": "a/b", "MQTT_QOS": "3"}, pb.NORMAL, pb.BAD_REQUEST),
    ({"MQTT_TOPIC": "a/b", "MQTT_RETAIN": "1"}, pb.NORMAL, pb.ILLEGAL_MESSAGE_PROPERTY_KEY),
    ({"MQTT_TOPIC": "a/b", "MQTT_CLIENT": "c"}, pb.NORMAL, pb.ILLEGAL_MESSAGE_PROPERTY_KEY),
    ({"MQTT_TOPIC": "a/b"}, pb.DELAY, pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    ({"MQTT_TOPIC": "a/b"}, pb.TRANSACTION, pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    # Under the limit as a 5.x message, over it with the MQTT 5 user property copy:
    ({"MQTT_TOPIC": "a/b", "big": "v" * 20_000}, pb.NORMAL, pb.MESSAGE_PROPERTIES_TOO_LARGE),
])
def test_refusals(props, mtype, code):
    with pytest.raises(GrpcError) as err:
        prepare(_msg("MQTT_MESSAGES", props, mtype), GrpcConfig())
    assert err.value.code == code
