"""One delivery as bytes: the PUBLISH a session sends for a stored message.

3.1/3.1.1 PUBLISHes are built straight from the message's fields (no `Publish` object, no
codec); a QoS 0 one is the same for every session and is encoded once per message. v5
ones carry per-session fields (expiry left, subscription identifiers, topic aliases).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.mqtt._encoding import publish_v3
from gateway.mqtt.message import MqttMessage
from gateway.mqtt.packets import Publish

if TYPE_CHECKING:
    from gateway.mqtt.connection import Connection

__all__ = ["build_publish", "encode_publish", "qos0_v3"]


def qos0_v3(msg: MqttMessage, retain: bool) -> bytes:
    """The 3.1/3.1.1 QoS 0 PUBLISH of `msg`: the same bytes for every such session, so
    encoded once per message (and RETAIN flag)."""
    if retain:
        data = msg.wire_retain
        if data is None:
            data = msg.wire_retain = publish_v3(msg.topic, msg.payload, 0, True, False, None)
        return data
    data = msg.wire
    if data is None:
        data = msg.wire = publish_v3(msg.topic, msg.payload, 0, False, False, None)
    return data


def build_publish(conn: Connection, msg: MqttMessage, qos: int, retain: bool,
                  sub_ids: tuple[int, ...], pid: int | None, dup: bool, now: int) -> Publish:
    """The PUBLISH for one delivery on `conn` (v5: expiry left, subscription ids, alias).

    A new topic alias is only proposed (topic and alias both set): `encode_publish`
    records it once the packet is encoded, i.e. will really reach the client.
    """
    topic = msg.topic
    if conn.version != 5:
        return Publish(topic, msg.payload, qos, retain, dup, pid)
    props = msg.props
    expiry = msg.remaining_expiry(now)
    alias = None
    if conn.alias_max:
        alias = conn.alias_out.get(topic)
        if alias is not None:
            topic = ""
        elif len(conn.alias_out) < conn.alias_max:
            alias = len(conn.alias_out) + 1
    if expiry is not None or sub_ids or alias is not None:
        from dataclasses import replace

        props = replace(props, message_expiry_interval=expiry, subscription_identifiers=sub_ids,
                        topic_alias=alias)
    return Publish(topic, msg.payload, qos, retain, dup, pid, props)


def encode_publish(conn: Connection, msg: MqttMessage, qos: int, retain: bool,
                   sub_ids: tuple[int, ...], pid: int | None, dup: bool, now: int) -> bytes:
    """Encode one delivery on `conn`; raises `PacketTooLarge` (client's Maximum Packet Size).

    A new outbound topic alias is recorded only after a successful encode: a discarded
    packet must not leave an alias the client never saw (the next PUBLISH would carry an
    empty topic with it, a protocol error on the client's side, v5 §3.3.2.3.4).
    """
    if conn.version != 5 and conn.codec.peer_max_packet_size is None:
        if qos:
            return publish_v3(msg.topic, msg.payload, qos, retain, dup, pid)
        return qos0_v3(msg, retain)
    packet = build_publish(conn, msg, qos, retain, sub_ids, pid, dup, now)
    data = conn.codec.encode(packet)
    if packet.topic and packet.properties.topic_alias is not None:
        conn.alias_out[packet.topic] = packet.properties.topic_alias
    return data
