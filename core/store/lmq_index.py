"""LMQ index: every `%LMQ%` queue (queue id 0) as keys of the store's RocksDB (docs/protocol.md §10.3-10.4).

A million LMQs cost no file, no handle and no memory per queue: units are `u` keys (see
kv.py for the layout), and the only per-queue memory is a bounded cache of max offsets
(`lmq_offset_cache_size`, oldest-inserted entries evicted first).

The max offset is not stored: it is the last unit's offset + 1, found on a cache miss by
one reverse seek. Storing it would add a write per LMQ per commit (measured: +30 % RocksDB
writes for 4 LMQs per message over 1000 LMQs) to save a seek on the rarer cache miss. When
retention removes every unit of an LMQ, its `n` (min offset) key keeps the offset.

Units staged since the last commit are kept here, grouped by queue (bounded by the commit
threshold), so an evicted entry never falls back to a stale value in RocksDB.

The read interface mirrors ConsumeQueue: max offset, min offset, units, one unit.
"""

from __future__ import annotations

import struct
from collections import deque
from itertools import islice

from core.common.names import validate_lmq
from core.store.kv import INT64, LMQ_COUNT_KEY, KvStore
from core.store.speedups import stage_batch_lmqs, stage_units, write_units

# Unit value: phys int64 | size int32 | tag code int64 | store timestamp int64 (28 bytes,
# the layout of RocketMQ 5's RocksDB consume queue; the timestamp serves offset_by_time).
LMQ_UNIT = struct.Struct(">qiqq")
_EMPTY_UNIT = (0, 0, 0)
_PREFIX_CACHE = 8192  # unit key prefixes kept between commits (hot queues)
#: Most LMQ units kept in memory after their RocksDB commit (those of the latest commits),
#: so a reader close behind the writer — a POP woken by the dispatch, or one up to about
#: this many units behind — reads no RocksDB (`recent_chain`; docs/pop.md "Hand-off").
#: A unit costs 50-110 bytes there (its value is shared by the LMQs of one message).
RECENT_UNITS_MAX = 131_072
#: Most commits whose units are kept (bounds a look-up).
RECENT_COMMITS_MAX = 32


def unit_prefix(name: str) -> bytes:
    return b"u" + name.encode() + b"\x00"


