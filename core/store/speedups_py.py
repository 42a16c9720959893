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
_INT32 = struct.Struct(">i")
_PHYS_SIZE = struct.Struct(">qi")  # the first fields of an LMQ unit
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


# ---------------------------------------------------------------- s4-ha: slave apply path
# scan_chunk: validate a replicated CommitLog chunk and plan its dispatch (core/store/ha,
# docs/ha.md "How the slave applies data"). The C version is core/_speedups.c's s4-ha block.

_SIZE_MAGIC = struct.Struct(">iI")
_PHYS_AT = 28  # PHYSICALOFFSET
_QID_QOFF = struct.Struct(">i4xq")
_UNIT = struct.Struct(">qiq")  # ConsumeQueue unit: phys, size, tag code
_SYS_FLAG = 36
_BORN_HOST = 48
_V6_BORN, _V6_STORE = 1 << 4, 1 << 5
_MAGIC_V2 = 0xDAA320AB
_BLANK = 0xCBD43194
_MIN_BLANK = 8
_MAX_TK = 1024  # key_index._MAX_KEY_BYTES
_I32_MAX = (1 << 31) - 1
_LMQ_UNIT = struct.Struct(">qiqq")  # lmq_index.LMQ_UNIT: phys, size, tag code, store ms
_MAX_TARGETS = 64  # more INNER_MULTI_DISPATCH names: the general dispatch


def recent_slices(chain: list, offset: int, max_count: int, max_bytes: int, files: list,
                  file_size: int, first_no: int, clmin: int, wrote: int):
    """(slices, bytes) of an LMQ's records from `offset` whose units `chain` holds (lists of
    LmqIndex, oldest first: [offset, unit, ...]): consecutive offsets, at most `max_count`,
    up to the first unit whose record is gone or that would pass `max_bytes` (the first
    one always taken); slices of the MappedFiles' views (docs/store-api.md)."""
    if type(chain) is not list or type(files) is not list:
        raise TypeError("recent_slices(chain: list, ..., files: list, ...)")
    if file_size <= 0 or clmin < 0:
        raise ValueError("recent_slices: file_size must be > 0, clmin >= 0")
    out: list = []
    total = 0
    want = offset
    for units in chain:
        if len(out) >= max_count:
            break
        if len(units) < 2:
            continue
        i = (want - units[0]) * 2
        if i < 0 or i >= len(units) - 1:
            continue
        while i + 1 < len(units) and len(out) < max_count and units[i] == want:
            phys, size = _PHYS_SIZE.unpack_from(units[i + 1])
            if phys < clmin or size <= 0 or phys + size > wrote:
                return out, total  # gone (retention) or not written: `get` says what to do
            if out and total + size > max_bytes:
                return out, total
            fi = phys // file_size - first_no
            pos = phys % file_size
            if fi < 0 or fi >= len(files) or pos + size > file_size:
                return out, total
            out.append(files[fi].view[pos : pos + size])
            total += size
            want += 1
            i += 2
    return out, total


def batch_props_have(body: bytes, needle: bytes) -> int:
    """1 when the properties of a sub-message of batch `body` (docs/protocol.md §7.7)
    contain `needle`, 0 when none does, -1 when the body is malformed. The reference of
    the C function; without it the broker searches the whole body (a superset)."""
    if type(body) is not bytes or type(needle) is not bytes:
        raise TypeError("batch_props_have(body: bytes, needle: bytes)")
    n = len(body)
    pos = found = 0
    while pos < n:
        if n - pos < 20:
            return -1
        size = _INT32.unpack_from(body, pos)[0]
        blen = _INT32.unpack_from(body, pos + 16)[0]
        if blen < 0 or size < 22 or size - 22 < blen or size > n - pos:
            return -1
        p0 = pos + 20 + blen
        plen = INT16.unpack_from(body, p0)[0]
        p0 += 2
        if plen < 0 or p0 + plen != pos + size:
            return -1
        if not found and needle in body[p0 : p0 + plen]:
            found = 1
        pos += size
    return found


