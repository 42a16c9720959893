"""Store configuration: every limit of the store, named, with its default (docs/architecture.md §2)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StoreConfig:
    """Configuration of a `MessageStore`.

    The first block is the contract with the broker (docs/store-api.md); the second block
    holds store-internal knobs. Defaults follow RocketMQ 4.9 where it has an equivalent.
    """

    store_dir: str  # root: commitlog/, consumequeue/, lmq/ (RocksDB), checkpoint
    commitlog_file_size: int = 1 << 30  # mappedFileSizeCommitLog
    consume_queue_units_per_file: int = 300_000  # 6,000,000-byte CQ files, as RocketMQ
    flush_mode: str = "async"  # "async" | "sync" (the broker awaits group commits)
    flush_interval_ms: int = 500  # ASYNC_FLUSH period (the broker's timer calls flush())
    max_message_size: int = 4 * 1024 * 1024  # body limit (maxMessageSize)
    max_properties_size: int = 32767  # PROPERTIESLENGTH is a signed int16 (docs/protocol.md §7.1)
    enable_lmq: bool = True  # RocketMQ enableLmq
    enable_multi_dispatch: bool = True  # RocketMQ enableMultiDispatch
    max_lmq_per_message: int = 1000  # names in one INNER_MULTI_DISPATCH
    lmq_offset_cache_size: int = 100_000  # bounded cache of LMQ max offsets
    file_reserved_hours: float = 72.0  # retention by age (fileReservedTime)
    disk_max_used_ratio: float = 0.85  # retention by disk use (diskMaxUsedSpaceRatio)
    max_transfer_bytes: int = 256 * 1024  # per get (maxTransferBytesOnMessageInMemory)
    max_transfer_count: int = 32  # per get (maxTransferCountOnMessageInMemory)
    max_scan_units: int = 16000 // 20  # CQ units scanned per get: max(this, max_count)
    index_keys: bool = True  # KEYS / UNIQ_KEY index

    # --- additions (store internals) ---
    max_queues_per_topic: int = 65536  # a queue id must be in [0, this)
    # RocketMQ's maxLmqConsumeQueueNum is 20000 because every LMQ costs a file; ours cost a
    # few RocksDB keys, so the cap only guards against runaway clients.
    max_lmq_consume_queue_num: int = 10_000_000
    # LMQ and key-index writes are staged and written as one sorted RocksDB WriteBatch when
    # this many are staged (or 1 MiB of CommitLog passed), before any LMQ/key read, and at
    # shutdown. Bigger is faster (RocksDB inserts neighbouring keys cheaply: with 4 LMQs per
    # message, 8192 costs 12 % less CPU per put than 1024); smaller keeps each write's pause
    # short (8192 operations: ~3 ms on a 2-core VM).
    kv_batch_max_ops: int = 8192
    # RocksDB WAL: off by default; the CommitLog is the log (see kv.py, "Durability").
    kv_disable_wal: bool = True
    kv_write_buffer_mb: int = 32  # RocksDB memtable size
    # With the WAL off, a crash loses the memtable; flush() forces a memtable flush once
    # this much CommitLog lies past the durable marker, bounding the restart's re-dispatch.
    kv_max_replay_bytes: int = 32 << 20
    kv_block_cache_mb: int = 32
    index_bucket_ms: int = 3_600_000  # key-index time bucket: retention drops whole buckets
    # Files are sparse. With preallocate_files, CommitLog disk blocks are reserved
    # (posix_fallocate) `commitlog_reserve_step` bytes ahead of the write position, so a
    # full disk fails a put instead of SIGBUS-ing the process through the mapping; an
    # idle store still costs no more than one step of disk.
    preallocate_files: bool = True
    commitlog_reserve_step: int = 4 << 20
    # Puts are refused (SERVICE_NOT_AVAILABLE) while the disk is fuller than this; checked
    # at every reservation step. RocketMQ's diskSpaceWarningLevelRatio is 0.90, but our
    # CommitLog blocks are reserved ahead, so this only keeps headroom for ConsumeQueue
    # pages (sparse) and RocksDB.
    disk_full_ratio: float = 0.98
    delete_files_per_pass: int = 10  # CommitLog files removed per retention pass

    def __post_init__(self) -> None:
        if self.commitlog_file_size < 4096:
            raise ValueError("commitlog_file_size must be >= 4096")
        if self.consume_queue_units_per_file < 1:
            raise ValueError("consume_queue_units_per_file must be >= 1")
        if self.flush_mode not in ("async", "sync"):
            raise ValueError("flush_mode must be 'async' or 'sync'")
        if self.max_properties_size > 32767 or self.max_properties_size < 0:
            raise ValueError("max_properties_size must be in [0, 32767]")
        if self.lmq_offset_cache_size < 1:
            raise ValueError("lmq_offset_cache_size must be >= 1")
        if self.kv_batch_max_ops < 1:
            raise ValueError("kv_batch_max_ops must be >= 1")
        if self.index_bucket_ms < 1000:
            raise ValueError("index_bucket_ms must be >= 1000")
