"""AMQP 0-9-1 methods: one small immutable class per method, encoded and decoded from a table.

A method frame's payload is `class-id:uint16 method-id:uint16` then the method's fields in
order. Field types: octet (o), short (s, uint16), long (l, uint32), longlong (L, uint64),
shortstr (S), longstr (X), table (T), timestamp (t, uint64) and bit (b); consecutive bits
share octets, least significant bit first, up to eight per octet (spec section 4.2.5.2).

Every method of the classes pika uses is here: connection, channel, access, exchange,
queue, basic, confirm and tx, including RabbitMQ's extensions (exchange bind/unbind,
basic.nack, confirm, connection.blocked/unblocked, connection.update-secret). Field names
follow the specification (with `global_qos` for basic.qos's `global` and `exchange_type`
for exchange.declare's `type`, which are Python keywords or builtins).

Each layout is compiled once into a list of steps; runs of fixed-size fields and bits are
read and written with a single precompiled `struct`. The publish/deliver path has its own
hand-written code in `gateway.amqp.codec`.
"""

from __future__ import annotations

import struct
from collections import namedtuple
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from gateway.amqp.errors import NOT_IMPLEMENTED, SYNTAX_ERROR, AmqpError
from gateway.amqp.fields import (
    decode_longstr,
    decode_shortstr,
    decode_table,
    encode_longstr,
    encode_shortstr,
    encode_table,
)

__all__ = ["METHODS", "Method", "decode_method", "encode_method"]

# class-id class-name / method-id method-name [content] : field:type ...
_SPEC = """
10 connection
 10 start: version_major:o=0 version_minor:o=9 server_properties:T mechanisms:X=PLAIN locales:X=en_US
 11 start_ok: client_properties:T mechanism:S=PLAIN response:X locale:S=en_US
 20 secure: challenge:X
 21 secure_ok: response:X
 30 tune: channel_max:s=0 frame_max:l=0 heartbeat:s=0
 31 tune_ok: channel_max:s=0 frame_max:l=0 heartbeat:s=0
 40 open: virtual_host:S=/ capabilities:S insist:b
 41 open_ok: known_hosts:S
 50 close: reply_code:s=0 reply_text:S class_id:s=0 method_id:s=0
 51 close_ok:
 60 blocked: reason:S
 61 unblocked:
 70 update_secret: new_secret:X reason:S
 71 update_secret_ok:
20 channel
 10 open: out_of_band:S
 11 open_ok: channel_id:X
 20 flow: active:b=1
 21 flow_ok: active:b=1
 40 close: reply_code:s=0 reply_text:S class_id:s=0 method_id:s=0
 41 close_ok:
30 access
 10 request: realm:S=/data exclusive:b passive:b=1 active:b=1 write:b=1 read:b=1
 11 request_ok: ticket:s=1
40 exchange
 10 declare: ticket:s=0 exchange:S exchange_type:S=direct passive:b durable:b auto_delete:b internal:b nowait:b arguments:T
 11 declare_ok:
 20 delete: ticket:s=0 exchange:S if_unused:b nowait:b
 21 delete_ok:
 30 bind: ticket:s=0 destination:S source:S routing_key:S nowait:b arguments:T
 31 bind_ok:
 40 unbind: ticket:s=0 destination:S source:S routing_key:S nowait:b arguments:T
 51 unbind_ok:
50 queue
 10 declare: ticket:s=0 queue:S passive:b durable:b exclusive:b auto_delete:b nowait:b arguments:T
 11 declare_ok: queue:S message_count:l=0 consumer_count:l=0
 20 bind: ticket:s=0 queue:S exchange:S routing_key:S nowait:b arguments:T
 21 bind_ok:
 30 purge: ticket:s=0 queue:S nowait:b
 31 purge_ok: message_count:l=0
 40 delete: ticket:s=0 queue:S if_unused:b if_empty:b nowait:b
 41 delete_ok: message_count:l=0
 50 unbind: ticket:s=0 queue:S exchange:S routing_key:S arguments:T
 51 unbind_ok:
60 basic
 10 qos: prefetch_size:l=0 prefetch_count:s=0 global_qos:b
 11 qos_ok:
 20 consume: ticket:s=0 queue:S consumer_tag:S no_local:b no_ack:b exclusive:b nowait:b arguments:T
 21 consume_ok: consumer_tag:S
 30 cancel: consumer_tag:S nowait:b
 31 cancel_ok: consumer_tag:S
 40 publish content: ticket:s=0 exchange:S routing_key:S mandatory:b immediate:b
 50 return content: reply_code:s=0 reply_text:S exchange:S routing_key:S
 60 deliver content: consumer_tag:S delivery_tag:L=0 redelivered:b exchange:S routing_key:S
 70 get: ticket:s=0 queue:S no_ack:b
 71 get_ok content: delivery_tag:L=0 redelivered:b exchange:S routing_key:S message_count:l=0
 72 get_empty: cluster_id:S
 80 ack: delivery_tag:L=0 multiple:b
 90 reject: delivery_tag:L=0 requeue:b=1
 100 recover_async: requeue:b
 110 recover: requeue:b
 111 recover_ok:
 120 nack: delivery_tag:L=0 multiple:b requeue:b=1
85 confirm
 10 select: nowait:b
 11 select_ok:
90 tx
 10 select:
 11 select_ok:
 20 commit:
 21 commit_ok:
 30 rollback:
 31 rollback_ok:
"""