def _lmq_targets(names: bytes, offsets: bytes, topic: bytes, prefix: bytes | None, bound: int):
    """[(name, offset)] when every multi-dispatch target is an LMQ (distinct, not the
    topic, offset plain decimal within `bound`, as many offsets as names); else None."""
    if prefix is None:
        return None
    ns, os_ = names.split(b","), offsets.split(b",")
    if len(ns) != len(os_) or len(ns) > _MAX_TARGETS:
        return None
    out = []
    for i, (n, o) in enumerate(zip(ns, os_, strict=True)):
        if (not n.startswith(prefix) or n == topic or n in ns[:i] or not o.isdigit()
                or len(o) > 18 or int(o) > bound):
            return None
        out.append((n.decode(), int(o)))
    return out


def _java_hash(tags: bytes) -> int:
    h = 0
    for c in tags:
        h = (31 * h + c) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def _layout(data: bytes, p: int, total: int, magic: int):
    """(store ms, topic, properties) of the record at p, or None when malformed (the same
    checks as core.common.codec.parse_layout)."""
    end = p + total
    sys_flag = struct.unpack_from(">i", data, p + _SYS_FLAG)[0]
    born = 20 if sys_flag & _V6_BORN else 8
    stored = 20 if sys_flag & _V6_STORE else 8
    if total < _FIXED + born - 8 + stored - 8:
        return None
    ts = p + _BORN_HOST + born
    q = ts + 8 + stored + 12
    blen = struct.unpack_from(">i", data, q)[0]
    body = q + 4
    q = body + blen
    if blen < 0 or q > end:
        return None
    if magic == MAGIC_V1:
        if q + 1 > end:
            return None
        tl = data[q]
        q += 1
    else:
        if q + 2 > end:
            return None
        tl = struct.unpack_from(">h", data, q)[0]
        q += 2
    if tl < 0:
        return None
    topic = data[q : q + tl]
    q += tl
    if q + 2 > end:
        return None
    pl = struct.unpack_from(">h", data, q)[0]
    if pl < 0 or q + 2 + pl != end:
        return None
    if zlib.crc32(data[body : body + blen]) & 0x7FFFFFFF != struct.unpack_from(">I", data, p + 8)[0]:
        return None
    return struct.unpack_from(">q", data, ts)[0], topic, data[q + 2 : end]