class LmqIndex:
    """LMQ units and offsets. Writes are staged here and handed to the KvStore batch at
    commit; reads need it committed (the store commits before every LMQ read)."""

    def __init__(self, kv: KvStore, cache_size: int) -> None:
        self._kv = kv
        # name -> next offset; the put path reads it directly (never writes it).
        self.cache: dict[str, int] = {}
        # Units staged since the last commit, by queue: name -> [offset, value, offset,
        # value, ...] in staging order. Grouping by queue at staging time is what makes the
        # commit cheap: keys are built once per queue prefix, and only the names need
        # sorting (a queue's units arrive in offset order), not every key.
        self._staged: dict[str, list] = {}
        # The units of the latest commits, oldest first, with their count (same layout
        # as `_staged`): with `_staged` they let `recent_chain` serve a reader close
        # behind the writer from memory. Bounded by RECENT_UNITS_MAX / _COMMITS_MAX.
        self._recent: deque[tuple[dict[str, list], int]] = deque()
        self._recent_units = 0
        self._prefixes: dict[str, bytes] = {}  # name -> b"u" name b"\x00" (bounded)
        self._cap = cache_size
        self.count = kv.get_int(LMQ_COUNT_KEY)
        self._count_dirty = False
        kv.stagers.append(self._stage)
        kv.sources.append(self)

    # ------------------------------------------------------------------ offsets
    def next_offset(self, name: str) -> int:
        """Max offset (next offset to write) of `name`; 0 for an unknown LMQ."""
        v = self.cache.get(name)
        if v is None:
            v = self._load(name)
        return v

    def _stored_max(self, name: str) -> int:
        """Max offset from RocksDB: last unit + 1, else the min key, else 0."""
        nb = name.encode()
        prefix = b"u" + nb + b"\x00"
        last = self._kv.scan(prefix, b"u" + nb + b"\x01", reverse=True, limit=1)
        if last:
            return INT64.unpack(last[0][0][-8:])[0] + 1
        return self._kv.get_int(b"n" + nb)

    def _load(self, name: str) -> int:
        staged = self._staged.get(name)
        if staged:
            # Not committed yet (the entry was evicted since): the staged units know.
            v = max(staged[0::2]) + 1
            stored = self._stored_max(name)
            if stored > v:
                v = stored
        else:
            v = self._stored_max(name)
        cache = self.cache
        cache[name] = v
        if len(cache) > self._cap:
            for k in list(islice(cache, max(1, self._cap // 64))):
                del cache[k]
        return v

    def next_offset_checked(self, name: str) -> int:
        """next_offset() for a name not yet validated: -1 when `name` is not a legal LMQ."""
        v = self.cache.get(name)
        if v is None:
            if validate_lmq(name) is not None:
                return -1
            v = self._load(name)
        return v

    def check_name(self, name: str) -> str | None:
        """Validation result of an LMQ name (valid names are not re-checked while cached)."""
        if name in self.cache:
            return None
        return validate_lmq(name)

    def _stage_unit(self, name: str, offset: int, value: bytes) -> None:
        units = self._staged.get(name)
        if units is None:
            self._staged[name] = [offset, value]
        else:
            units.append(offset)
            units.append(value)
        self._kv.staged_ops += 1

    def add(self, name: str, offset: int, value: bytes) -> None:
        """Stage unit `offset` of `name` (value = LMQ_UNIT bytes). Idempotent."""
        prev = self.cache.get(name)
        if prev is None:
            prev = self._load(name)
        self._stage_unit(name, offset, value)
        if offset >= prev:
            if prev == 0:
                self.count += 1
                self._count_dirty = True
            self.cache[name] = offset + 1

    def add_planned(self, targets: list[tuple[str, int]], value: bytes) -> None:
        """Stage units planned by the put path: each offset is the queue's next offset (or
        beyond it, inside a batch), so no comparison with the current max is needed."""
        created = stage_units(self._staged, self.cache, targets, value)
        if created:
            self.count += created
            self._count_dirty = True
        self._kv.staged_ops += len(targets)

    def add_planned_many(self, items: list[tuple[str, int, bytes]]) -> None:
        """add_planned for (name, offset, value) triples (a whole batch at once)."""
        staged = self._staged
        get = staged.get
        cache = self.cache
        for name, off, value in items:
            units = get(name)
            if units is None:
                staged[name] = [off, value]
            else:
                units.append(off)  # two appends: cheaper than += (off, value)
                units.append(value)
            cache[name] = off + 1
            if off == 0:
                self.count += 1
                self._count_dirty = True
        self._kv.staged_ops += len(items)

    def add_batch(self, names: list, bases: dict[str, int], cq_units: bytearray,
                  store_ms: int) -> int:
        """Stage the units of a batch planned by speedups.plan_batch_lmqs (every LMQ
        exists: none is created); returns how many were staged."""
        staged = stage_batch_lmqs(self._staged, self.cache, names, bases, cq_units, store_ms)
        self._kv.staged_ops += staged
        return staged

    def _stage(self) -> None:
        """Before a commit: stage the LMQ count with the units."""
        if self._count_dirty:
            self._kv.put(LMQ_COUNT_KEY, INT64.pack(self.count))
            self._count_dirty = False

    # --------------------------------------------------- KvStore staged source
    def take_staged(self) -> dict[str, list] | None:
        staged = self._staged
        if not staged:
            return None
        self._staged = {}
        n = sum(map(len, staged.values())) // 2
        recent = self._recent
        recent.append((staged, n))
        self._recent_units += n
        while recent and (len(recent) > RECENT_COMMITS_MAX
                          or self._recent_units > RECENT_UNITS_MAX):
            self._recent_units -= recent.popleft()[1]
        return staged

    def write_staged(self, snapshot: dict[str, list], put) -> None:
        """Units in key order: names sorted (LMQ names are ASCII, so str order is byte
        order), each queue's units in staging order (ascending offsets)."""
        prefixes = self._prefixes
        if len(prefixes) > _PREFIX_CACHE:
            prefixes.clear()
        write_units(snapshot, put, prefixes)

    def restage(self, snapshot: dict[str, list]) -> int:
        staged = self._staged
        n = 0
        for name, units in snapshot.items():
            later = staged.get(name)
            staged[name] = units + later if later else units
            n += len(units) // 2
        return n

    def min_offset(self, name: str, commitlog_min: int) -> int:
        """First offset whose record still exists. Retention does not touch LMQs; their
        minimum is corrected here, lazily: binary search for the first unit at or above the
        CommitLog minimum, then drop the units below it."""
        nb = name.encode()
        raw = self._kv.get(b"n" + nb)
        lo = INT64.unpack(raw)[0] if raw else 0
        hi = self.next_offset(name)
        if lo >= hi or commitlog_min == 0:
            return lo
        first = self.unit(name, lo)
        if first[1] != 0 and first[0] >= commitlog_min:
            return lo
        old = lo
        while lo < hi:
            mid = (lo + hi) // 2
            u = self.unit(name, mid)
            if u[1] != 0 and u[0] >= commitlog_min:
                hi = mid
            else:
                lo = mid + 1
        prefix = b"u" + nb + b"\x00"
        self._kv.delete_range(prefix + INT64.pack(old), prefix + INT64.pack(lo))
        self._kv.put_now(b"n" + nb, INT64.pack(lo))
        return lo

    # ------------------------------------------------------------------ units
    def unit(self, name: str, offset: int) -> tuple[int, int, int, int]:
        raw = self._kv.get(b"u" + name.encode() + b"\x00" + INT64.pack(offset))
        return LMQ_UNIT.unpack(raw) if raw else (0, 0, 0, 0)

    def units(self, name: str, offset: int, count: int) -> list[tuple[int, int, int]]:
        """Units [offset, offset+count) clipped to the max offset; a missing unit reads as
        (0, 0, 0) (removed)."""
        end = min(offset + count, self.next_offset(name))
        if offset >= end:
            return []
        prefix = b"u" + name.encode() + b"\x00"
        pack = INT64.pack
        raws = self._kv.get_many([prefix + pack(o) for o in range(offset, end)])
        unpack = LMQ_UNIT.unpack
        return [unpack(r)[:3] if r else _EMPTY_UNIT for r in raws]

    def recent_chain(self, name: str, offset: int) -> list[list] | None:
        """The unit lists of `name` held in memory that a read from `offset` walks, oldest
        first (same layout as `_staged`: [offset, unit, ...]): the staged ones and those of
        the latest commits (RECENT_UNITS_MAX), back to one starting at or before `offset`;
        None when `offset` is older than all of them (read RocksDB).
        speedups.recent_slices turns them into records (MessageStore.recent_records)."""
        # Newest first while searching, back to a generation starting at or before
        # `offset` (a queue's units are staged in offset order).
        chain: list[list] = []
        units = self._staged.get(name)
        if units:
            chain.append(units)
        if not units or units[0] > offset:
            for gen, _ in reversed(self._recent):
                units = gen.get(name)
                if units:
                    chain.append(units)
                    if units[0] <= offset:
                        break
            else:
                return None
        chain.reverse()
        return chain

    # ------------------------------------------------------------------ admin
    def delete(self, name: str) -> bool:
        """Drop an LMQ's units and offsets (DELETE_TOPIC on an LMQ). Returns False when it
        did not exist."""
        existed = self.next_offset(name) > 0
        nb = name.encode()
        self.cache.pop(name, None)
        for gen, _ in self._recent:
            gen.pop(name, None)
        units = self._staged.pop(name, None)
        if units:
            self._kv.staged_ops -= len(units) // 2
        self._kv.delete_range(b"u" + nb + b"\x00", b"u" + nb + b"\x01")
        self._kv.delete_now(b"n" + nb)
        if existed:
            self.count -= 1
            self._count_dirty = True
        return existed

    def drop_units_at_or_beyond(self, end: int) -> int:
        """Delete units that point at or past CommitLog offset `end` (max offsets follow,
        being derived from the units). Needed only when the RocksDB marker is ahead of the recovered
        CommitLog (power loss lost CommitLog pages RocksDB had already persisted); it scans
        every unit, which is acceptable for that rare case."""
        dropped = 0
        self._recent.clear()
        self._recent_units = 0
        lowest: dict[str, int] = {}
        for key, value in self._kv.scan(b"u", b"v"):
            phys, size, _tag, _ts = LMQ_UNIT.unpack(value)
            if phys + size > end:
                sep = key.index(b"\x00", 1)
                name = key[1:sep].decode()
                off = INT64.unpack(key[sep + 1 :])[0]
                lowest[name] = min(off, lowest.get(name, off))
                self._kv.delete_now(key)
                dropped += 1
        for name in lowest:
            self.cache.pop(name, None)
            if self._stored_max(name) == 0:
                self.count -= 1
                self._count_dirty = True
        return dropped
