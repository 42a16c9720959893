"""Batched transactional messages, an lmq extension of §9.4 (docs/spark.md, "Exactly once").

A batch send (SEND_BATCH_MESSAGE, or ``m=true``) whose sysflag says TRANSACTION_PREPARED is
stored as ONE half message holding the whole batch body: its properties are the batch-level
ones plus `BATCH_HALF` (the number of sub-messages). Committing it (an ordinary
END_TRANSACTION naming that one half) stores the sub-messages in the real topic and queue
with one batch append, all or nothing, exactly as a batch send would have stored them; a
rollback stores nothing. So a transaction of N rows costs the broker one record and one
request each way instead of N, and N records are never visible apart.

Apache RocketMQ refuses a transactional batch (its clients never send one), so no Apache
request changes meaning. The batch body is checked when it arrives (sizes, no DELAY, at
most the broker's message size, which bounds the work of its commit); `BATCH_HALF` is
reserved: a client setting it on a single message has it removed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.common.codec import BATCH_HEAD, INT16
from core.common.message import InnerMessage, MessageBatch, MessageExt
from core.common.properties import MessageConst, encode_properties
from core.common.sysflag import MessageSysFlag

if TYPE_CHECKING:
    from core.broker.transaction import TransactionalMessageService

__all__ = ["BATCH_HALF", "committed_batch", "prepare_batch"]

#: Property of a half message that holds a whole batch: the number of its sub-messages.
BATCH_HALF = "LMQ_TRAN_BATCH"
_DELAY_MARK = MessageConst.DELAY_TIME_LEVEL.encode() + b"\x01"
#: Properties of the half that are not handed on to the committed sub-messages (each has
#: its own UNIQ_KEY, KEYS and TAGS; the batch is committed, no longer prepared).
_NOT_INHERITED = (MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, MessageConst.KEYS,
                  MessageConst.TAGS, MessageConst.TRANSACTION_PREPARED,
                  MessageConst.WAIT_STORE_MSG_OK, BATCH_HALF)


def count_sub_messages(body: bytes) -> int | str:
    """Number of sub-messages of a batch body (docs/protocol.md §7.7), or why it is refused."""
    n = 0
    pos = 0
    end = len(body)
    head = BATCH_HEAD.size
    while pos < end:
        if pos + head > end:
            return "bad batch body: truncated sub-message header"
        total, _magic, _crc, _flag, blen = BATCH_HEAD.unpack_from(body, pos)
        plen_at = pos + head + blen
        if blen < 0 or total < head + 2 + blen or pos + total > end:
            return "bad batch body: bad sub-message size"
        if INT16.unpack_from(body, plen_at)[0] != total - head - 2 - blen:
            return "bad batch body: bad sub-message properties length"
        pos += total
        n += 1
    if n == 0:
        return "empty batch"
    return n


def prepare_batch(service: TransactionalMessageService, h, queue_id: int, body: bytes,
                  batch_props: dict[str, str], sys_flag: int, born_host: bytes,
                  store_host: bytes) -> InnerMessage | str:
    """The half message of a prepared batch send (the send header `h`, its inflated body and
    batch-level properties), or why it is refused."""
    if _DELAY_MARK in body or MessageConst.DELAY_TIME_LEVEL in batch_props:
        return "batch message does not support delay"
    n = count_sub_messages(body)
    if isinstance(n, str):
        return n
    props = dict(batch_props)
    props[BATCH_HALF] = str(n)
    props[MessageConst.TRANSACTION_PREPARED] = "true"
    inner = InnerMessage(h.topic, body, queue_id, h.flag, props,
                         sys_flag & ~MessageSysFlag.COMPRESSED, h.born_timestamp, born_host,
                         store_host, h.reconsume_times)
    service.prepare(inner, batch=True)
    return inner


def committed_batch(half: MessageExt, store_host: bytes) -> MessageBatch | None:
    """What committing a batch half stores: its sub-messages in the real topic and queue,
    each with its own properties followed by the half's (minus `_NOT_INHERITED`). None when
    the half names no real topic."""
    topic = half.properties.get(MessageConst.REAL_TOPIC)
    qid = half.properties.get(MessageConst.REAL_QUEUE_ID)
    if not topic or not qid or not qid.isdigit():
        return None
    props = {k: v for k, v in half.properties.items() if k not in _NOT_INHERITED}
    return MessageBatch(
        topic, int(qid), half.body, encode_properties(props),
        MessageSysFlag.reset_transaction_value(half.sys_flag,
                                               MessageSysFlag.TRANSACTION_COMMIT_TYPE),
        half.born_timestamp, _host_bytes(half), store_host, half.reconsume_times)


def _host_bytes(half: MessageExt) -> bytes:
    from core.common.codec import encode_host
    return encode_host(half.born_host)