def scan_chunk(data: bytes, phys: int, fpos: int, file_size: int, max_qid: int,
               multi_on: bool, lmq_prefix: bytes | None, bucket_ms: int):
    """Validate the records of `data` (a replicated chunk: CommitLog bytes at offset `phys`,
    position `fpos` of a file of `file_size` bytes) and plan their dispatch.

    Returns (end, bad, last store ms, ops). `end` is where the valid data ends, relative to
    data[0] (past the chunk for a BLANK filler: the file's end); `bad` is True when a record
    failed a check (size, magic, stored offset, layout, body CRC, queue id in
    [0, max_qid), 0 <= queue offset <= offset // 91, store time >= 0 and, when indexing,
    its bucket an int32). `ops`, in CommitLog order: an int is the offset of a record for
    the general dispatch (multi-dispatch to a target that is not an LMQ when `multi_on`, a
    topic starting with `lmq_prefix`, non-ASCII topic or properties); a list [topic, queue id, first queue
    offset, units, entries, lmq] is a run of records of one queue with consecutive queue
    offsets: their ConsumeQueue units packed (phys int64, size int32, Java hash of TAGS
    int64), when `bucket_ms` > 0 their key-index entries (KEYS, then UNIQ_KEY; the
    (key, value) pairs of key_index.py), and the (LMQ name, offset, LMQ unit) targets of
    their multi-dispatch when every target is an LMQ (see _lmq_targets; otherwise a
    multi-dispatch record is general). A general record closes every open run."""
    if type(data) is not bytes:
        raise TypeError("data must be bytes")
    for v in (phys, fpos, file_size, max_qid, bucket_ms):
        if type(v) is not int:
            raise TypeError("offsets, sizes and bucket_ms must be ints")
    if type(multi_on) is not bool:
        raise TypeError("multi_on must be a bool")
    if lmq_prefix is not None and type(lmq_prefix) is not bytes:
        raise TypeError("lmq_prefix must be bytes or None")
    n = len(data)
    if (phys < 0 or fpos < 0 or file_size <= 0 or max_qid < 0 or bucket_ms < 0
            or fpos > file_size or n > file_size - fpos or phys > (1 << 63) - 1 - file_size):
        raise ValueError("scan_chunk: bad offsets")
    ops: list = []
    runs: dict = {}
    last_ms = -1
    p = 0
    bad = False
    while p < n:
        at = fpos + p
        if at + _MIN_BLANK > file_size:
            p = n
            break
        if p + 8 > n:
            bad = True
            break
        total, magic = _SIZE_MAGIC.unpack_from(data, p)
        if magic == _BLANK and total == file_size - at:
            p = file_size - fpos
            break
        if (magic not in (MAGIC_V1, _MAGIC_V2) or total < _FIXED or p + total > n
                or at + total + _MIN_BLANK > file_size
                or struct.unpack_from(">q", data, p + _PHYS_AT)[0] != phys + p):
            bad = True
            break
        lay = _layout(data, p, total, magic)
        qid, qoff = _QID_QOFF.unpack_from(data, p + 12)
        if (lay is None or not 0 <= qid < max_qid or qoff < 0 or qoff > (phys + p) // _FIXED
                or lay[0] < 0 or (bucket_ms > 0 and lay[0] // bucket_ms > _I32_MAX)):
            bad = True
            break
        store_ms, topic, props = lay
        last_ms = store_ms
        pairs = {}
        for item in props.split(b"\x02"):
            name, sep, value = item.partition(b"\x01")
            if sep and name and value:
                pairs[name] = value
        general = (not topic.isascii() or not props.isascii()
                   or (lmq_prefix is not None and topic.startswith(lmq_prefix)))
        targets = None
        if not general and multi_on:
            md, mo = pairs.get(b"INNER_MULTI_DISPATCH"), pairs.get(b"INNER_MULTI_QUEUE_OFFSET")
            if md and mo:
                targets = _lmq_targets(md, mo, topic, lmq_prefix, (phys + p) // _FIXED)
                general = targets is None
        if general:
            runs.clear()
            ops.append(phys + p)
            p += total
            continue
        key = (topic, qid)
        run = runs.get(key)
        if run is None or run[2] + len(run[3]) // _UNIT.size != qoff:
            run = runs[key] = [topic, qid, qoff, bytearray(), [], []]
            ops.append(run)
        tags = pairs.get(b"TAGS")
        tc = _java_hash(tags) if tags else 0
        run[3] += _UNIT.pack(phys + p, total, tc)
        if targets:
            unit = _LMQ_UNIT.pack(phys + p, total, tc, store_ms)
            run[5].extend((name, off, unit) for name, off in targets)
        if bucket_ms > 0:
            th = topic + b"#"
            head = struct.pack(">ci", b"k", store_ms // bucket_ms)
            tail = struct.pack(">qq", store_ms, phys + p)
            size = struct.pack(">i", total)
            keys = pairs.get(b"KEYS")
            found = [k for k in keys.split(b" ") if k] if keys else []
            uniq = pairs.get(b"UNIQ_KEY")
            for i, k in enumerate(found + ([uniq] if uniq else [])):
                tk = th + k
                if len(tk) <= _MAX_TK:
                    h = head if i < len(found) else b"q" + head[1:]
                    run[4].append((h + struct.pack(">H", len(tk)) + tk + tail, size))
        p += total
    return p, bad, last_ms, ops
