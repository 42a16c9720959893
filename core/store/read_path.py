"""The read path: get (pull), queue offsets, offset by time, lookups by offset and key.

`get` follows the table of docs/protocol.md §5.2; buffers are zero-copy slices of the mapped
CommitLog. File queues and LMQs are read through the same small interface (max offset,
min offset, units), so the logic below does not care which one it reads.
"""

from __future__ import annotations

import time

from core.common.codec import RecordError, decode_record, parse_layout
from core.common.message import MessageExt
from core.common.names import LMQ_PREFIX
from core.common.properties import MessageConst, decode_properties_bytes
from core.store.commitlog import store_timestamp
from core.store.key_index import KEYS_PREFIX, UNIQ_PREFIX
from core.store.results import GetResult, GetStatus, MessageFilter
from core.store.speedups import recent_slices

_NO_QUEUE = GetStatus.NO_MATCHED_LOGIC_QUEUE


class _LmqReader:
    """Adapter giving an LMQ the reading interface of a ConsumeQueue (made per call: LMQs
    have no resident objects)."""

    __slots__ = ("_lmq", "_name", "max_offset")

    def __init__(self, lmq, name: str) -> None:
        self._lmq = lmq
        self._name = name
        self.max_offset = lmq.next_offset(name)

    def min_offset(self, commitlog_min: int) -> int:
        return self._lmq.min_offset(self._name, commitlog_min) if self.max_offset else 0

    def units(self, offset: int, count: int) -> list[tuple[int, int, int]]:
        return self._lmq.units(self._name, offset, count)


