"""Stored-record codec: the RocketMQ v1 CommitLog record (docs/protocol.md §7.1).

A pull answers with slices of the CommitLog, so this byte layout *is* the wire format that
real clients decode. We always write magic v1 with IPv4 hosts (8 bytes each), the only form
the C++ client reads; the decoder also accepts v2 (2-byte topic length) and IPv6 hosts.

```
off  size  field
  0   4    TOTALSIZE            whole record, this field included
  4   4    MAGICCODE            0xDAA320A7 (v1) / 0xDAA320AB (v2)
  8   4    BODYCRC              crc32(stored body) & 0x7FFFFFFF
 12   4    QUEUEID
 16   4    FLAG
 20   8    QUEUEOFFSET
 28   8    PHYSICALOFFSET
 36   4    SYSFLAG
 40   8    BORNTIMESTAMP
 48   8    BORNHOST             IPv4 + int32 port (20 bytes if SYSFLAG & BORNHOST_V6)
 56   8    STORETIMESTAMP
 64   8    STOREHOST            (20 bytes if SYSFLAG & STOREHOST_V6)
 72   4    RECONSUMETIMES
 76   8    PREPARED TRANSACTION OFFSET
 84   4    BODYLENGTH B
 88   B    BODY
      1    TOPICLENGTH T        (2 bytes in v2)
      T    TOPIC
      2    PROPERTIESLENGTH P   signed int16
      P    PROPERTIES
```
"""

from __future__ import annotations

import socket
import struct
import zlib
from dataclasses import dataclass
from functools import lru_cache

from core.common.message import MessageExt
from core.common.properties import decode_properties_bytes
from core.common.sysflag import MessageSysFlag

MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB
BLANK_MAGIC = 0xCBD43194

# Fields 1..15 of a v1/IPv4 record, up to and including BODYLENGTH.
HEADER = struct.Struct(">IIIiiqqiq8sq8siqi")
HEADER_SIZE = HEADER.size  # 88
FIXED_SIZE = HEADER_SIZE + 1 + 2  # 91: + topic length byte + properties length
assert HEADER_SIZE == 88

# Offsets of single fields, for readers that need one value without a full decode.
OFF_TOTAL_SIZE = 0
OFF_MAGIC = 4
OFF_BODY_CRC = 8
OFF_QUEUE_ID = 12
OFF_FLAG = 16
OFF_QUEUE_OFFSET = 20
OFF_PHYSICAL_OFFSET = 28
OFF_SYS_FLAG = 36
OFF_BORN_TIMESTAMP = 40
OFF_BORN_HOST = 48
OFF_STORE_TIMESTAMP = 56  # v1 with an IPv4 born host
OFF_BODY_LENGTH = 84
OFF_BODY = 88

INT32 = struct.Struct(">i")
UINT32 = struct.Struct(">I")
INT64 = struct.Struct(">q")
INT16 = struct.Struct(">h")
_BLANK = struct.Struct(">iI")
_CRC_QID_FLAG = struct.Struct(">Iii")
_TWO_LONGS = struct.Struct(">qq")

# Batch sub-message (docs/protocol.md §7.7): TOTALSIZE, MAGIC(0), BODYCRC(0), FLAG, BODYLENGTH.
BATCH_HEAD = struct.Struct(">iiiii")


class RecordError(ValueError):
    """A byte range is not a well-formed stored record."""


def record_size(body_length: int, topic_length: int, properties_length: int) -> int:
    """Size of a v1/IPv4 record (91 + B + T + P)."""
    return FIXED_SIZE + body_length + topic_length + properties_length


def body_crc(body: bytes | memoryview) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF


