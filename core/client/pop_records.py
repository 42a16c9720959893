"""The records of a POP answer as light `PopRecord`s (`PopClient.pop(..., light=True)`,
core/client/pop_consumer.py): body, store timestamp, reconsume times and the encoded
properties (decoded when first read), for consumers on a hot path (the AMQP gateway).

A well-formed IPv4 record is read with one unpack (`_plain_record`); anything else goes
through `parse_layout`, which decodes IPv6 records and raises `RecordError` on a malformed
one. First deliveries of a record fanned out to several queues share one decoded body and
properties (`_shared`, docs/pop.md "Hand-off").
"""

from __future__ import annotations

import struct

from core.common.codec import (
    FIXED_SIZE,
    MAGIC_V1,
    MAGIC_V2,
    OFF_BODY,
    OFF_BORN_HOST,
    OFF_SYS_FLAG,
    _inflate_body,
    parse_layout,
)
from core.common.properties import decode_properties_bytes
from core.common.sysflag import MessageSysFlag

__all__ = ["PopRecord", "SHARED_RECORDS_MAX_BYTES", "light_records"]

_POP_CK_MARK = b"POP_CK\x01"
_STORE_TS = struct.Struct(">q")
_RECONSUME = struct.Struct(">i")


class PopRecord:
    """The fields of a popped record a light consumer reads (duck-types the part of
    `MessageExt` it uses); `properties` is decoded on first access."""

    __slots__ = ("body", "raw_properties", "store_timestamp", "reconsume_times", "sys_flag",
                 "has_pop_ck", "_props")

    def __init__(self, body: bytes, raw_properties: bytes, store_timestamp: int,
                 reconsume_times: int, sys_flag: int, has_pop_ck: bool | None = None) -> None:
        self.body = body
        self.raw_properties = raw_properties
        self.store_timestamp = store_timestamp
        self.reconsume_times = reconsume_times
        self.sys_flag = sys_flag
        #: Whether the properties hold a POP_CK (a receipt handle set by the broker).
        self.has_pop_ck = (_POP_CK_MARK in raw_properties if has_pop_ck is None
                           else has_pop_ck)
        self._props: dict[str, str] | None = None

    @property
    def properties(self) -> dict[str, str]:
        props = self._props
        if props is None:
            props = self._props = decode_properties_bytes(self.raw_properties)
        return props


#: First deliveries decoded lately, by their record header (size, body CRC, queue, queue
#: and physical offsets, sys flag, born and store time and hosts, reconsume times): a
#: message fanned out to many queues (an AMQP fan-out, MQTT `$share` groups) is popped
#: once per queue, and those pops share one decoded body and properties (docs/pop.md
#: "Hand-off"). Bounded by the bytes held; starts over when full.
SHARED_RECORDS_MAX_BYTES = 8 << 20
_SHARED_MAX_RECORD = 64 << 10  # larger records are decoded each time
_shared: dict[bytes, tuple[bytes, bytes, int, int, int]] = {}
_shared_bytes = 0
_BORN_V6 = MessageSysFlag.BORNHOST_V6
_STORE_V6 = MessageSysFlag.STOREHOST_V6
_HEADER_V4 = OFF_BORN_HOST + 28  # born host, store time and host, reconsume times
_SYS_FLAG = struct.Struct(">i")


def _header_key(mv, pos: int, end: int) -> bytes | None:
    """The fixed fields of the record at `pos`, through RECONSUMETIMES."""
    if pos + OFF_BORN_HOST > end:
        return None
    sys_flag = _SYS_FLAG.unpack_from(mv, pos + OFF_SYS_FLAG)[0]
    stop = (pos + _HEADER_V4 + (12 if sys_flag & _BORN_V6 else 0)
            + (12 if sys_flag & _STORE_V6 else 0))
    return bytes(mv[pos:stop]) if stop <= end else None


#: The fields of an IPv4 record's fixed part one light decode reads: total size, magic,
#: sys flag, store timestamp, reconsume times, body length (HEADER's layout).
_PLAIN_HEAD = struct.Struct(">II28xi16xq8xi8xi")
_V6_HOSTS = MessageSysFlag.BORNHOST_V6 | MessageSysFlag.STOREHOST_V6
_TOPIC_LEN_V2 = struct.Struct(">h")
_PROPS_LEN = struct.Struct(">h")
assert _PLAIN_HEAD.size == OFF_BODY