class ReadPath:
    """Mixin of MessageStore holding the read calls (uses the store's attributes)."""

    def _reader(self, topic: str, queue_id: int):
        """The queue to read, or None when it does not exist (nothing is created)."""
        if self._lmq_on and topic.startswith(LMQ_PREFIX):
            if queue_id != 0 or self._lmq.check_name(topic) is not None:
                return None
            if self._kv.ops:
                self._commit_kv()
            return _LmqReader(self._lmq, topic)
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            cq = self._existing_cq(topic, queue_id)
        return cq

    # ------------------------------------------------------------------ get
    def get(
        self, topic: str, queue_id: int, offset: int, max_count: int = 32,
        max_bytes: int | None = None, filter: MessageFilter | None = None,
    ) -> GetResult:
        """Read up to `max_count` records (and about `max_bytes`) from `offset`."""
        st = self._stats
        st.get_calls += 1
        if not self._running:
            return GetResult(_NO_QUEUE, offset, 0, 0)
        q = self._reader(topic, queue_id)
        if q is None:
            if not self._valid_queue(topic, queue_id):
                return GetResult(_NO_QUEUE, offset, 0, 0)
            maxo = 0
        else:
            maxo = q.max_offset
        if maxo == 0:
            if offset == 0:
                return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, 0, 0, 0)
        cl = self.commitlog
        clmin = cl.min_offset
        mino = q.min_offset(clmin)
        if offset < mino:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, mino, mino, maxo)
        if offset == maxo:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, mino, maxo)
        if offset > maxo:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, maxo, mino, maxo)
        cfg = self._cfg
        if max_count > cfg.max_transfer_count:
            max_count = cfg.max_transfer_count
        if max_count < 1:
            max_count = 1
        if max_bytes is None or max_bytes > cfg.max_transfer_bytes:
            max_bytes = cfg.max_transfer_bytes
        limit = max(self._max_scan, max_count)  # units scanned at most (RocketMQ's rule)
        bufs: list[memoryview] = []
        total = 0
        scanned = 0
        removed = 0
        wrote = self._wrote
        files = cl.files
        fs = cl.file_size
        first_no = files[0].start // fs
        # Units are read in growing chunks: without a filter the first chunk is enough.
        chunk = max_count
        full = False
        while not full and scanned < limit:
            units = q.units(offset + scanned, min(chunk, limit - scanned))
            if not units:
                break
            for phys, size, tag in units:
                if phys < clmin or size <= 0 or phys + size > wrote:
                    scanned += 1
                    removed += 1
                    continue
                if filter is not None and not filter.is_matched_by_consume_queue(tag):
                    scanned += 1
                    continue
                if bufs and total + size > max_bytes:
                    full = True
                    break
                mf = files[phys // fs - first_no]
                pos = phys - mf.start
                buf = mf.view[pos : pos + size]
                scanned += 1
                if filter is not None and not filter.is_matched_by_commit_log(buf):
                    buf.release()
                    continue
                bufs.append(buf)
                total += size
                if len(bufs) >= max_count:
                    full = True
                    break
            chunk *= 4
        n = len(bufs)
        if n:
            st.get_msgs += n
            st.get_bytes += total
            status = GetStatus.FOUND
        elif scanned and removed == scanned:
            status = GetStatus.MESSAGE_WAS_REMOVING
        else:
            status = GetStatus.NO_MATCHED_MESSAGE
        return GetResult(status, offset + scanned, mino, maxo, bufs, n, total)

    def recent_records(self, topic: str, offset: int, max_count: int,
                       max_bytes: int) -> tuple[list[memoryview], int] | None:
        """The records of LMQ `topic` from `offset` while their units are still in memory
        (dispatched since the last RocksDB commit or by it: a reader close behind the
        writer, such as a POP woken by the dispatch), with the LMQ's max offset; zero-copy
        slices, consecutive offsets, at most `max_count` and about `max_bytes`; no records
        when `offset` (above 0) is the LMQ's max offset: nothing written past it (a long
        poll's first, empty pop). None when `offset` is not held in memory (use `get`). No
        RocksDB commit, no RocksDB read."""
        if not self._running or not self._lmq_on or not topic.startswith(LMQ_PREFIX):
            return None
        cfg = self._cfg
        max_count = min(max_count, cfg.max_transfer_count)
        max_bytes = min(max_bytes, cfg.max_transfer_bytes)
        lmq = self._lmq
        chain = lmq.recent_chain(topic, offset)
        bufs = None
        if chain is not None:
            cl = self.commitlog
            bufs, total = recent_slices(chain, offset, max_count, max_bytes, cl.files,
                                        cl.file_size, cl.first_no, cl.min_offset, self._wrote)
        if not bufs:
            # Nothing held at `offset`: at the LMQ's end that means nothing was written past
            # it (a long poll's empty pop), otherwise read the store.
            return ([], offset) if offset > 0 and lmq.next_offset(topic) == offset else None
        st = self._stats
        st.get_msgs += len(bufs)
        st.get_bytes += total
        return bufs, lmq.next_offset(topic)

    def units(self, topic: str, queue_id: int, offset: int, max_count: int) -> list[tuple[int, int, int]]:
        """Raw units (physical offset, size, tag code) from `offset`."""
        q = self._reader(topic, queue_id)
        if q is None or max_count <= 0 or offset < 0:
            return []
        return q.units(offset, max_count)

    # ------------------------------------------------------------------ offsets
    def max_offset(self, topic: str, queue_id: int) -> int:
        """Next offset to write (= units written) of the queue; 0 if it does not exist."""
        q = self._reader(topic, queue_id)
        return q.max_offset if q is not None else 0

    def min_offset(self, topic: str, queue_id: int) -> int:
        """First offset whose record still exists."""
        q = self._reader(topic, queue_id)
        if q is None or q.max_offset == 0:
            return 0
        return q.min_offset(self.commitlog.min_offset)

    def _unit_time(self, phys: int, size: int) -> int:
        """Store timestamp of the record a unit points to; -1 if it is gone."""
        if size <= 0 or phys < self.commitlog.min_offset:
            return -1
        rec = self.commitlog.slice(phys, size)
        if rec is None:
            return -1
        return store_timestamp(rec)

    def message_store_time(self, topic: str, queue_id: int, offset: int) -> int:
        """Store timestamp of the message at `offset`; -1 when there is none."""
        q = self._reader(topic, queue_id)
        if q is None or offset < 0 or offset >= q.max_offset:
            return -1
        u = q.units(offset, 1)
        return self._unit_time(u[0][0], u[0][1]) if u else -1

    def earliest_message_time(self, topic: str, queue_id: int) -> int:
        """Store timestamp of the oldest message still in the queue; -1 if none."""
        q = self._reader(topic, queue_id)
        if q is None or q.max_offset == 0:
            return -1
        mino = q.min_offset(self.commitlog.min_offset)
        if mino >= q.max_offset:
            return -1
        return self.message_store_time(topic, queue_id, mino)

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First offset whose store time is >= `timestamp_ms`, else the max offset. Binary
        search over the queue, reading store times from the CommitLog."""
        q = self._reader(topic, queue_id)
        if q is None or q.max_offset == 0:
            return 0
        lo = q.min_offset(self.commitlog.min_offset)
        hi = q.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            u = q.units(mid, 1)
            ts = self._unit_time(u[0][0], u[0][1]) if u else -1
            if ts >= timestamp_ms:
                hi = mid
            else:
                lo = mid + 1
        return lo

    # ------------------------------------------------------------------ lookups
    def read_record(self, physical_offset: int) -> memoryview | None:
        """The whole record at `physical_offset` (e.g. from an offset msgId), or None."""
        if physical_offset < self.commitlog.min_offset or physical_offset >= self._wrote:
            return None
        return self.commitlog.record_at(physical_offset, self._wrote)

    def look_message(self, physical_offset: int) -> MessageExt | None:
        """Decoded message at `physical_offset`, or None."""
        rec = self.read_record(physical_offset)
        if rec is None:
            return None
        try:
            return decode_record(rec)
        except RecordError:
            return None

    def _key_records(self, prefix: bytes, topic: str, key: str, max_num: int,
                     begin_ms: int, end_ms: int) -> list[memoryview]:
        if not self._running or not self._index_on:
            return []
        if self._kv.ops:
            self._commit_kv()
        cl = self.commitlog
        first = cl.record_at(cl.min_offset, self._wrote)
        begin_ms = max(begin_ms, store_timestamp(first) if first is not None else 0)
        # Bound the bucket walk; one bucket of slack for a clock that stepped back.
        end_ms = min(end_ms, time.time_ns() // 1_000_000 + self._cfg.index_bucket_ms)
        out: list[memoryview] = []
        prop = MessageConst.KEYS if prefix == KEYS_PREFIX else MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX
        for _ms, phys, size in self._keys.lookup(prefix, topic, key, max_num, begin_ms, end_ms):
            if phys < cl.min_offset or phys + size > self._wrote:
                continue
            rec = cl.slice(phys, size)
            # Entries are verified against the record: after a crash a stale entry may point
            # at a record that reuses the same offset.
            if rec is not None and _record_has(rec, topic, prop, key):
                out.append(rec)
        return out

    def query_by_key(
        self, topic: str, key: str, max_num: int = 32, begin_ms: int = 0, end_ms: int = 2**62,
    ) -> list[memoryview]:
        """Records of `topic` whose KEYS contain `key`, newest first."""
        return self._key_records(KEYS_PREFIX, topic, key, max_num, begin_ms, end_ms)

    def query_by_uniq_key(self, topic: str, uniq_key: str) -> list[memoryview]:
        """Records of `topic` whose UNIQ_KEY is `uniq_key` (normally one)."""
        return self._key_records(UNIQ_PREFIX, topic, uniq_key, 32, 0, 2**62)


def _record_has(rec: memoryview, topic: str, prop: str, key: str) -> bool:
    try:
        lay = parse_layout(rec)
    except RecordError:
        return False
    if bytes(rec[lay.topic_start : lay.topic_start + lay.topic_length]) != topic.encode():
        return False
    props = decode_properties_bytes(
        rec[lay.properties_start : lay.properties_start + lay.properties_length]
    )
    value = props.get(prop)
    if value is None:
        return False
    if prop == MessageConst.KEYS:
        return key in value.split(MessageConst.KEY_SEPARATOR)
    return value == key

