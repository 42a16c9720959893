"""MQTT and AMQP on one message through `amq.topic` (docs/amqp.md, "MQTT and AMQP on one
message").

The routes are one table (gateway/routing/route_table.py): an MQTT publish on `a/b` also
reaches the queues bound to `amq.topic` with keys matching `a.b`, and an AMQP publish to
`amq.topic` with key `a.b` also reaches MQTT subscribers of filters matching `a/b`; the
message is stored once either way. This module converts what travels with it:

* `mqtt_envelope`: a message an MQTT client published (stored with the `MQTT_*`
  properties of gateway/mqtt/message.py), delivered to an AMQP consumer: exchange
  `amq.topic`, its routing key, and AMQP content properties built from the MQTT ones.
* `mqtt_properties`: the `MQTT_*` properties added to an AMQP publish that reaches MQTT
  subscribers, so the MQTT gateways read it as they read MQTT traffic.

The mapping (both ways): content type <-> content-type; correlation data <-> correlation-id
(UTF-8 text; binary correlation data goes to the header `x-correlation-data`); response
topic <-> reply-to (as a routing key: `a/b` <-> `a.b`); message expiry interval <->
expiration (ms); user properties <-> headers (scalar values as text); QoS <->
delivery-mode and the header `x-mqtt-publish-qos`, as RabbitMQ's MQTT plugin: an MQTT
publish with QoS 0 is delivery-mode 1 (transient), QoS 1 or 2 is 2 (persistent); an AMQP
message is QoS `x-mqtt-publish-qos` when that header says 0, 1 or 2, else 1 for
delivery-mode 2 and 0 otherwise (a subscriber receives the lower of that and its own QoS).
"""

from __future__ import annotations

import decimal
import time
from typing import Any

from gateway.amqp.properties import BasicProperties, encode_properties
from gateway.mqtt.message import MqttMessage, from_properties, to_properties
from gateway.mqtt.packets import NO_PROPERTIES, Properties
from gateway.routing.bridge import AMQP_LMQ_PREFIXES, note_foreign_writer
from gateway.routing.route_table import (
    BRIDGE_EXCHANGE,
    RouteTable,
    amqp_key_to_topic,
    mqtt_topic_to_key,
)

__all__ = ["QOS_HEADER", "CORRELATION_HEADER", "add_mqtt_properties", "mqtt_envelope",
           "mqtt_lmqs_of_key", "mqtt_properties", "mqtt_topic_of"]

#: RabbitMQ's header for the QoS an MQTT message was published with.
QOS_HEADER = "x-mqtt-publish-qos"
#: Correlation data that is not UTF-8 text (or longer than a shortstr) travels here.
CORRELATION_HEADER = "x-correlation-data"
_SHORTSTR = 255
#: Headers that describe the bridge itself, not user properties.
_OWN_HEADERS = (QOS_HEADER, CORRELATION_HEADER)


def _shortstr(text: str | None) -> str | None:
    if not text:
        return None
    try:
        return text if len(text.encode("utf-8")) <= _SHORTSTR else None
    except UnicodeEncodeError:
        return None


def mqtt_envelope(props: dict[str, str], now_ms: int) -> tuple[str, str, bytes] | None:
    """(exchange, routing key, raw AMQP properties) of a stored MQTT publish; None when
    `props` do not describe one."""
    msg = from_properties(props, b"")
    if msg is None:
        return None
    p = msg.props
    headers: dict[str, Any] = {}
    correlation_id = None
    content_type = reply_to = None
    if p is not NO_PROPERTIES:
        for name, value in p.user_properties:
            if _shortstr(name) is not None:  # a table's names are shortstrs: longer ones go
                headers[name] = value  # a repeated name: the last value (a table has one)
        content_type = _shortstr(p.content_type)
        if p.response_topic:
            reply_to = _shortstr(mqtt_topic_to_key(p.response_topic))
        cd = p.correlation_data
        if cd is not None:
            try:
                correlation_id = _shortstr(cd.decode("utf-8"))
            except UnicodeDecodeError:
                correlation_id = None
            if correlation_id is None:
                headers[CORRELATION_HEADER] = bytes(cd)
    headers[QOS_HEADER] = msg.qos
    expiration = None
    if msg.expiry_at is not None:
        expiration = str(max(0, msg.expiry_at - now_ms))
    props_out = BasicProperties(
        content_type=content_type, headers=headers, delivery_mode=2 if msg.qos else 1,
        correlation_id=correlation_id, reply_to=reply_to, expiration=expiration)
    try:
        raw = encode_properties(props_out)
    except ValueError:  # something the wire cannot carry: the delivery still goes out
        raw = encode_properties(BasicProperties(delivery_mode=props_out.delivery_mode,
                                                expiration=expiration))
    return BRIDGE_EXCHANGE, mqtt_topic_to_key(msg.topic), raw