def _plain_record(mv, pos: int, end: int):
    """(total, sys flag, store timestamp, reconsume times, body start, body length,
    properties start, properties length) of a well-formed IPv4 record at `pos` (one
    unpack instead of `parse_layout`'s), or None for anything else: the caller then takes
    `parse_layout`, which decodes IPv6 records and raises RecordError on the same checks."""
    if pos + OFF_BODY > end:
        return None
    total, magic, sys_flag, store_ts, reconsume, body_len = _PLAIN_HEAD.unpack_from(mv, pos)
    stop = pos + total
    if sys_flag & _V6_HOSTS or total < FIXED_SIZE or stop > end or body_len < 0:
        return None
    p = pos + OFF_BODY + body_len
    if p + 3 > stop:  # no room for the topic and properties lengths
        return None
    if magic == MAGIC_V1:
        p += 1 + mv[p]
    elif magic == MAGIC_V2:
        topic_len = _TOPIC_LEN_V2.unpack_from(mv, p)[0]
        if topic_len < 0:
            return None
        p += 2 + topic_len
    else:
        return None
    if p + 2 > stop:
        return None
    props_len = _PROPS_LEN.unpack_from(mv, p)[0]
    if props_len < 0 or p + 2 + props_len != stop:
        return None
    return (total, sys_flag, store_ts, reconsume, pos + OFF_BODY, body_len, p + 2, props_len)


def light_records(body) -> list[PopRecord]:
    """The records of a POP answer (bytes, or the list of buffers of an in-process
    answer) as `PopRecord`s (zlib bodies inflated, as `decode_records(decompress=True)`);
    raises `RecordError` on a malformed one."""
    out: list[PopRecord] = []
    for buf in body if type(body) is list else (body,):
        _decode_into(memoryview(buf), out)
    return out


def _decode_into(mv: memoryview, out: list[PopRecord]) -> None:
    global _shared_bytes
    pos = 0
    end = len(mv)
    compressed = MessageSysFlag.COMPRESSED
    v6 = MessageSysFlag.STOREHOST_V6
    shared = _shared
    while pos < end:
        key = None
        if shared:  # (nothing to look up in a single-queue workload)
            key = _header_key(mv, pos, end)
            hit = shared.get(key) if key is not None else None
            if hit is not None and pos + hit[4] <= end:
                body, raw, store_ts, sys_flag, total = hit
                out.append(PopRecord(body, raw, store_ts, 0, sys_flag, False))
                pos += total
                continue
        fields = _plain_record(mv, pos, end)
        if fields is None:  # IPv6 hosts, or malformed (parse_layout raises RecordError)
            lay = parse_layout(mv, pos)
            ts_pos = lay.store_timestamp_pos
            sys_flag = lay.sys_flag
            store_ts = _STORE_TS.unpack_from(mv, ts_pos)[0]
            reconsume = _RECONSUME.unpack_from(mv, ts_pos + (28 if sys_flag & v6 else 16))[0]
            fields = (lay.total_size, sys_flag, store_ts, reconsume, lay.body_start,
                      lay.body_length, lay.properties_start, lay.properties_length)
        total, sys_flag, store_ts, reconsume, body_at, body_len, props, props_len = fields
        body = bytes(mv[body_at:body_at + body_len])
        if sys_flag & compressed:
            inflated = _inflate_body(body)
            if inflated is not None:
                body = inflated
                sys_flag &= ~compressed
        raw = bytes(mv[props:props + props_len])
        has_ck = _POP_CK_MARK in raw
        out.append(PopRecord(body, raw, store_ts, reconsume, sys_flag, has_ck))
        # Only stored records as they are (a redelivery is re-encoded with its own
        # receipt handle: never shared), and only those that may be popped more than once
        # (a list of queues in INNER_MULTI_DISPATCH has a comma).
        if (not reconsume and not has_ck and total <= _SHARED_MAX_RECORD
                and total <= SHARED_RECORDS_MAX_BYTES and b"," in raw
                and (key is not None or (key := _header_key(mv, pos, end)) is not None)):
            if _shared_bytes + total > SHARED_RECORDS_MAX_BYTES:
                shared.clear()
                _shared_bytes = 0
            shared[key] = (body, raw, store_ts, sys_flag, total)
            _shared_bytes += total
        pos += total
