"""Helpers for the broker services that re-store messages: build an `InnerMessage` from a
stored record or a `MessageExt`, and edit its properties.

The delay service (docs/protocol.md §9.2), send-back (docs/protocol.md §5.10) and transactions (docs/protocol.md §9.4) all read a stored
message and append a changed copy as a new record. The copy keeps the body exactly as
stored (compressed bytes and the COMPRESSED sysflag bit included), flag, sysflag, born
timestamp/host, reconsume times and every property; the caller then changes topic, queue
and the few properties its step is about.
"""

from __future__ import annotations

from core.common.codec import decode_record, encode_host
from core.common.message import InnerMessage, MessageExt
from core.common.properties import MessageConst

__all__ = [
    "clear_property",
    "delay_level",
    "inner_from_ext",
    "inner_from_record",
    "put_property",
    "real_destination",
]


def inner_from_ext(
    msg: MessageExt,
    *,
    topic: str | None = None,
    queue_id: int | None = None,
    store_host: bytes | None = None,
) -> InnerMessage:
    """A copy of a stored message, ready to be appended again.

    Properties are copied into a new dict, so edits do not touch `msg`. `store_host`
    (8-byte encoding) defaults to the host stored in `msg`; the broker passes its own
    advertised address so STOREHOST stays reachable (docs/protocol.md §5.1 step 5). `tags_code` is left
    None (the store hashes TAGS); the delay service sets it to the delivery time.
    """
    return InnerMessage(
        topic=msg.topic if topic is None else topic,
        body=msg.body,
        queue_id=msg.queue_id if queue_id is None else queue_id,
        flag=msg.flag,
        properties=dict(msg.properties),
        sys_flag=msg.sys_flag,
        born_timestamp=msg.born_timestamp,
        born_host=encode_host(msg.born_host),
        store_host=encode_host(msg.store_host) if store_host is None else store_host,
        reconsume_times=msg.reconsume_times,
        prepared_transaction_offset=0,
    )


def inner_from_record(
    record: bytes | memoryview,
    *,
    topic: str | None = None,
    queue_id: int | None = None,
    store_host: bytes | None = None,
) -> InnerMessage:
    """`inner_from_ext` of the record at the start of `record` (as `store.read_record`
    returns it). Raises `core.common.codec.RecordError` when the bytes are not a record."""
    return inner_from_ext(
        decode_record(record), topic=topic, queue_id=queue_id, store_host=store_host
    )


def put_property(inner: InnerMessage, key: str, value: str | int) -> None:
    """Set one property (values are stored as text)."""
    inner.properties[key] = str(value)


def clear_property(inner: InnerMessage, key: str) -> str | None:
    """Remove one property; return its old value (None when it was not set)."""
    return inner.properties.pop(key, None)


def delay_level(properties: dict[str, str]) -> int:
    """The DELAY property as an int; 0 when absent or not a number (Java ignores junk)."""
    raw = properties.get(MessageConst.DELAY_TIME_LEVEL)
    if not raw:
        return 0
    try:
        return int(raw)
    except ValueError:
        return 0


def real_destination(properties: dict[str, str]) -> tuple[str, int] | None:
    """(REAL_TOPIC, REAL_QID) of a scheduled or half message; None when missing/invalid."""
    topic = properties.get(MessageConst.REAL_TOPIC)
    qid = properties.get(MessageConst.REAL_QUEUE_ID)
    if not topic or qid is None:
        return None
    try:
        return topic, int(qid)
    except ValueError:
        return None
