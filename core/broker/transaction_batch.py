"""Batched transactional messages, an lmq extension of §9.4 (docs/spark.md, "Exactly once").

* A batch send (SEND_BATCH_MESSAGE or ``m=true``) whose sysflag says
  TRANSACTION_PREPARED stores every sub-message as a half message: they land next to each
  other in `RMQ_SYS_TRANS_HALF_TOPIC` queue 0 (consecutive half offsets), each with the
  batch's real topic and queue in `REAL_TOPIC`/`REAL_QID`. Apache RocketMQ refuses such a
  batch (its clients never send one), so no Apache request changes meaning.
* An END_TRANSACTION with the extra header field ``halfCount`` = N (> 1) ends the N half
  messages at half offsets ``tranStateTableOffset .. +N-1``; ``commitLogOffset`` must be the
  first one's, as for a single half. All are checked before anything is stored (group,
  offsets); a commit re-stores them with one batch append per destination queue; one op
  record lists all their offsets (comma-separated, the form Java 5 writes too). Without
  ``halfCount`` END_TRANSACTION is the Apache request, unchanged.

N is capped by `transaction_end_batch_max` (default `DEFAULT_END_BATCH_MAX`): the halves are
read and decoded on the event loop, so one request's work stays bounded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from core.broker.message_util import delay_level
from core.common.message import InnerMessage, MessageExt
from core.common.names import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from core.common.properties import MessageConst
from core.common.sysflag import MessageSysFlag
from core.remoting import ResponseCode

if TYPE_CHECKING:
    from core.broker.transaction import TransactionalMessageService

__all__ = ["DEFAULT_END_BATCH_MAX", "end_batch", "prepare_batch"]

#: Default of `transaction_end_batch_max`: half messages one batched END_TRANSACTION ends.
DEFAULT_END_BATCH_MAX = 1024
#: Halves decoded between two checkpoints of the event loop.
_YIELD_EVERY = 128


def end_batch_max(service: TransactionalMessageService) -> int:
    return int(getattr(service.broker.config, "transaction_end_batch_max", DEFAULT_END_BATCH_MAX))


def prepare_batch(service: TransactionalMessageService, topic: str, queue_id: int,
                  batch_props: dict[str, str], sys_flag: int) -> tuple[str, int, int]:
    """Turn a prepared batch send into half messages: adds the real destination to the
    batch-level properties (the store appends them to every sub-message) and returns the
    (topic, queue id, sysflag) to store the batch under."""
    batch_props[MessageConst.REAL_TOPIC] = topic
    batch_props[MessageConst.REAL_QUEUE_ID] = str(queue_id)
    batch_props[MessageConst.TRANSACTION_PREPARED] = "true"
    service._ensure_topic(TRANS_HALF_TOPIC)
    return TRANS_HALF_TOPIC, 0, MessageSysFlag.reset_transaction_value(
        sys_flag, MessageSysFlag.TRANSACTION_NOT_TYPE)


async def _load(service, group: str, first: int, commit_log_offset: int,
                count: int) -> list[MessageExt] | tuple[int, str]:
    """The `count` half messages from half offset `first`, or (code, remark)."""
    store = service.broker.store
    units = store.units(TRANS_HALF_TOPIC, 0, first, count)
    if len(units) != count or units[0][0] != commit_log_offset:
        return ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed"
    halves = []
    for i, (phys, _size, _tag) in enumerate(units):
        half = store.look_message(phys)
        if half is None or half.topic != TRANS_HALF_TOPIC or half.queue_offset != first + i:
            return ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed"
        if half.properties.get(MessageConst.PRODUCER_GROUP) != group:
            return ResponseCode.SYSTEM_ERROR, "The producer group wrong"
        halves.append(half)
        if i % _YIELD_EVERY == _YIELD_EVERY - 1:
            await trio.sleep(0)
    return halves


async def end_batch(service: TransactionalMessageService, *, producer_group: str,
                    tran_state_table_offset: int, commit_log_offset: int, count: int,
                    commit_or_rollback: int) -> tuple[int, str | None]:
    """Commit or roll back `count` consecutive half messages (see the module docstring)."""
    limit = end_batch_max(service)
    if count > limit:
        return ResponseCode.MESSAGE_ILLEGAL, (
            f"halfCount {count} over the limit {limit} (transaction_end_batch_max)")
    loaded = await _load(service, producer_group, tran_state_table_offset,
                         commit_log_offset, count)
    if isinstance(loaded, tuple):
        return loaded
    halves = loaded
    uniq = MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX
    # Halves already committed or rolled back through another copy are settled, not stored.
    pending = [h for h in halves if h.properties.get(uniq) not in service._resolved]
    keys = [h.properties.get(uniq) for h in pending]
    for key in keys:
        service._mark_resolved(key)
    if commit_or_rollback == MessageSysFlag.TRANSACTION_COMMIT_TYPE:
        stored, failed = await _store_committed(service, pending)
        if failed is not None:
            for key in keys[stored:]:  # runs stored before the failure stay committed
                service._unmark_resolved(key)
            return failed
        service.commits += len(pending)
    else:
        service.rollbacks += len(pending)
    await _write_ops(service, halves)
    return ResponseCode.SUCCESS, None


async def _store_committed(service, pending: list[MessageExt]
                           ) -> tuple[int, tuple[int, str] | None]:
    """Re-store the committed messages: one batch append per run of the same destination
    queue (a delayed one alone). Returns (messages stored, None) or, when the store refused
    a run, (messages stored before it, (code, remark))."""
    from core.broker.transaction import _PUT_ERROR_CODES, _STORED, _status_name

    runs: list[list[InnerMessage]] = []
    for half in pending:
        inner = service._final_message(half)
        if inner is None:
            return 0, (ResponseCode.SYSTEM_ERROR, "The half message has no REAL_TOPIC")
        alone = delay_level(inner.properties) > 0
        last = runs[-1][0] if runs else None
        if last is not None and not alone and last.topic == inner.topic \
                and last.queue_id == inner.queue_id and delay_level(last.properties) == 0:
            runs[-1].append(inner)
        else:
            runs.append([inner])
    broker = service.broker
    stored = 0
    for run in runs:
        result = await (broker.put_message(run[0]) if len(run) == 1
                        else broker.put_messages(run))
        status = _status_name(result)
        if status not in _STORED:
            return stored, (_PUT_ERROR_CODES.get(status, ResponseCode.SYSTEM_ERROR),
                            f"commit of the transaction failed: {status}")
        stored += len(run)
    return stored, None


async def _write_ops(service, halves: list[MessageExt]) -> None:
    """One op record naming every half offset (the check loop reads comma-separated ones)."""
    from core.broker.transaction import _STORED, REMOVE_TAG, _now_ms, _status_name, log

    service._ensure_topic(TRANS_OP_HALF_TOPIC)
    broker = service.broker
    now = _now_ms()
    op = InnerMessage(
        topic=TRANS_OP_HALF_TOPIC,
        body=",".join(str(h.queue_offset) for h in halves).encode("ascii"),
        queue_id=halves[0].queue_id,
        properties={MessageConst.TAGS: REMOVE_TAG},
        born_timestamp=now, born_host=broker.store_host, store_host=broker.store_host,
    )
    result = await broker.put_message(op)
    if _status_name(result) not in _STORED:
        log.warning("op record for %d half offsets from %d not stored: %s", len(halves),
                    halves[0].queue_offset, _status_name(result))
