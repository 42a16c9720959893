"""AMQP 0-9-1 field values: short/long strings, field tables and field arrays.

Byte layouts (all integers big-endian):
  shortstr  octet length, then that many octets (at most 255)
  longstr   uint32 length, then that many octets
  table     uint32 byte length, then (shortstr name, octet type, value) pairs
  array     uint32 byte length, then (octet type, value) items

Value types are RabbitMQ's (its errata to the 0-9-1 grammar, which every client follows):
  t bool(octet)  b int8   B uint8   s int16  u uint16  I int32  i uint32  l int64
  f float32      d float64  D decimal (octet scale, int32 unscaled)  S longstr
  x byte array (longstr)  A array  T timestamp (uint64 seconds)  F table  V void

Decoded values: bool, int, float, `decimal.Decimal`, str ('S', UTF-8 with surrogateescape
so any octets round-trip), bytes ('x'), list, dict, `Timestamp` (an int), None.
Encoding picks the type from the Python value: bool 't', int 'I' or 'l', float 'd',
Decimal 'D', str 'S', bytes 'x', Timestamp/datetime 'T', list 'A', dict 'F', None 'V'.
Integer widths other than I/l are not kept: a peer's 'b' 5 comes back as 'I' 5, as with
pika and RabbitMQ's own clients.

Faults raise `AmqpError(502 SYNTAX_ERROR)`. Nesting is bounded by `MAX_TABLE_DEPTH` so a
hostile table cannot exhaust the stack; sizes are bounded by the frame that carries them.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from types import MappingProxyType
from typing import Any

from gateway.amqp.errors import SYNTAX_ERROR, AmqpError

__all__ = [
    "MAX_TABLE_DEPTH",
    "Timestamp",
    "decode_table",
    "encode_table",
    "encode_shortstr",
    "encode_longstr",
]

#: Nested tables/arrays deeper than this are refused (502). RabbitMQ's own parser has no
#: explicit bound; 32 levels is far beyond any real header and keeps recursion shallow.
MAX_TABLE_DEPTH = 32

_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_SCALARS: dict[int, tuple[struct.Struct, bool]] = {
    # type octet -> (layout, decode as bool)
    ord("t"): (struct.Struct(">B"), True),
    ord("b"): (struct.Struct(">b"), False),
    ord("B"): (struct.Struct(">B"), False),
    ord("s"): (struct.Struct(">h"), False),
    ord("u"): (struct.Struct(">H"), False),
    ord("I"): (struct.Struct(">i"), False),
    ord("i"): (struct.Struct(">I"), False),
    ord("l"): (struct.Struct(">q"), False),
    ord("f"): (struct.Struct(">f"), False),
    ord("d"): (struct.Struct(">d"), False),
}
_DECIMAL = struct.Struct(">Bi")
_T = ord("T")
_S = ord("S")
_X = ord("x")
_A = ord("A")
_F = ord("F")
_V = ord("V")
_D = ord("D")


class Timestamp(int):
    """A field-table timestamp (seconds since the epoch, uint64); an int that keeps its type."""

    __slots__ = ()

    def to_datetime(self) -> datetime:
        return datetime.fromtimestamp(self, UTC)


def _syntax(message: str) -> AmqpError:
    return AmqpError(SYNTAX_ERROR, message)


# ---------------------------------------------------------------- strings


def encode_shortstr(value: str | bytes) -> bytes:
    raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)
    if len(raw) > 255:
        raise ValueError(f"short string longer than 255 octets ({len(raw)})")
    return _U8.pack(len(raw)) + raw


def encode_longstr(value: str | bytes) -> bytes:
    raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)
    if len(raw) > 0xFFFFFFFF:
        raise ValueError("long string longer than 2**32-1 octets")
    return _U32.pack(len(raw)) + raw


def decode_shortstr(buf: bytes, off: int) -> tuple[str, int]:
    try:
        n = buf[off]
    except IndexError:
        raise _syntax("truncated short string") from None
    end = off + 1 + n
    if end > len(buf):
        raise _syntax("truncated short string")
    return bytes(buf[off + 1:end]).decode("utf-8", "surrogateescape"), end


def decode_longstr(buf: bytes, off: int) -> tuple[bytes, int]:
    if off + 4 > len(buf):
        raise _syntax("truncated long string")
    end = off + 4 + _U32.unpack_from(buf, off)[0]
    if end > len(buf):
        raise _syntax("truncated long string")
    return bytes(buf[off + 4:end]), end


# ---------------------------------------------------------------- tables


def encode_table(table: Mapping[str, Any] | None) -> bytes:
    """Encode a dict as a field table (None and {} give an empty table)."""
    if not table:
        return b"\x00\x00\x00\x00"
    parts: list[bytes] = []
    try:
        for key, value in table.items():
            parts.append(encode_shortstr(key))
            _encode_value(value, parts, 0)
    except struct.error as exc:  # an integer out of its type's range
        raise ValueError(str(exc)) from None
    body = b"".join(parts)
    return _U32.pack(len(body)) + body


def encode_array(items: list[Any] | tuple[Any, ...]) -> bytes:
    parts: list[bytes] = []
    try:
        for value in items:
            _encode_value(value, parts, 0)
    except struct.error as exc:
        raise ValueError(str(exc)) from None
    body = b"".join(parts)
    return _U32.pack(len(body)) + body


def _encode_value(value: Any, parts: list[bytes], depth: int) -> None:
    if depth > MAX_TABLE_DEPTH:
        raise ValueError("field table nested too deeply")
    if value is None:
        parts.append(b"V")
    elif isinstance(value, bool):
        parts.append(b"t\x01" if value else b"t\x00")
    elif isinstance(value, Timestamp):
        parts.append(b"T" + struct.pack(">Q", value))
    elif isinstance(value, int):
        if -0x80000000 <= value <= 0x7FFFFFFF:
            parts.append(b"I" + struct.pack(">i", value))
        else:
            parts.append(b"l" + _I64.pack(value))  # struct.error (a ValueError) if too big
    elif isinstance(value, str):
        parts.append(b"S" + encode_longstr(value))
    elif isinstance(value, (bytes, bytearray, memoryview)):
        parts.append(b"x" + encode_longstr(bytes(value)))
    elif isinstance(value, float):
        parts.append(b"d" + struct.pack(">d", value))
    elif isinstance(value, Decimal):
        sign, digits, exponent = value.as_tuple()
        if not isinstance(exponent, int):
            raise ValueError(f"decimal {value} cannot be encoded")
        unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
        if exponent > 0:
            unscaled, exponent = unscaled * 10**exponent, 0
        parts.append(b"D" + _DECIMAL.pack(-exponent, unscaled))
    elif isinstance(value, datetime):
        parts.append(b"T" + struct.pack(">Q", int(value.timestamp())))
    elif isinstance(value, (dict, MappingProxyType)):
        inner: list[bytes] = []
        for key, item in value.items():
            inner.append(encode_shortstr(key))
            _encode_value(item, inner, depth + 1)
        body = b"".join(inner)
        parts.append(b"F" + _U32.pack(len(body)) + body)
    elif isinstance(value, (list, tuple)):
        inner = []
        for item in value:
            _encode_value(item, inner, depth + 1)
        body = b"".join(inner)
        parts.append(b"A" + _U32.pack(len(body)) + body)
    else:
        raise ValueError(f"cannot encode {type(value).__name__} in a field table")


def decode_table(buf: bytes, off: int, depth: int = 0) -> tuple[dict[str, Any], int]:
    """Decode the field table at `off`; return (table, offset after it)."""
    if off + 4 > len(buf):
        raise _syntax("truncated field table")
    end = off + 4 + _U32.unpack_from(buf, off)[0]
    if end > len(buf):
        raise _syntax("field table longer than its frame")
    if depth > MAX_TABLE_DEPTH:
        raise _syntax("field table nested too deeply")
    table: dict[str, Any] = {}
    off += 4
    while off < end:
        key, off = decode_shortstr(buf, off)
        if off >= end:
            raise _syntax("field table entry without a value")
        table[key], off = _decode_value(buf, off, end, depth)
    if off != end:
        raise _syntax("field table entry overruns the table")
    return table, end


def _decode_array(buf: bytes, off: int, depth: int) -> tuple[list[Any], int]:
    if off + 4 > len(buf):
        raise _syntax("truncated field array")
    end = off + 4 + _U32.unpack_from(buf, off)[0]
    if end > len(buf):
        raise _syntax("field array longer than its frame")
    if depth > MAX_TABLE_DEPTH:
        raise _syntax("field array nested too deeply")
    items: list[Any] = []
    off += 4
    while off < end:
        value, off = _decode_value(buf, off, end, depth)
        items.append(value)
    if off != end:
        raise _syntax("field array item overruns the array")
    return items, end


def _decode_value(buf: bytes, off: int, end: int, depth: int) -> tuple[Any, int]:
    """Decode one typed value at `off` that must end by `end`."""
    kind = buf[off]
    off += 1
    scalar = _SCALARS.get(kind)
    if scalar is not None:
        layout, as_bool = scalar
        if off + layout.size > end:
            raise _syntax("truncated field value")
        value = layout.unpack_from(buf, off)[0]
        return (bool(value) if as_bool else value), off + layout.size
    if kind == _S or kind == _X:
        raw, off = decode_longstr(buf, off)
        if off > end:
            raise _syntax("field value overruns its table")
        return (raw.decode("utf-8", "surrogateescape") if kind == _S else raw), off
    if kind == _T:
        if off + 8 > end:
            raise _syntax("truncated timestamp")
        return Timestamp(struct.unpack_from(">Q", buf, off)[0]), off + 8
    if kind == _F:
        value, off = decode_table(buf, off, depth + 1)
    elif kind == _A:
        value, off = _decode_array(buf, off, depth + 1)
    elif kind == _D:
        if off + 5 > end:
            raise _syntax("truncated decimal")
        scale, unscaled = _DECIMAL.unpack_from(buf, off)
        return Decimal(unscaled).scaleb(-scale), off + 5
    elif kind == _V:
        return None, off
    else:
        raise _syntax(f"unknown field type {chr(kind)!r}")
    if off > end:
        raise _syntax("field value overruns its table")
    return value, off