#: Default of table fields: read-only, equal to the {} a decoded empty table gives.
_EMPTY_TABLE = MappingProxyType({})
_FIXED = {"o": "B", "s": "H", "l": "I", "L": "Q", "t": "Q"}
_HEAD = struct.Struct(">HH")


class Method:
    """Mixin of every method class (each is also a NamedTuple of its fields).

    Class attributes: CLASS_ID, METHOD_ID, NAME ("basic.publish"), HAS_CONTENT (a content
    header and body frames follow the method frame), FIELDS ((name, type letter), ...).
    """

    __slots__ = ()
    CLASS_ID: int
    METHOD_ID: int
    NAME: str
    HAS_CONTENT: bool
    FIELDS: tuple[tuple[str, str], ...]
    _encode: Callable[[tuple], bytes]
    _decode: Callable[[Any, int], tuple]

    def encode(self) -> bytes:
        """The method frame payload (class id, method id, fields). Raises ValueError on a
        field the wire cannot carry (a short string over 255 octets, an int out of range)."""
        return _HEAD.pack(self.CLASS_ID, self.METHOD_ID) + self._encode(self)


def _compile(fields: list[tuple[str, str]]) -> tuple[Callable, Callable]:
    """Compile a field layout into (encode(values) -> bytes, decode(buf, off) -> values)."""
    # Steps: ("fixed", Struct, [(field index, bit or -1)]) or (kind, field index).
    steps: list[tuple] = []
    run_fmt: list[str] = []
    run_map: list[tuple[int, int]] = []  # (field index, bit position or -1 whole slot)
    bit_slot = -1  # struct slot of the current bit octet, -1 = none open
    bit_pos = 0

    def close_run() -> None:
        nonlocal run_fmt, run_map, bit_slot
        if run_fmt:
            steps.append(("fixed", struct.Struct(">" + "".join(run_fmt)), run_map, len(run_fmt)))
        run_fmt, run_map, bit_slot = [], [], -1

    for index, (_name, kind) in enumerate(fields):
        if kind == "b":
            if bit_slot < 0 or bit_pos == 8:
                run_fmt.append("B")
                bit_slot, bit_pos = len(run_fmt) - 1, 0
            run_map.append((index, bit_slot * 8 + bit_pos))
            bit_pos += 1
            continue
        if kind in _FIXED:
            run_fmt.append(_FIXED[kind])
            run_map.append((index, -1 - (len(run_fmt) - 1)))
            bit_slot = -1
            continue
        close_run()
        steps.append((kind, index))
    close_run()
    count = len(fields)

    def encode(values: tuple) -> bytes:
        out: list[bytes] = []
        try:
            for step in steps:
                kind = step[0]
                if kind == "fixed":
                    _, layout, mapping, slots = step
                    octets = [0] * slots
                    for index, where in mapping:
                        if where < 0:
                            octets[-1 - where] = values[index]
                        elif values[index]:
                            octets[where >> 3] |= 1 << (where & 7)
                    out.append(layout.pack(*octets))
                elif kind == "S":
                    out.append(encode_shortstr(values[step[1]]))
                elif kind == "X":
                    out.append(encode_longstr(values[step[1]]))
                else:
                    out.append(encode_table(values[step[1]]))
        except struct.error as exc:
            raise ValueError(str(exc)) from None
        return b"".join(out)

    def decode(buf: Any, off: int) -> tuple[list[Any], int]:
        values: list[Any] = [None] * count
        for step in steps:
            kind = step[0]
            if kind == "fixed":
                _, layout, mapping, _slots = step
                if off + layout.size > len(buf):
                    raise AmqpError(SYNTAX_ERROR, "truncated method fields")
                octets = layout.unpack_from(buf, off)
                off += layout.size
                for index, where in mapping:
                    if where < 0:
                        values[index] = octets[-1 - where]
                    else:
                        values[index] = bool(octets[where >> 3] >> (where & 7) & 1)
            elif kind == "S":
                values[step[1]], off = decode_shortstr(buf, off)
            elif kind == "X":
                values[step[1]], off = decode_longstr(buf, off)
            else:
                values[step[1]], off = decode_table(buf, off)
        return values, off

    return encode, decode


