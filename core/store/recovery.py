"""Start-up recovery: cut a torn CommitLog tail and re-dispatch what the indexes lack.

Algorithm (docs/architecture.md §2, "Recovery"):

1. `start` = min(checkpoint, RocksDB marker), clamped to the CommitLog. The checkpoint is
   where CommitLog and ConsumeQueues were last fsynced; the marker is how far LMQ units and
   key-index entries reached RocksDB (it may lag: the RocksDB WAL is off, see kv.py). Both
   advance with every flush/commit, so the work below depends on the flush interval and
   the memtable size, never on the amount of data.
2. Validate records from `start` (size, magic, stored PHYSICALOFFSET, layout, body CRC),
   following BLANK fillers; the first invalid byte is the end `E`. A `kill -9` leaves at
   most one torn record; everything acknowledged was written to the page cache before.
3. Zero the rest of E's file (skipping holes) and delete later files: new records must not
   be preceded by leftovers that a later recovery could mistake for data.
4. Re-dispatch the records in [start, E): ConsumeQueue units (idempotent `put_at`), and for
   records at or past the marker LMQ units and key-index entries (same keys, same values).
   INNER_MULTI_QUEUE_OFFSET in the record says where each LMQ unit goes.
5. ConsumeQueues are not scanned here: each one finds its max offset (binary search) and
   cuts units that point past E when it is first opened (ConsumeQueue.load).
6. If the marker is past E (power loss lost CommitLog pages RocksDB had persisted), delete
   LMQ units beyond E; stale key-index entries are filtered when read.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass

from core.common.codec import parse_layout
from core.common.names import LMQ_PREFIX, validate_topic
from core.common.properties import MessageConst, decode_properties_bytes
from core.common.taghash import tag_hash
from core.store.commitlog import store_timestamp
from core.store.lmq_index import LMQ_UNIT

_QID_QOFF = struct.Struct(">i4xq")  # QUEUEID, (FLAG), QUEUEOFFSET at offset 12


@dataclass
class RecoveryReport:
    """What the last start did (exposed as MessageStore.recovery_report)."""

    checkpoint: int | None
    marker: int
    scan_start: int
    end: int
    records_scanned: int
    bytes_scanned: int
    bytes_zeroed: int
    files_removed: int
    lmq_units_dropped: int
    seconds: float


# -- progress (`lmq serve` / `lmq broker` draw a live line from it on a terminal) ----------

# How often, in CommitLog bytes, the progress hook is called within a phase (also at the
# start of each phase and once at the end): a comparison per record, a call per 16 MiB.
PROGRESS_EVERY_BYTES = 16 << 20


@dataclass
class RecoveryProgress:
    """Passed to the progress hook (the same object, updated): `phase` is "checking"
    (validating the CommitLog from the checkpoint), "re-dispatching" (rebuilding
    ConsumeQueue / LMQ entries) or "done"."""

    phase: str
    bytes_done: int = 0
    bytes_total: int = 0
    records: int = 0
    files_done: int = 0  # the number of the file being read (1-based)
    files_total: int = 0
    consume_queues: int = 0  # ConsumeQueues opened so far (rebuilt ones included)


_progress_hook = None


def set_progress_hook(hook) -> None:
    """Call `hook(RecoveryProgress)` during every later recovery of this process (None:
    no hook, and no cost beyond one comparison per record)."""
    global _progress_hook
    _progress_hook = hook


def _report(hook, p: RecoveryProgress, store, phase: str, start: int, pos: int, total: int,
            records: int) -> None:
    fs = store.commitlog.file_size
    p.phase, p.bytes_done, p.bytes_total, p.records = phase, pos - start, total, records
    p.files_total = max(1, -(-total // fs))
    p.files_done = min(p.files_total, (pos - start) // fs + 1)  # the file being read
    p.consume_queues = len(store._cqs)
    hook(p)


def recover(store) -> RecoveryReport:
    t0 = time.perf_counter()
    cl = store.commitlog
    fs = cl.file_size
    ck = store._checkpoint.physical_offset
    kv = store._kv
    marker = kv.marker
    if not cl.files:
        # Nothing on disk: start after anything the indexes may still reference.
        start = max(ck or 0, marker, 0)
        start = -(-start // fs) * fs
        cl.new_file(start)
    clmin = cl.min_offset
    last_end = cl.files[-1].end

    def clamp(x: int | None) -> int:
        if x is None or x < clmin:
            return clmin
        if x > last_end:  # newer files are gone: re-check the last one
            return cl.files[-1].start
        return x

    lmq_from = clamp(marker)
    start = min(clamp(ck), lmq_from)

    # 2. validate
    hook = _progress_hook
    prog = RecoveryProgress("checking")
    n = 0
    if hook is None:
        for _phys, _rec in cl.scan(start):
            n += 1
    else:
        _report(hook, prog, store, "checking", start, start, last_end - start, 0)
        mark = start + PROGRESS_EVERY_BYTES
        for phys, _rec in cl.scan(start):
            n += 1
            if phys >= mark:
                _report(hook, prog, store, "checking", start, phys, last_end - start, n)
                mark = phys + PROGRESS_EVERY_BYTES
    end = cl.scan_end

    # 3. cut the tail
    zeroed = 0
    removed = 0
    mf = cl.file_for(end)
    if mf is not None:
        zeroed = mf.zero_from(end - mf.start)
    while cl.files and cl.files[-1].start > end:
        cl.files.pop().destroy()
        removed += 1
    if cl.files and cl.files[-1].end == end:
        # The tail stopped exactly at a file end (after a BLANK): start the next file.
        cl.new_file(end)
    cur = cl.file_for(end)
    store._cur = cur
    store._wpos = end - cur.start
    store._wrote = end
    store._recovered_end = end
    store._flushed = min(ck, end) if ck is not None else clmin

    # 4. re-dispatch
    mark = end if hook is None else start
    done = 0
    for phys, rec in _records(cl, start, end):
        if phys >= mark:
            _report(hook, prog, store, "re-dispatching", start, phys, end - start, done)
            mark = phys + PROGRESS_EVERY_BYTES
        store._last_store_ms = _dispatch(store, phys, rec, phys >= lmq_from)
        done += 1
        if kv.ops >= store._kv_max_ops:
            kv.commit(phys + len(rec))

    # 6. RocksDB ahead of the CommitLog
    dropped = 0
    if marker > end:
        dropped = store._lmq.drop_units_at_or_beyond(end)
    kv.commit(end)
    if hook is not None:
        _report(hook, prog, store, "done", start, end, end - start, n)
    return RecoveryReport(
        ck, marker, start, end, n, end - start, zeroed, removed, dropped,
        time.perf_counter() - t0,
    )


def _records(cl, start: int, end: int):
    """Records in [start, end) already validated by CommitLog.scan."""
    phys = start
    fs = cl.file_size
    while phys < end:
        mf = cl.file_for(phys)
        pos = phys - mf.start
        total = struct.unpack_from(">i", mf.mm, pos)[0]
        if pos + 8 > fs or struct.unpack_from(">I", mf.mm, pos + 4)[0] == 0xCBD43194:
            phys = mf.end
            continue
        yield phys, mf.view[pos : pos + total]
        phys += total


def _valid_name(store, name: str) -> bool:
    """Names come from record fields no CRC protects: check them before they become paths."""
    if name in store._tails:
        return True
    if store._lmq_on and name.startswith(LMQ_PREFIX):
        return store._lmq.check_name(name) is None
    return validate_topic(name) is None


def _dispatch(store, phys: int, rec: memoryview, with_kv: bool) -> int:
    """Re-dispatch one record (idempotent); returns its store timestamp."""
    lay = parse_layout(rec)
    total = lay.total_size
    qid, qoff = _QID_QOFF.unpack_from(rec, 12)
    topic = bytes(rec[lay.topic_start : lay.topic_start + lay.topic_length]).decode("utf-8", "replace")
    store_ms = store_timestamp(rec)
    if not _valid_name(store, topic):
        return store_ms
    props = (
        decode_properties_bytes(rec[lay.properties_start : lay.properties_start + lay.properties_length])
        if lay.properties_length else {}
    )
    tc = None
    if store.tags_code_resolver is not None:
        tc = store.tags_code_resolver(topic, props, store_ms)
    if tc is None:
        tc = tag_hash(props.get(MessageConst.TAGS))
    lmq_on = store._lmq_on
    unit = None
    if lmq_on and topic.startswith(LMQ_PREFIX):
        if with_kv:
            unit = LMQ_UNIT.pack(phys, total, tc, store_ms)
            store._lmq.add(topic, qoff, unit)
    else:
        store._cq(topic, qid).put_at(qoff, phys, total, tc)
    if store._multi_on:
        names = props.get(MessageConst.INNER_MULTI_DISPATCH)
        offsets = props.get(MessageConst.INNER_MULTI_QUEUE_OFFSET)
        if names and offsets:
            seen = {topic}
            for name, off in zip(names.split(","), offsets.split(","), strict=False):
                if name in seen or not _valid_name(store, name):
                    continue
                seen.add(name)
                try:
                    o = int(off)
                except ValueError:
                    continue
                if lmq_on and name.startswith(LMQ_PREFIX):
                    if with_kv:
                        if unit is None:
                            unit = LMQ_UNIT.pack(phys, total, tc, store_ms)
                        store._lmq.add(name, o, unit)
                else:
                    store._cq(name, qid).put_at(o, phys, total, tc)
    if with_kv and store._index_on and props:
        store._index(props, topic, store_ms, phys, total)
    return store_ms
