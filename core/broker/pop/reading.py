"""What a pop reads from the store (docs/pop.md "Hand-off").

`read_new` gives a pop the messages after its queue's cursor. For an unfiltered LMQ
(an AMQP queue, an MQTT `$share` group) it first asks the store for the records whose
units are still in memory (`MessageStore.recent_records`): a pop woken by the dispatch of
a message (long polling) or close behind the writer takes the record the put just wrote
(offsets known, bytes in the mapped CommitLog) without a store read, without committing
the RocksDB batch early and without reading the units back from RocksDB. Anything else
(a filter, a cursor further behind, a file queue) reads the store as a pull does.
"""

from __future__ import annotations

from core.common.codec import (
    INT16,
    INT32,
    INT64,
    OFF_QUEUE_OFFSET,
    parse_layout,
    record_properties,
)
from core.common.properties import MessageConst
from core.common.sysflag import MessageSysFlag

__all__ = ["ADVANCE", "POP_CK", "queue_offset", "read_new", "redelivery_record"]

POP_CK = "POP_CK"
_CK = POP_CK.encode() + b"\x01"
#: Properties of a record fit a signed 16-bit length.
MAX_PROPERTIES_LENGTH = 32767

# Store statuses after which the cursor may move to nextBeginOffset (nothing there to
# hand out: filtered out, removed, or the cursor was outside the queue).
ADVANCE = frozenset({
    "FOUND", "NO_MATCHED_MESSAGE", "MESSAGE_WAS_REMOVING", "OFFSET_TOO_SMALL",
    "OFFSET_OVERFLOW_BADLY", "OFFSET_FOUND_NULL",
})


def read_new(store, topic: str, qid: int, start: int, need: int, max_bytes: int, filt,
             is_lmq: bool) -> tuple[list, int, int]:
    """Up to `need` messages from offset `start`: ([(offset, record), ...], the offset
    the cursor may move to, the queue's max offset)."""
    if is_lmq and filt is None:
        recent = store.recent_records(topic, start, need, max_bytes)
        if recent is not None:  # the hand-off: no store read
            bufs, max_offset = recent
            return list(enumerate(bufs, start)), start + len(bufs), max_offset
    got = store.get(topic, qid, start, need, max_bytes, filt)
    status = got.status.name
    placed: list = []
    if status == "FOUND":
        # Unfiltered and as many records as offsets read: they are the consecutive
        # offsets from `start` (no need to parse an LMQ record's properties for its
        # offset).
        if filt is None and got.next_begin_offset - start == len(got.buffers):
            placed = list(enumerate(got.buffers, start))
        else:
            placed = [(queue_offset(buf, topic, is_lmq), buf) for buf in got.buffers]
    return placed, (got.next_begin_offset if status in ADVANCE else start), got.max_offset


def queue_offset(buf, topic: str, is_lmq: bool) -> int:
    """The offset of a stored record in `topic` (an LMQ's is in its properties)."""
    if is_lmq:
        props = record_properties(buf)
        names_ = props.get(MessageConst.INNER_MULTI_DISPATCH, "").split(",")
        offsets = props.get(MessageConst.INNER_MULTI_QUEUE_OFFSET, "").split(",")
        return int(offsets[names_.index(topic)])
    return INT64.unpack_from(buf, OFF_QUEUE_OFFSET)[0]


def redelivery_record(buf, handle: str, extra_deliveries: int) -> bytes:
    """The record with POP_CK set and RECONSUMETIMES raised: a new copy of the stored
    octets with those two fields (and the sizes) patched; body, topic and the other
    properties are left as stored."""
    lay = parse_layout(buf)
    start = lay.properties_start
    raw = bytes(buf[start:start + lay.properties_length])
    if _CK in raw:  # a POP_CK of its own (set by a producer): replaced
        raw = b"\x02".join(p for p in raw.split(b"\x02") if p and not p.startswith(_CK))
    props = (raw + b"\x02" if raw else b"") + _CK + handle.encode()
    if len(props) > MAX_PROPERTIES_LENGTH:
        raise ValueError(f"properties of {len(props)} octets with the receipt handle")
    out = bytearray(buf[:start])
    out += props
    INT32.pack_into(out, 0, len(out))
    INT16.pack_into(out, start - 2, len(props))
    at = lay.store_timestamp_pos + (28 if lay.sys_flag & MessageSysFlag.STOREHOST_V6 else 16)
    INT32.pack_into(out, at, INT32.unpack_from(out, at)[0] + extra_deliveries)
    return bytes(out)
