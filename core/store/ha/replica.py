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

from core.common.codec import BLANK_MAGIC, MAGIC_V1
from core.store.commitlog import END_FILE_MIN_BLANK
from core.store.put_path import _KV_COMMIT_BYTES
from core.store.recovery import _dispatch

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


def append_chunk(store, phys: int, data) -> int:
    """Slave side: write `data` (a chunk cut by `read_chunk`) at CommitLog offset `phys`
    and dispatch its records; returns the new max offset. Raises ReplicaError when the
    chunk does not continue the CommitLog or holds an invalid record (what was valid
    before it stays written and dispatched)."""
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
    mf.mm[pos : pos + n] = data
    listener = store.dispatch_listener
    kv = store._kv
    end = pos + n
    p = pos
    bad = None
    woken: dict[tuple[bytes, int], int] = {}  # (topic, queue) -> new max offset
    while p < end:
        if p + END_FILE_MIN_BLANK > fs:
            p = end
            break
        total, magic = _SIZE_MAGIC.unpack_from(mf.mm, p)
        if magic == BLANK_MAGIC and total == fs - p:
            p = fs
            break
        at = mf.start + p
        if p + total > end or not cl.valid_record(mf, p, at, total, magic):
            bad = at
            break
        rec = mf.view[p : p + total]
        store._last_store_ms = _dispatch(store, at, rec, True)
        if listener is not None:
            qid, qoff = _QID_QOFF.unpack_from(rec, 12)
            woken[(_topic_bytes(rec), qid)] = qoff + 1
        p += total
        if kv.ops >= store._kv_max_ops:
            kv.commit(mf.start + p)
    # Held pulls and LMQ waiters: once per queue and chunk, not once per record.
    for (topic, qid), top in woken.items():
        listener(topic.decode("utf-8", "replace"), qid, top)
    if bad is not None:
        mf.zero_from(p)  # a later chunk must not find leftovers after the valid end
    store._wpos = p
    store._wrote = mf.start + p
    # RocksDB batches as on the master's put path (not one write per chunk).
    if kv.ops >= store._kv_max_ops or store._wrote - kv.marker > _KV_COMMIT_BYTES:
        store._commit_kv()
    if bad is not None:
        raise ReplicaError(f"invalid record at {bad} in a replicated chunk")
    return store._wrote