@lru_cache(maxsize=4096)
def encode_host(address: str) -> bytes:
    """`"ip:port"` -> 8 bytes (IPv4 + int32 port). A non-IPv4 host is stored as 127.0.0.1:
    v1 records carry IPv4 only, and the C++ client reads nothing else (docs/protocol.md §7.1)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        ip = socket.inet_aton(host)
    except OSError:
        ip = b"\x7f\x00\x00\x01"
    return ip + int(port or 0).to_bytes(4, "big", signed=True)


def decode_host(raw: bytes | memoryview) -> str:
    data = bytes(raw)
    if len(data) == 8:
        return f"{socket.inet_ntoa(data[:4])}:{int.from_bytes(data[4:], 'big', signed=True)}"
    return f"[{socket.inet_ntop(socket.AF_INET6, data[:16])}]:{int.from_bytes(data[16:], 'big')}"


def write_record(
    buf,
    pos: int,
    *,
    topic: bytes,
    body: bytes | memoryview,
    properties: bytes,
    queue_id: int,
    flag: int,
    queue_offset: int,
    physical_offset: int,
    sys_flag: int,
    born_timestamp: int,
    born_host: bytes,
    store_timestamp: int,
    store_host: bytes,
    reconsume_times: int,
    prepared_transaction_offset: int,
    crc: int | None = None,
) -> int:
    """Pack one v1 record into the writable buffer `buf` at `pos`; return its size.

    `topic` and `properties` are UTF-8 bytes; hosts are 8-byte IPv4 encodings. The caller
    checks limits (topic <= 127 bytes, properties <= 32767 bytes) before calling.
    """
    blen = len(body)
    tlen = len(topic)
    plen = len(properties)
    total = FIXED_SIZE + blen + tlen + plen
    HEADER.pack_into(
        buf, pos, total, MAGIC_V1, body_crc(body) if crc is None else crc, queue_id, flag,
        queue_offset, physical_offset, sys_flag & ~(MessageSysFlag.BORNHOST_V6 | MessageSysFlag.STOREHOST_V6),
        born_timestamp, born_host, store_timestamp, store_host, reconsume_times,
        prepared_transaction_offset, blen,
    )
    p = pos + HEADER_SIZE
    buf[p : p + blen] = body
    p += blen
    buf[p] = tlen
    p += 1
    buf[p : p + tlen] = topic
    p += tlen
    INT16.pack_into(buf, p, plen)
    p += 2
    buf[p : p + plen] = properties
    return total


def encode_record(**fields) -> bytes:
    """Encode one v1 record into new bytes (same keywords as `write_record`)."""
    size = record_size(len(fields["body"]), len(fields["topic"]), len(fields["properties"]))
    buf = bytearray(size)
    write_record(buf, 0, **fields)
    return bytes(buf)


def write_blank(buf, pos: int, remaining: int) -> None:
    """Close a CommitLog file: `int32 remaining` + BLANK magic (docs/protocol.md §7.9)."""
    _BLANK.pack_into(buf, pos, remaining, BLANK_MAGIC)


@dataclass(slots=True)
class RecordLayout:
    """Positions inside one record, for readers that need more than the fixed fields."""

    total_size: int
    magic: int
    sys_flag: int
    body_start: int
    body_length: int
    topic_start: int
    topic_length: int
    properties_start: int
    properties_length: int
    store_timestamp_pos: int


def parse_layout(buf, pos: int = 0, limit: int | None = None) -> RecordLayout:
    """Locate the variable fields of the record at `pos`; raise RecordError if malformed."""
    end = len(buf) if limit is None else limit
    if pos + 8 > end:
        raise RecordError("truncated record header")
    total, magic = _BLANK.unpack_from(buf, pos)
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise RecordError(f"bad magic {magic:#x}")
    if total < FIXED_SIZE or pos + total > end:
        raise RecordError(f"bad total size {total}")
    sys_flag = INT32.unpack_from(buf, pos + OFF_SYS_FLAG)[0]
    born_len = 20 if sys_flag & MessageSysFlag.BORNHOST_V6 else 8
    store_len = 20 if sys_flag & MessageSysFlag.STOREHOST_V6 else 8
    if total < FIXED_SIZE + (born_len - 8) + (store_len - 8):
        raise RecordError(f"bad total size {total} for IPv6 hosts")
    store_ts_pos = pos + OFF_BORN_HOST + born_len
    p = store_ts_pos + 8 + store_len + 4 + 8
    body_length = INT32.unpack_from(buf, p)[0]
    body_start = p + 4
    p = body_start + body_length
    if body_length < 0 or p > pos + total:
        raise RecordError("bad body length")
    if magic == MAGIC_V1:
        topic_length = buf[p]
        p += 1
    else:
        topic_length = struct.unpack_from(">h", buf, p)[0]
        p += 2
    topic_start = p
    p += topic_length
    if p + 2 > pos + total:
        raise RecordError("bad topic length")
    properties_length = INT16.unpack_from(buf, p)[0]
    properties_start = p + 2
    if properties_length < 0 or properties_start + properties_length != pos + total:
        raise RecordError("bad properties length")
    return RecordLayout(
        total, magic, sys_flag, body_start, body_length, topic_start, topic_length,
        properties_start, properties_length, store_ts_pos,
    )


def record_properties(buf, pos: int = 0) -> dict[str, str]:
    """The properties of the record at `pos` (used by SQL92 filters and lookups)."""
    lay = parse_layout(buf, pos)
    mv = memoryview(buf)
    return decode_properties_bytes(
        mv[lay.properties_start : lay.properties_start + lay.properties_length]
    )


def record_topic(buf, pos: int = 0) -> str:
    lay = parse_layout(buf, pos)
    return bytes(buf[lay.topic_start : lay.topic_start + lay.topic_length]).decode("utf-8")


#: A compressed message body inflating past this is left compressed (sysflag bit 0 kept)
#: instead of inflated: any producer may set the bit, and 4 MiB of zeros deflate to 4 KB,
#: so without a cap one stored message could make every consumer allocate gigabytes.
#: Producers compress only bodies within their max message size (4 MiB by default), so
#: 16 MiB leaves room for raised limits.
MAX_INFLATED_BODY = 16 * 1024 * 1024
_INFLATE_STEP = 1024 * 1024


def _inflate_body(body: bytes) -> bytes | None:
    """The inflated body, or None when it is not zlib or inflates past the cap (the
    message is then delivered as stored, rather than failing the whole pull)."""
    # 1 MiB steps: a refused bomb costs the cap, not twice it (one growing buffer would).
    inflater = zlib.decompressobj()
    parts = []
    size = 0
    data = body
    try:
        while True:
            part = inflater.decompress(data, _INFLATE_STEP)
            parts.append(part)
            size += len(part)
            if size > MAX_INFLATED_BODY:
                return None
            data = inflater.unconsumed_tail
            if len(part) < _INFLATE_STEP and not data:
                return parts[0] if len(parts) == 1 else b"".join(parts)
    except zlib.error:
        return None


def decode_record(buf, pos: int = 0, *, decompress: bool = False) -> MessageExt:
    """Decode the record at `pos` into a MessageExt. With `decompress`, a zlib body (sysflag
    bit 0) is inflated and the flag cleared, as a consumer would see it; a body that is
    not zlib or inflates past MAX_INFLATED_BODY stays as stored, flag set."""
    lay = parse_layout(buf, pos)
    sys_flag = lay.sys_flag
    crc, queue_id, flag = _CRC_QID_FLAG.unpack_from(buf, pos + OFF_BODY_CRC)
    queue_offset, physical_offset = _TWO_LONGS.unpack_from(buf, pos + OFF_QUEUE_OFFSET)
    born_ts = INT64.unpack_from(buf, pos + OFF_BORN_TIMESTAMP)[0]
    born_host = bytes(buf[pos + OFF_BORN_HOST : lay.store_timestamp_pos])
    p = lay.store_timestamp_pos
    store_ts = INT64.unpack_from(buf, p)[0]
    store_len = 20 if sys_flag & MessageSysFlag.STOREHOST_V6 else 8
    store_host = bytes(buf[p + 8 : p + 8 + store_len])
    p += 8 + store_len
    reconsume, prepared = struct.unpack_from(">iq", buf, p)
    body = bytes(buf[lay.body_start : lay.body_start + lay.body_length])
    if decompress and sys_flag & MessageSysFlag.COMPRESSED:
        inflated = _inflate_body(body)
        if inflated is not None:
            body = inflated
            sys_flag &= ~MessageSysFlag.COMPRESSED
    topic = bytes(buf[lay.topic_start : lay.topic_start + lay.topic_length]).decode("utf-8")
    props = decode_properties_bytes(
        memoryview(buf)[lay.properties_start : lay.properties_start + lay.properties_length]
    )
    return MessageExt(
        topic=topic,
        body=body,
        flag=flag,
        properties=props,
        queue_id=queue_id,
        queue_offset=queue_offset,
        commitlog_offset=physical_offset,
        store_size=lay.total_size,
        sys_flag=sys_flag,
        born_timestamp=born_ts,
        born_host=decode_host(born_host),
        store_timestamp=store_ts,
        store_host=decode_host(store_host),
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        body_crc=crc,
    )


def decode_records(buf, *, decompress: bool = False) -> list[MessageExt]:
    """Decode a concatenation of records (a PULL response body)."""
    out: list[MessageExt] = []
    pos = 0
    end = len(buf)
    while pos < end:
        msg = decode_record(buf, pos, decompress=decompress)
        out.append(msg)
        pos += msg.store_size
    return out


@dataclass(slots=True, frozen=True)
class BatchItem:
    """One sub-message of a batch send body (docs/protocol.md §7.7)."""

    flag: int
    body: bytes
    properties: str


def decode_batch(body: bytes | memoryview) -> list[BatchItem]:
    """Split a batch send body into its sub-messages; raise RecordError when malformed."""
    mv = memoryview(body)
    items: list[BatchItem] = []
    pos = 0
    end = len(mv)
    while pos < end:
        if pos + BATCH_HEAD.size > end:
            raise RecordError("truncated batch sub-message header")
        total, _magic, _crc, flag, blen = BATCH_HEAD.unpack_from(mv, pos)
        p = pos + BATCH_HEAD.size
        if blen < 0 or total < BATCH_HEAD.size + 2 + blen or pos + total > end:
            raise RecordError("bad batch sub-message size")
        sub_body = bytes(mv[p : p + blen])
        p += blen
        plen = INT16.unpack_from(mv, p)[0]
        p += 2
        if plen < 0 or p + plen != pos + total:
            raise RecordError("bad batch sub-message properties length")
        props = bytes(mv[p : p + plen]).decode("utf-8", "replace")
        items.append(BatchItem(flag, sub_body, props))
        pos += total
    return items


def encode_batch(items: list[BatchItem]) -> bytes:
    """Encode sub-messages as a batch send body (what producers send)."""
    parts: list[bytes] = []
    for item in items:
        props = item.properties.encode("utf-8")
        total = BATCH_HEAD.size + len(item.body) + 2 + len(props)
        parts.append(BATCH_HEAD.pack(total, 0, 0, item.flag, len(item.body)))
        parts.append(item.body)
        parts.append(INT16.pack(len(props)))
        parts.append(props)
    return b"".join(parts)
