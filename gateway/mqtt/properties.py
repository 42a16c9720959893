"""MQTT wire data types and MQTT 5.0 properties (spec §1.5 and §2.2.2).

Byte layouts (all integers big-endian):

* Two/Four Byte Integer: 16/32-bit unsigned.
* Variable Byte Integer: 7 bits per byte, low group first, high bit = "more"; at most 4
  bytes, so at most 268,435,455 (§1.5.5).
* UTF-8 Encoded String: two-byte length + well-formed UTF-8 without U+0000 and without
  surrogate code points (MQTT-1.5.4-1/-2); anything else is a Malformed Packet.
* Binary Data: two-byte length + bytes. String Pair: two UTF-8 strings.
* Properties: Variable Byte Integer length, then (identifier, value) pairs. The identifier
  is a Variable Byte Integer; every defined one is below 0x80, so it is one byte.

Decoders take a memoryview (format "B") over a packet body plus [pos, end) bounds and
return (value, new_pos); they raise `MqttProtocolError` 0x81 when data are missing or
invalid and 0x82 for the protocol errors the spec names (a property repeated, a value out
of its range).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from enum import IntEnum
from typing import Any

from gateway.mqtt.packets import NO_PROPERTIES, MqttProtocolError, PacketType, Properties

__all__ = [
    "MAX_VARINT",
    "WILL",
    "NO_PROPERTIES",
    "Properties",
    "PropertyId",
    "PropertyType",
    "allowed_properties",
    "decode_binary",
    "decode_properties",
    "decode_string",
    "decode_varint",
    "encode_binary",
    "encode_properties",
    "encode_string",
    "encode_varint",
    "property_field",
    "property_type",
    "varint_size",
]

U16 = struct.Struct(">H")
U32 = struct.Struct(">I")

#: Largest Variable Byte Integer (four bytes of seven bits).
MAX_VARINT = 268_435_455

#: Pseudo packet type for the properties of a Will Message (CONNECT payload).
WILL = 0


def _malformed(message: str) -> MqttProtocolError:
    return MqttProtocolError(0x81, message)


def _protocol_error(message: str) -> MqttProtocolError:
    return MqttProtocolError(0x82, message)


# -- primitive data types ---------------------------------------------------------------


def decode_varint(mv: memoryview, pos: int, end: int) -> tuple[int, int]:
    """Read a Variable Byte Integer at `pos`; more than four bytes is malformed (§1.5.5)."""
    value = 0
    shift = 0
    while True:
        if pos >= end:
            raise _malformed("truncated variable byte integer")
        byte = mv[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift == 28:
            raise _malformed("variable byte integer longer than 4 bytes")


def encode_varint(value: int) -> bytes:
    """Encode a Variable Byte Integer (0 .. 268,435,455)."""
    if value < 0x80:
        if value < 0:
            raise ValueError("variable byte integer must not be negative")
        return _SMALL_VARINTS[value]
    if value > MAX_VARINT:
        raise ValueError(f"{value} does not fit a variable byte integer")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


_SMALL_VARINTS = [bytes((i,)) for i in range(0x80)]


def varint_size(value: int) -> int:
    """Number of bytes `encode_varint(value)` produces."""
    if value < 0x80:
        return 1
    if value < 0x4000:
        return 2
    if value < 0x200000:
        return 3
    return 4


def decode_string(mv: memoryview, pos: int, end: int) -> tuple[str, int]:
    """Read a UTF-8 Encoded String; ill-formed UTF-8 or U+0000 is malformed (MQTT-1.5.4)."""
    if pos + 2 > end:
        raise _malformed("truncated string length")
    stop = pos + 2 + ((mv[pos] << 8) | mv[pos + 1])
    if stop > end:
        raise _malformed("truncated string")
    try:
        # Python's strict UTF-8 decoder already refuses overlong forms and encoded
        # surrogates (U+D800..U+DFFF), exactly what MQTT-1.5.4-1 forbids.
        text = str(mv[pos + 2 : stop], "utf-8")
    except UnicodeDecodeError:
        raise _malformed("string is not well-formed UTF-8") from None
    if "\x00" in text:
        raise _malformed("string contains U+0000")
    return text, stop


def encode_string(text: str) -> bytes:
    """Encode a UTF-8 Encoded String (length prefix + UTF-8)."""
    data = text.encode("utf-8")  # lone surrogates raise UnicodeEncodeError here
    if len(data) > 0xFFFF:
        raise ValueError("string longer than 65535 bytes")
    return U16.pack(len(data)) + data


def decode_binary(mv: memoryview, pos: int, end: int) -> tuple[bytes, int]:
    """Read Binary Data (two-byte length + bytes)."""
    if pos + 2 > end:
        raise _malformed("truncated binary data length")
    stop = pos + 2 + ((mv[pos] << 8) | mv[pos + 1])
    if stop > end:
        raise _malformed("truncated binary data")
    return bytes(mv[pos + 2 : stop]), stop


def encode_binary(data: bytes) -> bytes:
    """Encode Binary Data (two-byte length + bytes)."""
    if len(data) > 0xFFFF:
        raise ValueError("binary data longer than 65535 bytes")
    return U16.pack(len(data)) + bytes(data)


# -- the property table -----------------------------------------------------------------


class PropertyId(IntEnum):
    """Every MQTT 5.0 property identifier (§2.2.2.2)."""

    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


class PropertyType(IntEnum):
    """Wire data type of a property value."""

    BYTE = 1
    TWO_BYTE_INT = 2
    FOUR_BYTE_INT = 3
    VARINT = 4
    UTF8_STRING = 5
    BINARY = 6
    STRING_PAIR = 7


def _mask(*types: int) -> int:
    bits = 0
    for t in types:
        bits |= 1 << t
    return bits


_P = PacketType
_ALL = _mask(
    WILL,
    _P.CONNECT,
    _P.CONNACK,
    _P.PUBLISH,
    _P.PUBACK,
    _P.PUBREC,
    _P.PUBREL,
    _P.PUBCOMP,
    _P.SUBSCRIBE,
    _P.SUBACK,
    _P.UNSUBSCRIBE,
    _P.UNSUBACK,
    _P.DISCONNECT,
    _P.AUTH,
)
_ACKS_WITH_REASON_STRING = _mask(
    _P.CONNACK,
    _P.PUBACK,
    _P.PUBREC,
    _P.PUBREL,
    _P.PUBCOMP,
    _P.SUBACK,
    _P.UNSUBACK,
    _P.DISCONNECT,
    _P.AUTH,
)


def _bool(value: int) -> bool:
    return value in (0, 1)


def _nonzero(value: int) -> bool:
    return value != 0


class _Spec:
    __slots__ = ("pid", "field", "type", "mask", "check")

    def __init__(
        self,
        pid: PropertyId,
        ptype: PropertyType,
        mask: int,
        check: Callable[[int], bool] | None = None,
    ) -> None:
        self.pid = int(pid)
        self.field = pid.name.lower()
        self.type = ptype
        self.mask = mask
        self.check = check


_I = PropertyId
_T = PropertyType
_PUB_WILL = _mask(_P.PUBLISH, WILL)
_SPECS = [
    # The "where" column of the §2.2.2.2 table; value checks are the Protocol Errors that
    # §3.1.2.11 / §3.2.2.3 / §3.3.2.3 / §3.8.2.1 name for each property.
    _Spec(_I.PAYLOAD_FORMAT_INDICATOR, _T.BYTE, _PUB_WILL, _bool),
    _Spec(_I.MESSAGE_EXPIRY_INTERVAL, _T.FOUR_BYTE_INT, _PUB_WILL),
    _Spec(_I.CONTENT_TYPE, _T.UTF8_STRING, _PUB_WILL),
    _Spec(_I.RESPONSE_TOPIC, _T.UTF8_STRING, _PUB_WILL),
    _Spec(_I.CORRELATION_DATA, _T.BINARY, _PUB_WILL),
    _Spec(_I.SUBSCRIPTION_IDENTIFIER, _T.VARINT, _mask(_P.PUBLISH, _P.SUBSCRIBE), _nonzero),
    _Spec(
        _I.SESSION_EXPIRY_INTERVAL, _T.FOUR_BYTE_INT, _mask(_P.CONNECT, _P.CONNACK, _P.DISCONNECT)
    ),
    _Spec(_I.ASSIGNED_CLIENT_IDENTIFIER, _T.UTF8_STRING, _mask(_P.CONNACK)),
    _Spec(_I.SERVER_KEEP_ALIVE, _T.TWO_BYTE_INT, _mask(_P.CONNACK)),
    _Spec(_I.AUTHENTICATION_METHOD, _T.UTF8_STRING, _mask(_P.CONNECT, _P.CONNACK, _P.AUTH)),
    _Spec(_I.AUTHENTICATION_DATA, _T.BINARY, _mask(_P.CONNECT, _P.CONNACK, _P.AUTH)),
    _Spec(_I.REQUEST_PROBLEM_INFORMATION, _T.BYTE, _mask(_P.CONNECT), _bool),
    _Spec(_I.WILL_DELAY_INTERVAL, _T.FOUR_BYTE_INT, _mask(WILL)),
    _Spec(_I.REQUEST_RESPONSE_INFORMATION, _T.BYTE, _mask(_P.CONNECT), _bool),
    _Spec(_I.RESPONSE_INFORMATION, _T.UTF8_STRING, _mask(_P.CONNACK)),
    _Spec(_I.SERVER_REFERENCE, _T.UTF8_STRING, _mask(_P.CONNACK, _P.DISCONNECT)),
    _Spec(_I.REASON_STRING, _T.UTF8_STRING, _ACKS_WITH_REASON_STRING),
    _Spec(_I.RECEIVE_MAXIMUM, _T.TWO_BYTE_INT, _mask(_P.CONNECT, _P.CONNACK), _nonzero),
    _Spec(_I.TOPIC_ALIAS_MAXIMUM, _T.TWO_BYTE_INT, _mask(_P.CONNECT, _P.CONNACK)),
    _Spec(_I.TOPIC_ALIAS, _T.TWO_BYTE_INT, _mask(_P.PUBLISH), _nonzero),
    _Spec(_I.MAXIMUM_QOS, _T.BYTE, _mask(_P.CONNACK), _bool),
    _Spec(_I.RETAIN_AVAILABLE, _T.BYTE, _mask(_P.CONNACK), _bool),
    _Spec(_I.USER_PROPERTY, _T.STRING_PAIR, _ALL),
    _Spec(_I.MAXIMUM_PACKET_SIZE, _T.FOUR_BYTE_INT, _mask(_P.CONNECT, _P.CONNACK), _nonzero),
    _Spec(_I.WILDCARD_SUBSCRIPTION_AVAILABLE, _T.BYTE, _mask(_P.CONNACK), _bool),
    _Spec(_I.SUBSCRIPTION_IDENTIFIER_AVAILABLE, _T.BYTE, _mask(_P.CONNACK), _bool),
    _Spec(_I.SHARED_SUBSCRIPTION_AVAILABLE, _T.BYTE, _mask(_P.CONNACK), _bool),
]
_BY_ID: dict[int, _Spec] = {s.pid: s for s in _SPECS}
# The two repeatable properties keep plural field names in `Properties`.
_BY_ID[_I.SUBSCRIPTION_IDENTIFIER].field = "subscription_identifiers"
_BY_ID[_I.USER_PROPERTY].field = "user_properties"
_MAX_OF_TYPE = {_T.BYTE: 0xFF, _T.TWO_BYTE_INT: 0xFFFF, _T.FOUR_BYTE_INT: 0xFFFFFFFF}


def property_type(pid: int) -> PropertyType:
    """Wire data type of a property identifier."""
    return _BY_ID[pid].type


def property_field(pid: int) -> str:
    """Name of the `Properties` field that holds a property identifier."""
    return _BY_ID[pid].field


def allowed_properties(packet_type: int) -> frozenset[PropertyId]:
    """The property identifiers a packet type (or `WILL`) may carry (§2.2.2.2)."""
    bit = 1 << packet_type
    return frozenset(PropertyId(s.pid) for s in _SPECS if s.mask & bit)


def decode_properties(
    mv: memoryview, pos: int, end: int, packet_type: int
) -> tuple[Properties, int]:
    """Read a property block (length + properties) of `packet_type` starting at `pos`.

    An identifier that is unknown or not allowed in this packet is a Malformed Packet
    (§2.2.2.2); a non-repeatable property given twice, or a value outside its range, is
    a Protocol Error. In a SUBSCRIBE the Subscription Identifier may appear only once.
    """
    length, pos = decode_varint(mv, pos, end)
    if length == 0:
        return NO_PROPERTIES, pos
    stop = pos + length
    if stop > end:
        raise _malformed("property length exceeds the packet")
    bit = 1 << packet_type
    values: dict[str, Any] = {}
    user: list[tuple[str, str]] = []
    sub_ids: list[int] = []
    while pos < stop:
        spec = _BY_ID.get(mv[pos])
        pos += 1
        if spec is None or not spec.mask & bit:
            raise _malformed(f"property 0x{mv[pos - 1]:02X} not allowed in this packet")
        ptype = spec.type
        value: Any
        if ptype is _T.BYTE:
            if pos >= stop:
                raise _malformed("truncated property")
            value = mv[pos]
            pos += 1
        elif ptype is _T.TWO_BYTE_INT:
            if pos + 2 > stop:
                raise _malformed("truncated property")
            value = (mv[pos] << 8) | mv[pos + 1]
            pos += 2
        elif ptype is _T.FOUR_BYTE_INT:
            if pos + 4 > stop:
                raise _malformed("truncated property")
            (value,) = U32.unpack_from(mv, pos)
            pos += 4
        elif ptype is _T.VARINT:
            value, pos = decode_varint(mv, pos, stop)
        elif ptype is _T.UTF8_STRING:
            value, pos = decode_string(mv, pos, stop)
        elif ptype is _T.BINARY:
            value, pos = decode_binary(mv, pos, stop)
        else:  # STRING_PAIR, the user property: repeatable, order kept (§3.1.2.11.8)
            key, pos = decode_string(mv, pos, stop)
            val, pos = decode_string(mv, pos, stop)
            user.append((key, val))
            continue
        if spec.check is not None and not spec.check(value):
            raise _protocol_error(f"invalid value {value} for property {spec.field}")
        if spec.pid == _I.SUBSCRIPTION_IDENTIFIER:
            # Repeated only in a PUBLISH built from several matching subscriptions
            # (§3.3.2.3.8); a SUBSCRIBE names at most one (§3.8.2.1.2).
            if sub_ids and packet_type != _P.PUBLISH:
                raise _protocol_error("subscription identifier repeated")
            sub_ids.append(value)
            continue
        if spec.field in values:
            raise _protocol_error(f"property {spec.field} repeated")
        values[spec.field] = value
    if user:
        values["user_properties"] = tuple(user)
    if sub_ids:
        values["subscription_identifiers"] = tuple(sub_ids)
    return Properties(**values), pos


def _encode_value(spec: _Spec, value: Any) -> bytes:
    ptype = spec.type
    if spec.check is not None and not spec.check(value):
        raise ValueError(f"invalid value {value!r} for property {spec.field}")
    if ptype in _MAX_OF_TYPE:
        if not 0 <= value <= _MAX_OF_TYPE[ptype]:
            raise ValueError(f"property {spec.field} value {value} out of range")
        if ptype is _T.BYTE:
            return bytes((spec.pid, value))
        if ptype is _T.TWO_BYTE_INT:
            return bytes((spec.pid,)) + U16.pack(value)
        return bytes((spec.pid,)) + U32.pack(value)
    if ptype is _T.VARINT:
        return bytes((spec.pid,)) + encode_varint(value)
    if ptype is _T.UTF8_STRING:
        return bytes((spec.pid,)) + encode_string(value)
    if ptype is _T.BINARY:
        return bytes((spec.pid,)) + encode_binary(value)
    key, val = value
    return bytes((spec.pid,)) + encode_string(key) + encode_string(val)


_EMPTY_BLOCK = b"\x00"


def encode_properties(props: Properties, packet_type: int) -> bytes:
    """Encode a property block (length + properties) for `packet_type` (or `WILL`).

    Raises ValueError for a property the packet may not carry or a value out of range:
    that is a bug of the caller, never of the peer.
    """
    if props is NO_PROPERTIES:
        return _EMPTY_BLOCK
    bit = 1 << packet_type
    parts: list[bytes] = []
    for spec in _SPECS:
        value = getattr(props, spec.field)
        if value is None or value == ():
            continue
        if not spec.mask & bit:
            raise ValueError(f"property {spec.field} not allowed in packet type {packet_type}")
        if spec.pid == _I.USER_PROPERTY or spec.pid == _I.SUBSCRIPTION_IDENTIFIER:
            if (
                spec.pid == _I.SUBSCRIPTION_IDENTIFIER
                and len(value) > 1
                and packet_type != _P.PUBLISH
            ):
                raise ValueError("only a PUBLISH may carry several subscription identifiers")
            parts.extend(_encode_value(spec, v) for v in value)
        else:
            parts.append(_encode_value(spec, value))
    body = b"".join(parts)
    return encode_varint(len(body)) + body
