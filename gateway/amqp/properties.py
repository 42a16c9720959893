"""Content header properties of class basic (the only content class in 0-9-1).

A content header frame's payload is `class-id:uint16 weight:uint16 (0) body-size:uint64`
then the property flags and the property list. Flags are uint16 words: bit 15 of the first
word says the first property is present, bit 14 the second, and so on; bit 0 set means
another flag word follows (spec section 4.2.6.1). Basic has 14 properties, so one word
suffices: bits 15..2 are used and bits 1 and 0 must be clear. Only present properties
are on the wire, in order, each in its own type (no bit packing).
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

from gateway.amqp.errors import SYNTAX_ERROR, AmqpError
from gateway.amqp.fields import (
    Timestamp,
    decode_shortstr,
    decode_table,
    encode_shortstr,
    encode_table,
)

__all__ = ["BasicProperties", "decode_properties", "encode_properties", "EMPTY_PROPERTIES",
           "PROPERTIES_MEMO"]

_U16 = struct.Struct(">H")
_U8 = struct.Struct(">B")
_U64 = struct.Struct(">Q")


class BasicProperties(NamedTuple):
    """Message properties; None means absent. `timestamp` is seconds since the epoch."""

    content_type: str | None = None
    content_encoding: str | None = None
    headers: dict[str, Any] | None = None
    delivery_mode: int | None = None  # 1 transient, 2 persistent
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration: str | None = None
    message_id: str | None = None
    timestamp: int | None = None
    type: str | None = None
    user_id: str | None = None
    app_id: str | None = None
    cluster_id: str | None = None


# Property kinds in wire order: S shortstr, T table, o octet, t timestamp.
_KINDS = "SSToo" "SSSS" "tSSSS"
_FLAG_BITS = tuple(1 << (15 - i) for i in range(len(_KINDS)))
_USED_BITS = sum(_FLAG_BITS)

#: The encoding of "no properties" (flags 0).
EMPTY_PROPERTIES = b"\x00\x00"


def encode_properties(props: BasicProperties) -> bytes:
    """Flags and property list. Raises ValueError on a value the wire cannot carry."""
    flags = 0
    parts: list[bytes] = [b""]
    try:
        for bit, kind, value in zip(_FLAG_BITS, _KINDS, props, strict=True):
            if value is None:
                continue
            flags |= bit
            if kind == "S":
                parts.append(encode_shortstr(value))
            elif kind == "T":
                parts.append(encode_table(value))
            elif kind == "o":
                parts.append(_U8.pack(value))
            else:
                parts.append(_U64.pack(int(value)))
    except struct.error as exc:
        raise ValueError(str(exc)) from None
    parts[0] = _U16.pack(flags)
    return b"".join(parts)


#: Property lists up to this size without `headers` are decoded once and then served from
#: `PROPERTIES_MEMO`: publishers repeat the same few (content type, delivery mode, ...), and
#: the result is immutable. Anything with headers (a mutable dict) is decoded every time.
_CACHED_MAX_SIZE = 128
_HEADERS_FLAG_HIGH_OCTET = 0x20  # flag bit 13 = bit 5 of the first flag octet
#: At most this many entries in PROPERTIES_MEMO; it starts over when full.
PROPERTIES_MEMO_SIZE = 256
#: Encoded property list -> its decoding, for the lists `decode_properties` shares (the
#: publish scanner, gateway/amqp/publish_scan.py, looks its properties up here).
PROPERTIES_MEMO: dict[bytes, BasicProperties] = {}


def decode_properties(buf: Any, off: int = 0) -> BasicProperties:
    """Decode flags and property list at `off`, which must end exactly at the buffer's end."""
    if 2 <= len(buf) - off <= _CACHED_MAX_SIZE and not buf[off] & _HEADERS_FLAG_HIGH_OCTET:
        raw = bytes(buf[off:])
        props = PROPERTIES_MEMO.get(raw)
        if props is None:
            props = _decode(raw, 0)
            if len(PROPERTIES_MEMO) >= PROPERTIES_MEMO_SIZE:
                PROPERTIES_MEMO.clear()
            PROPERTIES_MEMO[raw] = props
        return props
    return _decode(buf, off)


def _decode(buf: Any, off: int) -> BasicProperties:
    if off + 2 > len(buf):
        raise AmqpError(SYNTAX_ERROR, "content header without property flags")
    flags = _U16.unpack_from(buf, off)[0]
    off += 2
    if flags & ~_USED_BITS:
        # Bit 0 (continuation) or bit 1: basic has no 15th property.
        raise AmqpError(SYNTAX_ERROR, f"unknown content property flags {flags:#06x}")
    if not flags:
        if off != len(buf):
            raise AmqpError(SYNTAX_ERROR, "octets after the content properties")
        return _NONE
    values: list[Any] = [None] * len(_KINDS)
    for i, (bit, kind) in enumerate(zip(_FLAG_BITS, _KINDS, strict=True)):
        if not flags & bit:
            continue
        if kind == "S":
            values[i], off = decode_shortstr(buf, off)
        elif kind == "T":
            values[i], off = decode_table(buf, off)
        elif kind == "o":
            if off >= len(buf):
                raise AmqpError(SYNTAX_ERROR, "truncated content property")
            values[i] = buf[off]
            off += 1
        else:
            if off + 8 > len(buf):
                raise AmqpError(SYNTAX_ERROR, "truncated content property")
            values[i] = Timestamp(_U64.unpack_from(buf, off)[0])
            off += 8
    if off != len(buf):
        raise AmqpError(SYNTAX_ERROR, "octets after the content properties")
    return BasicProperties(*values)


_NONE = BasicProperties()
