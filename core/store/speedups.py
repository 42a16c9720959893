"""The per-message byte work of the put paths: C when core._speedups was built, else the
Python of core/store/speedups_py.py.

The store plans every message in Python (validation, queue and LMQ offsets, file rolls)
and calls these for the bytes. The Python versions are the reference: tests check that the
C ones (core/_speedups.c) give the same bytes wherever they accept an input, and the store
runs on them where no C compiler was available at install time. Set LMQ_PURE_PYTHON=1 to
use them anyway. The C ones take exact types only (int not bool, bytes not a subclass,
list not tuple) and refuse anything else, or any position or length outside its buffer,
with TypeError, ValueError or OverflowError (docs/store-api.md, "What the C functions
accept").

- crc32(data) -> int: zlib's CRC-32.
- encode_props(props, offsets) -> bytes: the stored properties string; with an offsets list,
  WAIT and INNER_MULTI_QUEUE_OFFSET are left out and INNER_MULTI_QUEUE_OFFSET=offsets is
  appended (multi-dispatch, docs/protocol.md §10.2).
- write_record(mm, pos, total, queue_id, flag, queue_offset, phys, sys_flag, born_ts,
  born_host, store_ms, store_host, reconsume, prepared_offset, body, tail, pb): one v1
  record (docs/protocol.md §7.1) packed into `mm` at `pos`, body CRC computed here.
- plan_lmqs(names, cache, topic, bump) -> (offsets, targets, new LMQs) | None: the usual
  multi-dispatch plan (every name a cached LMQ, none the message's topic); inside a batch
  `bump` holds the offsets earlier messages took, and is advanced.
- stage_units(staged, cache, targets, unit) -> int: LmqIndex staging of (name, offset)
  targets; returns the number of new LMQs (offset 0).
- write_units(snapshot, put, prefixes) -> int: staged LMQ units as RocksDB puts in key order.
- recent_slices(chain, offset, max_count, max_bytes, files, file_size, first_no, clmin,
  wrote) -> (slices, bytes): an LMQ's records from the unit lists LmqIndex holds in memory
  (MessageStore.recent_records), as slices of the mapped CommitLog.
- plan_batch_lmqs / stage_batch_lmqs (C only, like split_batch / write_batch): a batch's
  multi-dispatch when every LMQ it names exists, planned and staged in one call each.
"""

from __future__ import annotations

import os

from core.store.speedups_py import (
    crc32,
    encode_props,
    plan_lmqs,
    recent_slices,
    stage_units,
    write_record,
    write_units,
)

__all__ = [
    "NATIVE", "batch_props_have", "crc32", "encode_props", "plan_batch_lmqs", "plan_lmqs", "recent_slices",
    "split_batch",
    "stage_batch_lmqs", "stage_units", "write_batch", "write_record", "write_units",
]

# Batch sends (put_batch.py): C only; without the extension put_batch takes its general
# Python path, which is the reference these are tested against.
split_batch = None
write_batch = None
# A batch's usual multi-dispatch (put_batch.py _plan_batch_lmqs): C only as well; the
# reference is _plan_dicts + _dispatch_native.
plan_batch_lmqs = None
stage_batch_lmqs = None
# s6-fanout: a batch send's DELAY / reserved-property check over the properties only
# (core/broker/processors/send.py); C only, without it the broker searches the whole body.
batch_props_have = None

NATIVE = False
if os.environ.get("LMQ_PURE_PYTHON", "") in ("", "0"):
    try:
        from core._speedups import (  # noqa: F401, F811
            batch_props_have,
            crc32,
            encode_props,
            plan_batch_lmqs,
            plan_lmqs,
            recent_slices,
            split_batch,
            stage_batch_lmqs,
            stage_units,
            write_batch,
            write_record,
            write_units,
        )
    except ImportError:  # not built (no C compiler at install time)
        pass
    else:
        NATIVE = True

# s4-ha: the slave's apply path (core/store/ha/replica.py): C when built, else Python.
from core.store.speedups_py import scan_chunk  # noqa: E402

__all__ += ["scan_chunk"]
SCAN_NATIVE = False
if os.environ.get("LMQ_PURE_PYTHON", "") in ("", "0"):
    try:
        from core._speedups import scan_chunk  # noqa: F811
    except ImportError:
        pass
    else:
        SCAN_NATIVE = True