def mqtt_topic_of(routing_key: str) -> str | None:
    """The MQTT topic name an AMQP routing key of `amq.topic` reaches; None when it is no
    valid topic name (empty, wildcards, NUL, not UTF-8) or starts with `$` (the
    gateway's own `$SYS` tree is not writable from AMQP)."""
    topic = amqp_key_to_topic(routing_key)
    if not topic or topic[0] == "$" or "+" in topic or "#" in topic or "\x00" in topic:
        return None
    try:
        topic.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return topic


def _text(value: Any) -> str | None:
    """A header value as a user property value (scalars only)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float, decimal.Decimal)):
        text = str(value)
    elif isinstance(value, (bytes, bytearray)):
        try:
            text = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return None
    else:
        return None  # tables, arrays, void: no MQTT counterpart
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return text


def mqtt_properties(topic: str, props: BasicProperties, now_ms: int) -> dict[str, str]:
    """The `MQTT_*` stored properties of an AMQP publish on `topic` (`mqtt_topic_of`)."""
    headers = props.headers or {}
    qos = headers.get(QOS_HEADER)
    if type(qos) is not int or qos not in (0, 1, 2):
        qos = 1 if props.delivery_mode == 2 else 0
    user: list[tuple[str, str]] = []
    cd: bytes | None = None
    for name, value in headers.items():
        if name in _OWN_HEADERS:
            if name == CORRELATION_HEADER and isinstance(value, (bytes, bytearray)):
                cd = bytes(value)
            continue
        text = _text(value)
        if text is not None and _text(name) is not None:
            user.append((name, text))
    if props.correlation_id:
        try:
            cd = props.correlation_id.encode("utf-8")
        except UnicodeEncodeError:
            pass
    response_topic = None
    if props.reply_to:
        response_topic = mqtt_topic_of(props.reply_to)
    v5 = NO_PROPERTIES
    content_type = props.content_type if _text(props.content_type) else None
    if content_type or response_topic or cd is not None or user:
        v5 = Properties(content_type=content_type, response_topic=response_topic,
                        correlation_data=cd, user_properties=tuple(user))
    expiry_at = None
    if props.expiration is not None:
        try:
            expiry_at = now_ms + max(0, int(props.expiration))
        except ValueError:
            expiry_at = None  # refused earlier (406); never here
    return to_properties(MqttMessage(topic, b"", qos, False, v5, expiry_at))


def mqtt_lmqs_of_key(table: RouteTable, routing_key: str) -> tuple[str, ...]:
    """LMQs of the MQTT filters an `amq.topic` publish with `routing_key` reaches
    (remembered per topic by the table)."""
    topic = mqtt_topic_of(routing_key)
    return () if topic is None else table.mqtt_lmqs_sorted(topic)


def add_mqtt_properties(props: dict[str, str], routing_key: str,
                        properties: BasicProperties, lmqs: list[str]) -> None:
    """Add the `MQTT_*` properties to the stored properties `props` of an `amq.topic`
    publish whose LMQs include MQTT ones, and tell the local MQTT gateways before it is
    stored (routing/bridge.py)."""
    if all(lmq.startswith(AMQP_LMQ_PREFIXES) for lmq in lmqs):
        return
    topic = mqtt_topic_of(routing_key)
    if topic is None:
        return
    props.update(mqtt_properties(topic, properties, int(time.time() * 1000)))
    note_foreign_writer()
