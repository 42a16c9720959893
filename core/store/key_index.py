"""Message key index: KEYS and UNIQ_KEY -> records (QUERY_MESSAGE, docs/protocol.md §5.17).

RocketMQ keeps this in hash-indexed files that are deleted by age. Here it is a range of
the store's RocksDB, bucketed by store time so that retention drops whole buckets with one
range delete:

```
b"k" (KEYS) | b"q" (UNIQ_KEY)  int32 bucket  uint16 len  topic "#" key  int64 store ms  int64 phys
    -> int32 record size
```
bucket = store ms // `index_bucket_ms`. A lookup visits the buckets of its time range,
newest first (a few dozen seeks for three days of hourly buckets).
"""

from __future__ import annotations

import struct

from core.store.kv import KvStore

KEYS_PREFIX = b"k"
UNIQ_PREFIX = b"q"
_MAX_KEY_BYTES = 1024  # longer topic#key strings are not indexed (named limit)
_BUCKET = struct.Struct(">i")
_LEN = struct.Struct(">H")
_TAIL = struct.Struct(">qq")
_SIZE = struct.Struct(">i")
_ENTRIES: dict[int, struct.Struct] = {}  # whole key by topic#key length (one pack per key)


def _entry(n: int) -> struct.Struct:
    """Struct of a whole key with an n-byte topic#key: prefix, bucket, n, topic#key, store
    ms, phys (n <= _MAX_KEY_BYTES, so at most that many)."""
    s = _ENTRIES.get(n)
    if s is None:
        s = _ENTRIES[n] = struct.Struct(f">ciH{n}sqq")
    return s


class KeyIndex:
    """Writes index entries into the KvStore batch and answers lookups."""

    def __init__(self, kv: KvStore, bucket_ms: int) -> None:
        self._kv = kv
        self.bucket_ms = bucket_ms

    def add(self, prefix: bytes, topic: str, key: str, store_ms: int, phys: int, size: int) -> None:
        tk = (topic + "#" + key).encode()
        n = len(tk)
        if n > _MAX_KEY_BYTES:
            return
        self._kv.pending.append((
            _entry(n).pack(prefix, store_ms // self.bucket_ms, n, tk, store_ms, phys),
            _SIZE.pack(size),
        ))

    def add_many(self, store_ms: int, entries: list[tuple[bytes, bytes, int, int]]) -> None:
        """Stage entries (prefix, b"topic#key", phys, size) of records stored at
        `store_ms` (a batch)."""
        bucket = store_ms // self.bucket_ms
        append = self._kv.pending.append
        pack_size = _SIZE.pack
        for prefix, tk, phys, size in entries:
            n = len(tk)
            if n <= _MAX_KEY_BYTES:
                append((_entry(n).pack(prefix, bucket, n, tk, store_ms, phys), pack_size(size)))

    def lookup(
        self, prefix: bytes, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int,
    ) -> list[tuple[int, int, int]]:
        """(store ms, phys, size) of entries with begin_ms <= store ms <= end_ms, newest
        first, at most `max_num`."""
        tk = f"{topic}#{key}".encode()
        if len(tk) > _MAX_KEY_BYTES or max_num <= 0 or end_ms < begin_ms:
            return []
        out: list[tuple[int, int, int]] = []
        bucket = end_ms // self.bucket_ms
        first = begin_ms // self.bucket_ms
        head_len = len(prefix) + 4
        body = _LEN.pack(len(tk)) + tk
        while bucket >= first and len(out) < max_num:
            base = prefix + _BUCKET.pack(bucket) + body
            lower = base + _TAIL.pack(max(begin_ms, 0), 0)
            upper = base + _TAIL.pack(end_ms, 2**63 - 1)
            for k, v in self._kv.scan(lower, upper, reverse=True, limit=max_num - len(out)):
                ms, phys = _TAIL.unpack_from(k, head_len + len(body))
                out.append((ms, phys, _SIZE.unpack(v)[0]))
            bucket -= 1
        return out

    def drop_before(self, store_ms: int) -> None:
        """Retention: drop every bucket that ends before `store_ms`."""
        bucket = _BUCKET.pack(max(0, store_ms // self.bucket_ms))
        for prefix in (KEYS_PREFIX, UNIQ_PREFIX):
            self._kv.delete_range(prefix + _BUCKET.pack(0), prefix + bucket)
