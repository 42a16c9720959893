"""The store's RocksDB (`<store_dir>/lmq/`): LMQ units and offsets, the key index, and the
marker saying how far the CommitLog has been dispatched into it.

Key space (raw bytes; numbers big-endian so that byte order is numeric order and a range
scan over one queue returns its units in offset order):

```
b"\\x00marker"                         -> int64  CommitLog offset dispatched into this DB
b"\\x00lmqcount"                       -> int64  number of LMQs
b"u" name b"\\x00" int64 offset        -> phys int64 | size int32 | tag code int64 | store ms int64
b"n" name                             -> int64  LMQ min offset (set when retention moved it)
b"k"|b"q" int32 bucket uint16 len topic#key int64 store ms int64 phys -> int32 size
                                         (KEYS | UNIQ_KEY index, see key_index.py)
```

LMQ names are topic names (`[%|a-zA-Z0-9_-]`), so the 0x00 after the name keeps one queue's
units contiguous and apart from any queue whose name extends it.

Durability. Writes are staged (key-index entries in a list, LMQ units grouped by queue in
the LMQ index) and written in key order as one WriteBatch when `kv_batch_max_ops`
operations or 1 MiB of CommitLog have accumulated, before any LMQ or key read, and at
shutdown; the marker is part of every batch. RocksDB persists memtables in order, so whatever survives a crash is a prefix of the batches, and the marker says how far
it reaches. Recovery re-dispatches the CommitLog from the marker, and re-dispatch is
idempotent (same keys, same values). That is why the WAL is off by default
(`kv_disable_wal`): the CommitLog already is the write-ahead log. A RocksDB WAL would write
every unit twice more (WAL, then SST) — with 4 LMQs and a UNIQ_KEY per message that is
~300 bytes per message next to a ~380-byte record — to save replay work that is bounded
anyway: a crash loses at most the memtable, and the flusher forces a memtable flush once the
durable marker lags by more than `kv_max_replay_bytes` of CommitLog, so a restart
re-dispatches at most that much. With `kv_disable_wal=False` a crash loses only the staged
operations (RocksDB replays its own WAL) and the restart re-dispatches at most 1 MiB.
Power loss: the marker and the CommitLog may disagree either way; recovery takes the
smaller of marker and checkpoint, and drops LMQ units past the recovered CommitLog end.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Protocol

from rocksdict import (
    BlockBasedOptions,
    Cache,
    DBCompressionType,
    Options,
    Rdict,
    WriteBatch,
    WriteOptions,
)

MARKER_KEY = b"\x00marker"
LMQ_COUNT_KEY = b"\x00lmqcount"
INT64 = struct.Struct(">q")


class KvStore:
    """One RocksDB instance with a write-behind batch owned by the writer thread.

    Writes only stage: `pending` holds (key, value) pairs, and `sources` (the LMQ index)
    keep their own staged items in whatever form is cheapest to build, counting them in
    `staged_ops`. `commit(marker)` writes everything staged in one WriteBatch.
    `flush_memtable` may run in the flusher thread (RocksDB is thread-safe and rocksdict
    releases the GIL there).
    """

    def __init__(
        self, path: str, *, disable_wal: bool, write_buffer_mb: int, block_cache_mb: int,
        batch_max_ops: int,
    ) -> None:
        os.makedirs(path, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_write_buffer_size(write_buffer_mb << 20)
        opts.set_max_write_buffer_number(3)
        opts.set_max_background_jobs(2)
        opts.set_allow_concurrent_memtable_write(False)  # one writer thread
        opts.set_keep_log_file_num(2)
        opts.set_max_total_wal_size(4 * (write_buffer_mb << 20))
        opts.set_compression_type(DBCompressionType.lz4())
        table = BlockBasedOptions()
        table.set_bloom_filter(10, False)  # most LMQ lookups are for names not seen yet
        table.set_block_cache(Cache(block_cache_mb << 20))
        opts.set_block_based_table_factory(table)
        self.path = path
        self.db = Rdict(path, opts)
        self._wo = WriteOptions()
        self._wo.disable_wal = disable_wal
        self.disable_wal = disable_wal
        # Staged (key, value) pairs, written sorted: RocksDB's skiplist inserts keys that
        # follow the previous one much faster (measured ~2x for LMQ units).
        self.pending: list[tuple[bytes, bytes]] = []
        self.staged_ops = 0  # operations staged by `sources`
        self.batch_max_ops = batch_max_ops
        raw = self.db.get(MARKER_KEY)
        self.marker = INT64.unpack(raw)[0] if raw else -1  # last committed marker
        self.durable_marker = self.marker  # marker known to be on disk
        # Called before each commit to add derived keys (LMQ counters).
        self.stagers: list[Callable[[], None]] = []
        self.sources: list[StagedSource] = []

    # ------------------------------------------------------------------ writes
    @property
    def ops(self) -> int:
        """Operations staged and not yet handed to RocksDB."""
        return len(self.pending) + self.staged_ops

    def put(self, key: bytes, value: bytes) -> None:
        self.pending.append((key, value))

    def commit(self, marker: int) -> None:
        """Write the staged operations with `marker` (the CommitLog offset they reach).
        Raises when RocksDB refuses the write: nothing is lost, it stays staged."""
        for stage in self.stagers:
            stage()
        pending = self.pending
        if not pending and not self.staged_ops and marker == self.marker:
            return
        self.pending = []
        self.staged_ops = 0
        snaps = [src.take_staged() for src in self.sources]
        pending.sort()
        batch = WriteBatch(raw_mode=True)
        put = batch.put
        put(MARKER_KEY, INT64.pack(marker))
        for k, v in pending:
            put(k, v)
        for src, snap in zip(self.sources, snaps, strict=True):
            if snap is not None:
                src.write_staged(snap, put)
        try:
            self.db.write(batch, self._wo)
        except BaseException:
            # Nothing was written: stage it again, ahead of anything staged since.
            self.pending = pending + self.pending
            for src, snap in zip(self.sources, snaps, strict=True):
                if snap is not None:
                    self.staged_ops += src.restage(snap)
            raise
        self.marker = marker
        if not self.disable_wal:
            # With the WAL on, a write survives a process crash once it returns.
            self.durable_marker = marker

    def delete_range(self, begin: bytes, end: bytes) -> None:
        """Delete keys in [begin, end) now (callers commit the batch first)."""
        self.db.delete_range(begin, end)

    def put_now(self, key: bytes, value: bytes) -> None:
        """Write one key now, outside the staged batch (callers commit first)."""
        self.db.put(key, value)

    def delete_now(self, key: bytes) -> None:
        self.db.delete(key)

    def flush_memtable(self) -> None:
        """Persist the memtable (GIL released). Safe from the flusher thread."""
        marker = self.marker
        self.db.flush(True)
        self.durable_marker = max(self.durable_marker, marker)

    # ------------------------------------------------------------------ reads
    def get(self, key: bytes) -> bytes | None:
        return self.db.get(key)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        return self.db.get(keys)

    def get_int(self, key: bytes, default: int = 0) -> int:
        raw = self.get(key)
        return INT64.unpack(raw)[0] if raw else default

    def scan(
        self, lower: bytes, upper: bytes, *, reverse: bool = False, limit: int | None = None,
    ) -> list[tuple[bytes, bytes]]:
        """Items with lower <= key < upper, in key order (or reversed), at most `limit`.
        Bounds are checked here: rocksdict's iterate_lower_bound is not honoured by prev()."""
        it = self.db.iter()
        out: list[tuple[bytes, bytes]] = []
        try:
            if reverse:
                it.seek_for_prev(upper)
                if it.valid() and it.key() >= upper:
                    it.prev()
            else:
                it.seek(lower)
            while it.valid() and (limit is None or len(out) < limit):
                key = it.key()
                if key < lower or key >= upper:
                    break
                out.append((key, it.value()))
                if reverse:
                    it.prev()
                else:
                    it.next()
        finally:
            del it  # a live iterator keeps RocksDB open (see close())
        return out

    def close(self) -> None:
        """Close RocksDB (flushes the memtable). Pending batch operations are the caller's
        to commit first."""
        self.db.close()
        self.db = None  # type: ignore[assignment]


class StagedSource(Protocol):
    """Something that stages KV writes in its own structure (LmqIndex). The KvStore
    detaches them at commit and hands them back if RocksDB refused the write."""

    def take_staged(self) -> object | None:
        """Detach what is staged (None: nothing)."""

    def write_staged(self, snapshot: object, put: Callable[[bytes, bytes], None]) -> None:
        """Put the detached items into the write batch."""

    def restage(self, snapshot: object) -> int:
        """Stage a refused snapshot again, ahead of anything staged since; return its
        number of operations."""
