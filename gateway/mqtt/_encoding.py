"""Packet -> bytes for MQTT 3.1 / 3.1.1 / 5.0 (the encoding half of `codec.MqttCodec`).

Pure functions of (packet, protocol version). Fields a version cannot carry are left
out: v3.x has no properties and no reason codes in acknowledgements, a v5 reason code in
a v3.x CONNACK becomes the nearest 3.1.1 return code and a v5 failure code in a v3.x
SUBACK becomes 0x80. v5 acknowledgements use the short forms the spec allows when the
reason code is 0 and / or there are no properties (§3.4.2.1, §3.14.2.1, §3.15.2.1).
A packet that cannot be valid (QoS 1 without a packet id, ...) raises ValueError: that is
a bug of the caller.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from gateway.mqtt.packets import (
    NO_PROPERTIES,
    PROTOCOL_NAMES,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    v3_connack_return_code,
)
from gateway.mqtt.properties import (
    WILL,
    encode_binary,
    encode_properties,
    encode_string,
    encode_varint,
    varint_size,
)

__all__ = ["encode_packet", "publish_size", "publish_v3", "publish_v3_head"]

_U16 = struct.Struct(">H")
_HEAD_SHORT = struct.Struct(">BBH")  # first byte, 1-byte remaining length, topic length
_HEAD_2 = struct.Struct(">BBBH")  # first byte, 2-byte remaining length, topic length
_CONNECT, _CONNACK, _PUBLISH, _SUBSCRIBE, _SUBACK = 1, 2, 3, 8, 9
_UNSUBSCRIBE, _UNSUBACK, _DISCONNECT, _AUTH = 10, 11, 14, 15


def encode_packet(packet: Packet, version: int) -> bytes:
    """Wire bytes of `packet` in protocol `version` (3, 4 or 5)."""
    return _ENCODERS[type(packet)](packet, version)


def publish_size(p: Publish, version: int) -> int:
    """Size of the encoded PUBLISH, without building it (no payload copy)."""
    length = 2 + len(p.topic.encode("utf-8")) + len(p.payload) + (2 if p.qos else 0)
    if version == 5:
        length += len(encode_properties(p.properties, _PUBLISH))
    return 1 + varint_size(length) + length


def _pid(packet_id: int) -> bytes:
    if not 0 < packet_id <= 0xFFFF:
        raise ValueError("packet id must be 1..65535")
    return _U16.pack(packet_id)


def _frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_varint(len(body)) + body


def _connect(c: Connect, version: int) -> bytes:
    if c.protocol_version not in PROTOCOL_NAMES:
        raise ValueError("unsupported protocol version")
    v5 = c.protocol_version == 5
    flags = 0x02 if c.clean_start else 0
    parts = [encode_string(PROTOCOL_NAMES[c.protocol_version]), b""]
    if v5:
        parts.append(encode_properties(c.properties, _CONNECT))
    parts.append(encode_string(c.client_id))
    if c.will is not None:
        w = c.will
        if w.qos not in (0, 1, 2):
            raise ValueError("will QoS must be 0, 1 or 2")
        flags |= 0x04 | (w.qos << 3) | (0x20 if w.retain else 0)
        if v5:
            parts.append(encode_properties(w.properties, WILL))
        parts.append(encode_string(w.topic))
        parts.append(encode_binary(w.payload))
    if c.username is not None:
        flags |= 0x80
        parts.append(encode_string(c.username))
    if c.password is not None:
        flags |= 0x40
        parts.append(encode_binary(c.password))
    parts[1] = bytes((c.protocol_version, flags)) + _U16.pack(c.keepalive)
    return _frame(0x10, b"".join(parts))


def _connack(c: Connack, version: int) -> bytes:
    if version == 5:
        props = encode_properties(c.properties, _CONNACK)
        return _frame(0x20, bytes((int(c.session_present), c.reason_code)) + props)
    code = c.reason_code if c.reason_code <= 5 else v3_connack_return_code(c.reason_code)
    # 3.1 had no session-present flag: the byte was reserved (0).
    present = int(c.session_present) if version == 4 else 0
    return bytes((0x20, 2, present, code))


def publish_v3(topic: str, payload: bytes, qos: int, retain: bool, dup: bool,
               packet_id: int | None) -> bytes:
    """A 3.1/3.1.1 PUBLISH straight from its fields (the delivery hot path: no `Publish`
    object, no codec; 3.x has no properties and no peer Maximum Packet Size)."""
    if qos:
        if qos > 2 or not packet_id or packet_id > 0xFFFF:
            raise ValueError("QoS 1/2 PUBLISH needs QoS <= 2 and packet id 1..65535")
        head = publish_v3_head(topic, len(payload) + 2, qos, retain, dup)
        return b"".join((head, _U16.pack(packet_id), payload))
    return publish_v3_head(topic, len(payload), 0, retain, dup) + payload


def publish_v3_head(topic: str, rest: int, qos: int = 0, retain: bool = False,
                    dup: bool = False) -> bytes:
    """The fixed header and topic of a 3.1/3.1.1 PUBLISH whose `rest` (packet id and
    payload) follows: the same bytes for every message of a topic and payload size."""
    t = topic.encode("utf-8")
    if not t:
        raise ValueError("empty topic name")
    first = 0x30 | (qos << 1) | (0x01 if retain else 0) | (0x08 if dup else 0)
    length = 2 + len(t) + rest
    if length < 0x80:
        head = _HEAD_SHORT.pack(first, length, len(t))
    elif length < 0x4000:
        head = _HEAD_2.pack(first, 0x80 | (length & 0x7F), length >> 7, len(t))
    else:
        head = bytes((first,)) + encode_varint(length) + _U16.pack(len(t))
    return head + t


def _publish(p: Publish, version: int) -> bytes:
    # Hot path (once per delivery): one join, the header packed by a precompiled struct
    # when the remaining length fits one byte.
    topic = p.topic.encode("utf-8")
    qos = p.qos
    if version == 5:
        props = encode_properties(p.properties, _PUBLISH)
        if not topic and p.properties.topic_alias is None:
            raise ValueError("empty topic name needs a topic alias")
    else:
        props = b""
        if not topic:
            raise ValueError("empty topic name")
    first = 0x30 | (qos << 1) | (0x01 if p.retain else 0) | (0x08 if p.dup else 0)
    length = 2 + len(topic) + len(props) + len(p.payload)
    if qos:
        if qos > 2 or not p.packet_id or p.packet_id > 0xFFFF:
            raise ValueError("QoS 1/2 PUBLISH needs QoS <= 2 and packet id 1..65535")
        length += 2
        pid = _U16.pack(p.packet_id)
    elif p.packet_id is not None or p.dup or qos < 0:
        raise ValueError("QoS 0 PUBLISH has no packet id and no DUP")
    else:
        pid = b""
    if length < 0x80:
        head = _HEAD_SHORT.pack(first, length, len(topic))
    else:
        head = bytes((first,)) + encode_varint(length) + _U16.pack(len(topic))
    return b"".join((head, topic, pid, props, p.payload))


_ACK_FIRST: dict[type, int] = {Puback: 0x40, Pubrec: 0x50, Pubrel: 0x62, Pubcomp: 0x70}


def _ack(a: Puback | Pubrec | Pubrel | Pubcomp, version: int) -> bytes:
    first = _ACK_FIRST[type(a)]
    pid = _pid(a.packet_id)
    if version != 5 or (a.reason_code == 0 and a.properties is NO_PROPERTIES):
        return bytes((first, 2)) + pid
    if a.properties is NO_PROPERTIES:
        return bytes((first, 3)) + pid + bytes((a.reason_code,))
    props = encode_properties(a.properties, first >> 4)
    return _frame(first, pid + bytes((a.reason_code,)) + props)


def _subscribe(s: Subscribe, version: int) -> bytes:
    if not s.subscriptions:
        raise ValueError("SUBSCRIBE needs at least one subscription")
    parts = [_pid(s.packet_id)]
    if version == 5:
        parts.append(encode_properties(s.properties, _SUBSCRIBE))
    for sub in s.subscriptions:
        if sub.qos not in (0, 1, 2) or sub.retain_handling not in (0, 1, 2):
            raise ValueError("subscription QoS and retain handling must be 0..2")
        options = sub.qos
        if version == 5:
            options |= (
                (0x04 if sub.no_local else 0)
                | (0x08 if sub.retain_as_published else 0)
                | (sub.retain_handling << 4)
            )
        parts.append(encode_string(sub.topic_filter) + bytes((options,)))
    return _frame(0x82, b"".join(parts))


def _suback(s: Suback, version: int) -> bytes:
    if version == 5:
        body = _pid(s.packet_id) + encode_properties(s.properties, _SUBACK)
        return _frame(0x90, body + bytes(s.reason_codes))
    codes = bytes(c if c < 0x80 else 0x80 for c in s.reason_codes)
    return _frame(0x90, _pid(s.packet_id) + codes)


def _unsubscribe(u: Unsubscribe, version: int) -> bytes:
    if not u.topic_filters:
        raise ValueError("UNSUBSCRIBE needs at least one topic filter")
    parts = [_pid(u.packet_id)]
    if version == 5:
        parts.append(encode_properties(u.properties, _UNSUBSCRIBE))
    parts.extend(encode_string(f) for f in u.topic_filters)
    return _frame(0xA2, b"".join(parts))


def _unsuback(u: Unsuback, version: int) -> bytes:
    if version != 5:
        return b"\xb0\x02" + _pid(u.packet_id)
    body = _pid(u.packet_id) + encode_properties(u.properties, _UNSUBACK)
    return _frame(0xB0, body + bytes(u.reason_codes))


def _reason_and_props(first: int, code: int, props: Properties, ptype: int) -> bytes:
    if props is NO_PROPERTIES:
        return bytes((first, 0)) if code == 0 else bytes((first, 1, code))
    return _frame(first, bytes((code,)) + encode_properties(props, ptype))


def _disconnect(d: Disconnect, version: int) -> bytes:
    if version != 5:
        return b"\xe0\x00"
    return _reason_and_props(0xE0, d.reason_code, d.properties, _DISCONNECT)


def _auth(a: Auth, version: int) -> bytes:
    if version != 5:
        raise ValueError("AUTH exists only in MQTT 5.0")
    return _reason_and_props(0xF0, a.reason_code, a.properties, _AUTH)


def _pingreq(packet: Pingreq, version: int) -> bytes:
    return b"\xc0\x00"


def _pingresp(packet: Pingresp, version: int) -> bytes:
    return b"\xd0\x00"


_ENCODERS: dict[type, Callable[[Any, int], bytes]] = {
    Connect: _connect,
    Connack: _connack,
    Publish: _publish,
    Puback: _ack,
    Pubrec: _ack,
    Pubrel: _ack,
    Pubcomp: _ack,
    Subscribe: _subscribe,
    Suback: _suback,
    Unsubscribe: _unsubscribe,
    Unsuback: _unsuback,
    Pingreq: _pingreq,
    Pingresp: _pingresp,
    Disconnect: _disconnect,
    Auth: _auth,
}
