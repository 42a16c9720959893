"""MessageStore: the store as a library — lifecycle, flush, retention, admin, statistics.

The put path lives in put_path.py and put_batch.py, the read path in read_path.py (mixins
over the same state). Threading: every call comes from one thread (the broker's event
loop), except `flush()`, which may run in a worker thread while puts go on (see flush()).

Layout of `store_dir`:
```
commitlog/<20-digit start offset>             mapped CommitLog files
consumequeue/<topic>/<queueId>/<20 digits>    ConsumeQueue files
lmq/                                          RocksDB: LMQ units/offsets, key index (kv.py)
checkpoint                                    two-slot checkpoint (checkpoint.py)
```
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping

from core.common.names import LMQ_PREFIX, validate_lmq, validate_topic
from core.store.checkpoint import Checkpoint
from core.store.commitlog import CommitLog
from core.store.config import StoreConfig
from core.store.consume_queue import ConsumeQueue
from core.store.key_index import KeyIndex
from core.store.kv import KvStore
from core.store.lmq_index import LmqIndex
from core.store.put_batch import BatchPutPath
from core.store.read_path import ReadPath
from core.store.recovery import RecoveryReport, recover
from core.store.retention import clean_expired, deletion_due, disk_used_ratio
from core.store.stats import StoreStats

log = logging.getLogger(__name__)

# Write the checkpoint at least every this many bytes of CommitLog, whatever the interval.
_CHECKPOINT_MAX_LAG = 64 << 20


class MessageStore(BatchPutPath, ReadPath):
    """CommitLog + ConsumeQueues + LMQ index + key index (docs/store-api.md)."""

    def __init__(self, config: StoreConfig, *, store_host: bytes = b"\x7f\0\0\1\0\0\0\0") -> None:
        if len(store_host) != 8:
            raise ValueError("store_host must be 8 bytes (IPv4 + int32 port)")
        cfg = config
        self._cfg = cfg
        self._host = bytes(store_host)
        self._host_hex = self._host.hex().upper()
        # Called (topic, queue_id, new_max_offset) after every dispatch; LMQs use queue 0.
        self.dispatch_listener: Callable[[str, int, int], None] | None = None
        # Optional: called (names, max_offsets) once per put or batch with the LMQs it
        # multi-dispatched to (their new max offsets are max_offsets[name]) instead of
        # dispatch_listener once per LMQ (see PutPath._notify_lmqs).
        self.lmq_dispatch_listener: Callable[[Iterable[str], Mapping[str, int]], None] | None = None
        # Optional (topic, properties, store_ms) -> tag code, used when re-dispatching at
        # recovery for records whose CQ tag slot is not the TAGS hash (the broker's delay
        # topic keeps the delivery time there); None means "hash of TAGS".
        self.tags_code_resolver: Callable[[str, dict, int], int | None] | None = None
        self.recovery_report: RecoveryReport | None = None
        self._running = False
        self._stats = StoreStats()
        self._tails: dict[str, bytes] = {}  # valid topic -> TOPICLENGTH + TOPIC bytes
        self._tag_codes: dict[str, int] = {}  # TAGS -> tag hash (bounded)
        self._tag_codes_raw: dict[bytes, int] = {}  # the same by UTF-8 TAGS (batch bodies)
        self._multi_names: dict[str, list[str]] = {}  # INNER_MULTI_DISPATCH -> names (bounded)
        self._cqs: dict[tuple[str, int], ConsumeQueue] = {}
        self._dirty: deque = deque()  # CQ files written since their last fdatasync
        self._flush_lock = threading.Lock()
        self._max_body = cfg.max_message_size
        self._max_props = cfg.max_properties_size
        self._max_qid = cfg.max_queues_per_topic
        self._max_scan = cfg.max_scan_units
        self._lmq_on = cfg.enable_lmq
        self._multi_on = cfg.enable_multi_dispatch
        self._index_on = cfg.index_keys
        self._fs = cfg.commitlog_file_size
        self._kv_max_ops = cfg.kv_batch_max_ops
        self._cq_root = os.path.join(cfg.store_dir, "consumequeue")
        self.commitlog = CommitLog(os.path.join(cfg.store_dir, "commitlog"), cfg.commitlog_file_size)
        self._cur = None
        self._wpos = 0
        self._wrote = 0
        self._flushed = 0
        self._recovered_end = 0
        self._zombie_maps = 0
        self._checkpoint_at = 0.0
        self._kv_error: str | None = None  # set while RocksDB writes fail
        self._last_store_ms = 0  # store time of the last record dispatched (0: unknown)
        self._checkpoint: Checkpoint | None = None
        self._kv: KvStore | None = None
        self._lmq: LmqIndex | None = None
        self._keys: KeyIndex | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Load files and recover: cut a torn tail, re-dispatch what CQs/LMQs lack."""
        cfg = self._cfg
        os.makedirs(self._cq_root, exist_ok=True)
        try:
            self.commitlog.load()
            self._checkpoint = Checkpoint(os.path.join(cfg.store_dir, "checkpoint"))
            self._kv = KvStore(
                os.path.join(cfg.store_dir, "lmq"), disable_wal=cfg.kv_disable_wal,
                write_buffer_mb=cfg.kv_write_buffer_mb, block_cache_mb=cfg.kv_block_cache_mb,
                batch_max_ops=cfg.kv_batch_max_ops,
            )
            self._lmq = LmqIndex(self._kv, cfg.lmq_offset_cache_size)
            self._keys = KeyIndex(self._kv, cfg.index_bucket_ms)
            self.recovery_report = recover(self)
        except BaseException:
            self._close_all()
            raise
        self._running = True
        self.flush(force_checkpoint=True)

    def shutdown(self) -> None:
        """Flush everything, write the checkpoint, close files and RocksDB."""
        if not self._running:
            return
        self._running = False
        self._commit_kv()
        self.flush(force_checkpoint=True)
        self._close_all()

    def _close_all(self) -> None:
        with self._flush_lock:
            if self._kv is not None and self._kv.db is not None:
                self._kv.close()
            for cq in self._cqs.values():
                cq.close()
            self._cqs.clear()
            self.commitlog.close()
            if self._checkpoint is not None:
                self._checkpoint.close()
                self._checkpoint = None

    @property
    def running(self) -> bool:
        return self._running

    # ------------------------------------------------------------------ queues
    def _cq(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The ConsumeQueue of (topic, queue_id), loaded on first use (names validated)."""
        key = (topic, queue_id)
        cq = self._cqs.get(key)
        if cq is None:
            cq = ConsumeQueue(
                self._cq_root, topic, queue_id, self._cfg.consume_queue_units_per_file, self._dirty,
            )
            cq.load(self._recovered_end)
            self._cqs[key] = cq
        return cq

    def _valid_queue(self, topic: str, queue_id: int) -> bool:
        if queue_id < 0 or queue_id >= self._max_qid:
            return False
        if self._lmq_on and topic.startswith(LMQ_PREFIX):
            return queue_id == 0 and validate_lmq(topic) is None
        if topic in self._tails:
            return True
        return validate_topic(topic) is None

    def _existing_cq(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """A queue for reading: loaded only if it exists on disk (reads create nothing)."""
        if not self._valid_queue(topic, queue_id):
            return None
        if not os.path.isdir(os.path.join(self._cq_root, topic, str(queue_id))):
            return None
        return self._cq(topic, queue_id)

    def _roll(self):
        self._cur = self.commitlog.roll(self._cur, self._wpos)
        self._wpos = 0
        return self._cur

    def _prepare_files(self, count: int) -> None:
        """Create the next `count` CommitLog files before a batch writes anything."""
        start = self._cur.end
        for _ in range(count):
            if self.commitlog.file_for(start) is None:
                self.commitlog.new_file(start)
            start += self._fs

    def _commit_kv(self) -> None:
        """Write the staged RocksDB batch. A failure does not lose it (it stays staged) and
        makes puts answer SERVICE_NOT_AVAILABLE until a retry succeeds: the records already
        appended are safe in the CommitLog and re-dispatched at recovery anyway."""
        try:
            self._kv.commit(self._wrote)
        except Exception as exc:
            if self._kv_error is None:
                log.error("store: RocksDB write failed, refusing puts until it works: %s", exc)
            self._kv_error = f"RocksDB write failed: {exc}"
        else:
            self._kv_error = None

    def delete_topic(self, topic: str) -> None:
        """Drop a topic's consume queues (for an LMQ: its units and offsets). Its records
        stay in the CommitLog until retention removes them."""
        if self._lmq_on and topic.startswith(LMQ_PREFIX):
            if self._lmq.check_name(topic) is None:
                self._commit_kv()
                self._lmq.delete(topic)
                # With the RocksDB WAL off, an unflushed range delete would be lost in a
                # crash while recovery re-dispatches the LMQ's units from an older marker.
                # Persist the deletion with a marker at the write position (admin op: one
                # memtable flush).
                self._commit_kv()
                self._kv.flush_memtable()
            return
        if validate_topic(topic) is not None:
            return
        for key in [k for k in self._cqs if k[0] == topic]:
            self._cqs.pop(key).destroy()
        shutil.rmtree(os.path.join(self._cq_root, topic), ignore_errors=True)
        self._tails.pop(topic, None)

    def queue_ids(self, topic: str) -> list[int]:
        """Queue ids of `topic` that hold or held messages."""
        if self._lmq_on and topic.startswith(LMQ_PREFIX):
            ok = self._lmq.check_name(topic) is None
            return [0] if ok and self._lmq.next_offset(topic) > 0 else []
        ids = {qid for (t, qid), cq in self._cqs.items() if t == topic and cq.max_offset > 0}
        if validate_topic(topic) is None:
            try:
                ids.update(int(n) for n in os.listdir(os.path.join(self._cq_root, topic)) if n.isdigit())
            except FileNotFoundError:
                pass
        return sorted(ids)

    def topics(self) -> list[str]:
        """Topics that have consume queues (LMQs are not listed)."""
        names = {t for (t, _q), cq in self._cqs.items() if cq.max_offset > 0}
        try:
            names.update(os.listdir(self._cq_root))
        except FileNotFoundError:
            pass
        return sorted(names)

    # ------------------------------------------------------------------ offsets
    @property
    def max_physical_offset(self) -> int:
        """CommitLog offset after the last dispatched record."""
        return self._wrote

    @property
    def min_physical_offset(self) -> int:
        return self.commitlog.min_offset

    def index_last_update_timestamp(self) -> int:
        """Store time of the last record dispatched to the indexes (QUERY_MESSAGE's
        indexLastUpdateTimestamp); 0 when unknown (nothing written since start)."""
        return self._last_store_ms

    @property
    def flushed_offset(self) -> int:
        """CommitLog offset up to which data and CQ units are fsynced (the checkpoint)."""
        return self._flushed

    # ------------------------------------------------------------------ flush
    def flush(self, *, force_checkpoint: bool = False) -> int:
        """fdatasync CommitLog and ConsumeQueue pages, then write the checkpoint (at most
        once per `flush_interval_ms` unless forced); return the flushed CommitLog offset.
        Thread-safe w.r.t. the writer:

        * `target` is read first; the writer updates `_wrote` after a record's CQ units are
          written, so every unit of a record below `target` is already in the dirty queue.
        * A CQ file is queued when the writer finds its `dirty` flag clear (after writing);
          the flusher clears the flag before its fdatasync, so a write either lands before
          that fdatasync or re-queues the file.
        * os.fdatasync releases the GIL (mmap.flush() would hold it for the whole msync).
        """
        with self._flush_lock:
            if self._checkpoint is None:
                return self._flushed
            target = self._wrote
            dirty = []
            dq = self._dirty
            while dq:
                try:
                    mf = dq.popleft()
                except IndexError:
                    break
                mf.dirty = False
                dirty.append(mf)
            flushed = self._flushed
            for mf in list(self.commitlog.files):
                if mf.end > flushed and mf.start < target:
                    mf.sync()
            synced = set()
            for mf in dirty:
                if id(mf) not in synced:
                    synced.add(id(mf))
                    mf.sync()
            # The checkpoint only bounds the restart scan: in SYNC_FLUSH, where the broker
            # flushes per group commit, writing it every time would double the fsyncs.
            ck = self._checkpoint
            now = time.monotonic()
            if target != ck.physical_offset and (
                force_checkpoint or now - self._checkpoint_at >= self._cfg.flush_interval_ms / 1000
                or target - (ck.physical_offset or 0) >= _CHECKPOINT_MAX_LAG
            ):
                ck.write(target)
                self._checkpoint_at = now
            self._flushed = target
            kv = self._kv
            if kv is not None and kv.db is not None and kv.marker > kv.durable_marker \
                    and target - kv.durable_marker > self._cfg.kv_max_replay_bytes:
                kv.flush_memtable()  # bound the re-dispatch of a restart (kv.py)
            return target

    # ------------------------------------------------------------------ retention
    def disk_used_ratio(self) -> float:
        return disk_used_ratio(self._cfg.store_dir)

    def retention_due(self, now_ms: int | None = None) -> bool:
        """Whether `clean_expired(now_ms)` would delete a file (cheap; event loop)."""
        if not self._running:
            return False
        if now_ms is None:
            now_ms = time.time_ns() // 1_000_000
        return deletion_due(self, now_ms)

    def prepare_retention(self) -> None:
        """The slow part of a retention pass that deletes files: fsync everything and
        persist the LMQ index up to the write position. Safe in a worker thread (like
        `flush`), so an owner with an event loop keeps it off the loop; `clean_expired`
        then has little left to sync."""
        self.flush(force_checkpoint=True)
        self._kv.flush_memtable()

    def clean_expired(self, now_ms: int | None = None) -> int:
        """Retention pass (call periodically, e.g. every 10 s); number of files deleted."""
        if not self._running:
            return 0
        if now_ms is None:
            now_ms = time.time_ns() // 1_000_000
        return clean_expired(self, now_ms)

    # ------------------------------------------------------------------ stats
    def stats(self) -> dict:
        """Counters, put latency percentiles (µs) and the state of the store."""
        out = self._stats.snapshot()
        out.update({
            "commitlog_min_offset": self.commitlog.min_offset,
            "commitlog_max_offset": self._wrote,
            "commitlog_flushed_offset": self._flushed,
            "commitlog_files": len(self.commitlog.files),
            "consume_queues_loaded": len(self._cqs),
            "lmq_count": self._lmq.count if self._lmq is not None else 0,
            "kv_pending_ops": self._kv.ops if self._kv is not None else 0,
            "unreleased_mappings": self._zombie_maps,
        })
        return out
