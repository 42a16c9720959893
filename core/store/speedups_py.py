"""The Python reference of core._speedups (see core/store/speedups.py, which picks one):
what the C functions must do, byte for byte and exception type for exception type, and the
store's fallback where the extension was not built.

The C functions take exact types only (int, not bool; bytes, not a subclass; list, not
tuple; dict, str) and refuse anything else with TypeError, ValueError or OverflowError;
wherever they accept an input they return what these return. These refuse the same inputs
where checking costs little (encode_props, write_record); elsewhere they may accept more
than the C code (tests/core/store/test_speedups_fuzz.py checks both ways)."""

from __future__ import annotations

import mmap
import struct
import zlib

from core.common.codec import HEADER, INT16, MAGIC_V1
from core.common.properties import MessageConst

_WAIT = MessageConst.WAIT_STORE_MSG_OK
_MULTI_OFFSETS = MessageConst.INNER_MULTI_QUEUE_OFFSET
_OFFSETS_PAIR = "\x02" + _MULTI_OFFSETS + "\x01"
_PAIR = "\x01".join
_INT64 = struct.Struct(">q")
_FIXED = HEADER.size + 1 + 2
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_TARGETS = (bytearray, mmap.mmap)


def crc32(data) -> int:
    return zlib.crc32(data)


def encode_props(props: dict, offsets: list[int] | None) -> bytes:
    if type(props) is not dict:
        raise TypeError("properties must be a dict")
    for k, v in props.items():
        if type(k) is not str or type(v) is not str:
            raise TypeError("property names and values must be str")
    if offsets is None:
        return "\x02".join(map(_PAIR, props.items())).encode()
    if type(offsets) is not list:
        raise TypeError("offsets must be a list")
    for o in offsets:
        if type(o) is not int:
            raise TypeError("an offset must be an int")
        if not _I64_MIN <= o <= _I64_MAX:
            raise OverflowError("an offset out of int64 range")
    text = "\x02".join([
        k + "\x01" + v for k, v in props.items() if k != _WAIT and k != _MULTI_OFFSETS
    ])
    return (text + _OFFSETS_PAIR + ",".join(map(str, offsets))).encode()


def write_record(
    mm, pos: int, total: int, queue_id: int, flag: int, queue_offset: int, phys: int,
    sys_flag: int, born_ts: int, born_host: bytes, store_ms: int, store_host: bytes,
    reconsume: int, prepared_offset: int, body, tail: bytes, pb: bytes,
) -> None:
    if type(born_host) is not bytes or len(born_host) != 8 or type(store_host) is not bytes \
            or len(store_host) != 8:
        raise ValueError("hosts must be 8 bytes")
    if type(tail) is not bytes or type(pb) is not bytes:
        raise TypeError("tail and properties must be bytes")
    if len(pb) > 32767:
        raise ValueError("properties longer than 32767 bytes")
    blen = memoryview(body).nbytes
    if total != _FIXED - 1 + blen + len(tail) + len(pb):
        raise ValueError("record size does not match its parts")
    if type(mm) not in _TARGETS:
        raise TypeError("the target must be a bytearray or an mmap")
    if pos < 0 or pos + total > len(mm):
        raise ValueError("record does not fit in the mapping")
    for name, value in (("queue id", queue_id), ("flag", flag), ("sys flag", sys_flag),
                        ("reconsume times", reconsume)):
        if not -(1 << 31) <= value < (1 << 31):
            raise OverflowError(f"{name} out of int32 range")
    mm[pos : pos + total] = b"".join((HEADER.pack(
        total, MAGIC_V1, zlib.crc32(body) & 0x7FFFFFFF, queue_id, flag, queue_offset, phys,
        sys_flag, born_ts, born_host, store_ms, store_host, reconsume, prepared_offset, blen,
    ), body, tail, INT16.pack(len(pb)), pb))


def plan_lmqs(names: list, cache: dict, topic: str, bump: dict | None):
    if topic in cache:
        return None
    try:
        offsets = [cache[name] for name in names]
    except KeyError:
        return None
    if bump is not None:
        for i, name in enumerate(names):
            extra = bump.get(name, 0)
            bump[name] = extra + 1
            offsets[i] += extra
    return offsets, list(zip(names, offsets, strict=True)), offsets.count(0)


def stage_units(staged: dict, cache: dict, targets: list, unit: bytes) -> int:
    created = 0
    get = staged.get
    for name, off in targets:
        units = get(name)
        if units is None:
            staged[name] = [off, unit]
        else:
            units.append(off)
            units.append(unit)
        cache[name] = off + 1
        if off == 0:
            created += 1
    return created


def write_units(snapshot: dict, put, prefixes: dict) -> int:
    pack = _INT64.pack
    n = 0
    for name in sorted(snapshot):
        prefix = prefixes.get(name)
        if prefix is None:
            prefix = prefixes[name] = b"u" + name.encode() + b"\x00"
        pairs = iter(snapshot[name])
        for offset, value in zip(pairs, pairs, strict=False):
            put(prefix + pack(offset), value)
            n += 1
    return n
