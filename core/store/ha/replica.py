"""CommitLog chunks for replication (docs/ha.md).

The master sends its CommitLog byte for byte, so a slave's files are the same bytes at
the same offsets (PHYSICALOFFSET in every record stays true, msgIds stay valid). A chunk
never crosses a CommitLog file and ends at a record boundary (or at the file end after a
BLANK filler), so the slave dispatches whole records only.

The slave validates every record it receives (size, magic, stored offset, layout, body
CRC: `CommitLog.valid_record`, the check recovery uses) and dispatches it with recovery's
`_dispatch` (ConsumeQueue, LMQ index, key index), then wakes held pulls.
"""

from __future__ import annotations

import struct

from core.common.codec import BLANK_MAGIC, FIXED_SIZE, MAGIC_V1, parse_layout
from core.common.names import LMQ_PREFIX
from core.common.properties import MessageConst, decode_properties_bytes
from core.store.commitlog import END_FILE_MIN_BLANK
from core.store.consume_queue import UNIT, UNIT_SIZE
from core.store.put_path import _KV_COMMIT_BYTES
from core.store.recovery import _dispatch, _valid_name
from core.store.speedups import scan_chunk

_LMQ_PREFIX = LMQ_PREFIX.encode()
_SIZE_MAGIC = struct.Struct(">iI")
_QID_QOFF = struct.Struct(">i4xq")
_I32 = struct.Struct(">i")
_SYS_FLAG = 36
_BORN_HOST = 48
_V6_BORN, _V6_STORE = 1 << 4, 1 << 5  # MessageSysFlag.BORNHOST_V6 / STOREHOST_V6


def _topic_bytes(rec) -> bytes:
    """TOPIC of a record `valid_record` accepted (no checks: the layout is known good)."""
    sys_flag = _I32.unpack_from(rec, _SYS_FLAG)[0]
    p = _BORN_HOST + (20 if sys_flag & _V6_BORN else 8) + 8 + (20 if sys_flag & _V6_STORE else 8)
    p += 12
    body_length = _I32.unpack_from(rec, p)[0]
    p += 4 + body_length
    if _SIZE_MAGIC.unpack_from(rec, 0)[1] == MAGIC_V1:
        n = rec[p]
        p += 1
    else:
        n = struct.unpack_from(">h", rec, p)[0]
        p += 2
    return bytes(rec[p : p + n])


class ReplicaError(Exception):
    """The chunk cannot be applied (offset mismatch, corrupt record, disk full)."""


def read_chunk(store, offset: int, max_bytes: int) -> memoryview | None:
    """Master side: a zero-copy view of whole records from `offset` on (at least one
    record, else up to `max_bytes`), within one file; None when there is nothing new.
    Raises ReplicaError when `offset` is outside the CommitLog."""
    cl = store.commitlog
    wrote = store.max_physical_offset
    if offset == wrote:
        return None
    if offset > wrote or offset < cl.min_offset:
        raise ReplicaError(f"offset {offset} outside [{cl.min_offset}, {wrote}]")
    mf = cl.file_for(offset)
    if mf is None:
        raise ReplicaError(f"no CommitLog file holds offset {offset}")
    fs = cl.file_size
    pos = offset - mf.start
    limit = min(mf.end, wrote) - mf.start
    p = pos
    mm = mf.mm
    while p < limit:
        if p + END_FILE_MIN_BLANK > fs:
            p = fs  # the few bytes after the last record of a full file
            break
        total, magic = _SIZE_MAGIC.unpack_from(mm, p)
        if magic == BLANK_MAGIC:
            p = fs
            break
        if total <= 0 or p + total > limit:
            raise ReplicaError(f"offset {offset} is not at a record start")
        if p > pos and p + total - pos > max_bytes:
            break
        p += total
    if p == pos:
        return None
    return mf.view[pos:p]


def append_chunk(store, phys: int, data, commit: bool = True) -> int:
    """Slave side: write `data` (a chunk cut by `read_chunk`) at CommitLog offset `phys`
    and dispatch its records; returns the new max offset. Raises ReplicaError when the
    chunk does not continue the CommitLog or holds an invalid record (what was valid
    before it stays written and dispatched). With `commit` False the caller runs
    `commit_if_due` itself (the slave does, after it has sent its report)."""
    cl = store.commitlog
    fs = cl.file_size
    n = len(data)
    if phys != store._wrote:
        empty = store._wrote == cl.min_offset and store._wpos == 0 and len(cl.files) == 1
        if not (empty and phys > store._wrote and phys % fs == 0):
            raise ReplicaError(f"chunk at {phys}, slave CommitLog ends at {store._wrote}")
        # An empty slave of a master whose first files are gone: start where it starts.
        cl.files.pop().destroy()
        store._cur = cl.new_file(phys)
        store._wpos = 0
        store._wrote = store._flushed = store._recovered_end = phys
    mf = store._cur
    if phys >= mf.end:
        mf = cl.file_for(phys) or cl.new_file(phys)
        store._cur = mf
        store._wpos = 0
    pos = phys - mf.start
    if n <= 0 or pos + n > fs:
        raise ReplicaError(f"chunk of {n} bytes at {phys} crosses a file end")
    if pos + n > mf.reserved:
        err = store._reserve(mf, pos + n)
        if err is not None:
            raise ReplicaError(err)
    if type(data) is not bytes:
        data = bytes(data)
    # One C call (core/_speedups.c, s4-ha block; Python: speedups_py.scan_chunk) checks
    # every record as recovery does and plans the dispatch: ConsumeQueue units packed per
    # queue, key-index entries built; one write puts the valid bytes in the file.
    end, bad, last_ms, ops = scan_chunk(
        data, phys, pos, fs, store._max_qid, store._multi_on,
        _LMQ_PREFIX if store._lmq_on else None,
        store._keys.bucket_ms if store._index_on and store._keys is not None else 0,
    )
    for i, op in enumerate(ops):
        if type(op) is int and not _multi_offsets_ok(data, op - phys, op):
            # Refused like a bad CRC. A general record closes every open run, so the runs
            # before it hold no record after it.
            end, bad, ops = op - phys, True, ops[:i]
            break
    valid = min(end, n)
    if valid:
        mf.mm[pos : pos + valid] = data if valid == n else data[:valid]
    _dispatch_ops(store, mf, ops)
    if last_ms >= 0:
        store._last_store_ms = last_ms
    store._wpos = pos + end
    store._wrote = mf.start + pos + end
    if commit:
        commit_if_due(store)
    if bad:
        raise ReplicaError(f"invalid record at {store._wrote} in a replicated chunk")
    return store._wrote


