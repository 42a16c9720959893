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
    INT64,
    OFF_QUEUE_OFFSET,
    decode_record,
    encode_host,
    encode_record,
    record_properties,
)
from core.common.message import MessageExt
from core.common.properties import MessageConst, encode_properties

__all__ = ["ADVANCE", "POP_CK", "queue_offset", "read_new", "redelivery_record"]

POP_CK = "POP_CK"

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
    """The record with POP_CK set and RECONSUMETIMES raised (a new copy)."""
    msg: MessageExt = decode_record(buf)
    props = dict(msg.properties)
    props[POP_CK] = handle
    return encode_record(
        topic=msg.topic.encode("utf-8"),
        body=msg.body,
        properties=encode_properties(props).encode("utf-8"),
        queue_id=msg.queue_id,
        flag=msg.flag,
        queue_offset=msg.queue_offset,
        physical_offset=msg.commitlog_offset,
        sys_flag=msg.sys_flag,
        born_timestamp=msg.born_timestamp,
        born_host=encode_host(msg.born_host),
        store_timestamp=msg.store_timestamp,
        store_host=encode_host(msg.store_host),
        reconsume_times=msg.reconsume_times + extra_deliveries,
        prepared_transaction_offset=msg.prepared_transaction_offset,
    )