def _default(kind: str, text: str | None) -> Any:
    if kind in ("o", "s", "l", "L", "t"):
        return int(text) if text else 0
    if kind == "b":
        return text == "1"
    if kind == "X":
        return (text or "").encode()
    if kind == "T":
        return _EMPTY_TABLE
    return text or ""


def _build() -> dict[tuple[int, int], type]:
    methods: dict[tuple[int, int], type] = {}
    class_id, class_name = 0, ""
    for line in _SPEC.strip().splitlines():
        if not line.startswith(" "):
            cid, class_name = line.split()
            class_id = int(cid)
            continue
        head, _, rest = line.partition(":")
        words = head.split()
        method_id, method_name = int(words[0]), words[1]
        fields, defaults = [], []
        for item in rest.split():
            name, _, kind_default = item.partition(":")
            kind, _, default = kind_default.partition("=")
            fields.append((name, kind))
            defaults.append(_default(kind, default or None))
        title = "".join(p.capitalize() for p in (class_name + "_" + method_name).split("_"))
        base = namedtuple(title, [n for n, _ in fields], defaults=defaults)  # noqa: PYI024
        enc, dec = _compile(fields)
        cls = type(title, (base, Method), {
            "__slots__": (),
            "__doc__": f"{class_name}.{method_name.replace('_', '-')} ({class_id}, {method_id})",
            "CLASS_ID": class_id,
            "METHOD_ID": method_id,
            "NAME": f"{class_name}.{method_name.replace('_', '-')}",
            "HAS_CONTENT": "content" in words,
            "FIELDS": tuple(fields),
            "_encode": staticmethod(enc),
            "_decode": staticmethod(dec),
        })
        methods[(class_id, method_id)] = cls
        globals()[title] = cls
        __all__.append(title)
    return methods


#: (class id, method id) -> method class.
METHODS: dict[tuple[int, int], type] = _build()


def encode_method(method: Method) -> bytes:
    return method.encode()


def decode_method(payload: Any) -> Method:
    """Decode a method frame payload. Raises AmqpError: 540 for an unknown class or method,
    502 for fields that do not parse or octets left over."""
    if len(payload) < 4:
        raise AmqpError(SYNTAX_ERROR, "method frame shorter than its ids")
    class_id, method_id = _HEAD.unpack_from(payload, 0)
    cls = METHODS.get((class_id, method_id))
    if cls is None:
        raise AmqpError(NOT_IMPLEMENTED, f"unknown method {class_id}/{method_id}",
                        class_id=class_id, method_id=method_id)
    try:
        values, end = cls._decode(payload, 4)
    except AmqpError as exc:
        exc.class_id, exc.method_id = class_id, method_id
        raise
    if end != len(payload):
        raise AmqpError(SYNTAX_ERROR, f"{cls.NAME}: {len(payload) - end} octets after the fields",
                        class_id=class_id, method_id=method_id)
    return cls._make(values)