def commit_if_due(store) -> None:
    """RocksDB batches as on the master's put path (not one write per chunk)."""
    kv = store._kv
    if kv.ops >= store._kv_max_ops or store._wrote - kv.marker > _KV_COMMIT_BYTES:
        store._commit_kv()


#: The slave's RocksDB batch (key index, LMQ index) spans chunks: it is written once it
#: holds `kv_batch_max_ops` operations (the master's bound on one write's pause), or
#: covers this many CommitLog bytes (what a recovery re-dispatches at most; the master
#: writes every MiB), or is this many seconds old, or the stream goes idle (a
#: heartbeat). Reads commit it first, so queries see everything applied.
SLAVE_KV_COMMIT_BYTES = 8 << 20
SLAVE_KV_COMMIT_S = 1.0


def slave_commit_if_due(store, now: float, since: float) -> bool:
    """The slave's rule above (`since`: time of its last commit); True if it wrote."""
    kv = store._kv
    if not kv.ops:
        return False
    if (kv.ops >= store._kv_max_ops
            or store._wrote - kv.marker > SLAVE_KV_COMMIT_BYTES
            or now - since >= SLAVE_KV_COMMIT_S):
        store._commit_kv()
        return True
    return False


def _multi_offsets_ok(data: bytes, pos: int, phys: int) -> bool:
    """INNER_MULTI_QUEUE_OFFSET of a general record within [0, phys // FIXED_SIZE] (no
    queue holds more records than the CommitLog before it): offsets are not under the body
    CRC, and a hostile one would make the slave map absurd ConsumeQueue files."""
    rec = data[pos : pos + _I32.unpack_from(data, pos)[0]]
    lay = parse_layout(rec)
    if not lay.properties_length:
        return True
    props = decode_properties_bytes(
        rec[lay.properties_start : lay.properties_start + lay.properties_length])
    offsets = props.get(MessageConst.INNER_MULTI_QUEUE_OFFSET)
    if not offsets or not props.get(MessageConst.INNER_MULTI_DISPATCH):
        return True
    bound = phys // FIXED_SIZE
    for text in offsets.split(","):
        try:
            o = int(text)
        except ValueError:
            continue  # recovery's dispatch skips it
        if not 0 <= o <= bound:
            return False
    return True


def _dispatch_ops(store, mf, ops: list) -> None:
    """Dispatch what scan_chunk planned, in CommitLog order: runs of one queue as packed
    ConsumeQueue units (one copy when they continue the queue, else idempotent put_at as
    recovery) plus their key-index entries; other records through recovery's dispatch.
    Held pulls and LMQ waiters are woken once per queue and chunk."""
    listener = store.dispatch_listener
    resolver = store.tags_code_resolver
    pending = store._kv.pending
    woken: dict[tuple[bytes, int], int] = {}  # (topic, queue) -> new max offset
    special: dict[bytes, bool] = {}
    for op in ops:
        if type(op) is int:
            rec = _record(mf, op)
            _dispatch(store, op, rec, True)
            if listener is not None:
                qid, qoff = _QID_QOFF.unpack_from(rec, 12)
                woken[(_topic_bytes(rec), qid)] = qoff + 1
            continue
        topic_b, qid, first, units, entries, lmq_targets = op
        general = special.get(topic_b)
        if general is None:
            topic = topic_b.decode()
            if not _valid_name(store, topic):
                general = True  # recovery's dispatch skips it, as at a restart
            else:
                # A topic whose tag slot the broker computes (scheduled messages): the
                # resolver answers None for every other topic, whatever the properties.
                general = resolver is not None and resolver(topic, {}, 0) is not None
            special[topic_b] = general
        count = len(units) // UNIT_SIZE
        if general:
            for phys, _size, _tc in UNIT.iter_unpack(units):
                _dispatch(store, phys, _record(mf, phys), True)
        else:
            cq = store._cq(topic_b.decode(), qid)
            if first == cq.max_offset:
                cq.append_packed(units)
            else:
                for i, (phys, size, tc) in enumerate(UNIT.iter_unpack(units)):
                    cq.put_at(first + i, phys, size, tc)
            if entries:
                pending.extend(entries)
            if lmq_targets:  # multi-dispatch to LMQs (names checked as recovery does)
                lmq = store._lmq
                for name, off, unit in lmq_targets:
                    if lmq.check_name(name) is None:
                        lmq.add(name, off, unit)
                        if listener is not None:
                            k = (name.encode(), 0)
                            woken[k] = max(woken.get(k, 0), off + 1)
        if listener is not None and count:
            woken[(topic_b, qid)] = first + count
    if listener is not None:
        for (topic, qid), top in woken.items():
            listener(topic.decode("utf-8", "replace"), qid, top)


def _record(mf, phys: int) -> memoryview:
    pos = phys - mf.start
    return mf.view[pos : pos + _I32.unpack_from(mf.mm, pos)[0]]
