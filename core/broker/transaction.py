"""Transactional messages: half messages, END_TRANSACTION, and the back-check loop
(docs/protocol.md §9.4, §5.12, §5.13).

* `prepare(inner)` turns a `TRAN_MSG=true` send into a half message: topic
  `RMQ_SYS_TRANS_HALF_TOPIC` queue 0, real destination in `REAL_TOPIC`/`REAL_QID`,
  transaction bits of the sysflag cleared. Consumers never see it.
* A prepared *batch* send is kept as one half message holding the whole batch, and its
  commit appends all of the batch's messages at once (an lmq extension,
  core/broker/transaction_batch.py).
* `end_transaction(...)` commits (re-stores the half message under its real topic, sysflag
  COMMIT, PREPARED TRANSACTION OFFSET = half offset) or rolls back (nothing stored); both
  then write an op record to `RMQ_SYS_TRANS_OP_HALF_TOPIC` (same queue id, tag `d`, body =
  the half message's queue offset as decimal text) that marks the half message resolved.
* `run()` checks every `transaction_check_interval_s` for half messages older than
  `transaction_timeout_s` (first check: their `CHECK_IMMUNITY_TIME_IN_SECONDS` when set)
  without an op record. Each such message is stored again at the end of the half queue with
  `TRANSACTION_CHECK_TIMES` + 1 and the producer group (`PGROUP`) is asked about the new
  copy with CHECK_TRANSACTION_STATE (one-way; body = the record with its real topic and
  queue). After `transaction_check_max` checks the message moves to
  `TRANS_CHECK_MAX_TIME_TOPIC` instead.

Progress of the check loop is a cursor per half queue: every half offset below it is
settled (resolved by an op record, copied forward, or moved away), so the loop only
remembers op records for offsets at or above it. Op records are read once, in order,
from an op cursor. Both cursors are persisted atomically in
`<data_dir>/config/transactionCheckOffset.json`; the op cursor is saved at the oldest op
still needed, so a restart re-reads just the ops it forgot. Half messages themselves are
ordinary records in the store and survive a crash.

Duplicates: like Java, a late END_TRANSACTION for an old copy of a half message and a
later answer for its newer copy would commit twice. A bounded in-memory table of resolved
transactions (by UNIQ_KEY) catches that case while the broker runs.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

import trio

from core.broker.cursor_file import CursorFile
from core.broker.message_util import (
    clear_property,
    inner_from_ext,
    put_property,
    real_destination,
)
from core.broker.metadata import encode_json, read_json
from core.broker.transaction_batch import BATCH_HALF, committed_batch
from core.common.codec import RecordError, decode_record, encode_host, encode_record
from core.common.message import InnerMessage, MessageExt
from core.common.names import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from core.common.properties import MessageConst, encode_properties
from core.common.sysflag import MessageSysFlag, PermName
from core.remoting import RemotingCommand, RemotingError, RequestCode, ResponseCode

if TYPE_CHECKING:
    from core.broker.controller import BrokerController

log = logging.getLogger(__name__)

__all__ = ["TransactionalMessageService", "REMOVE_TAG"]

#: Tag of op records (Java's TransactionalMessageUtil.REMOVETAG).
REMOVE_TAG = "d"
#: Consume-queue units read per call while walking the half and op queues.
_SCAN_BATCH = 64
#: Persist the cursors at least this often during one long check pass.
_PERSIST_EVERY = 256
#: Default size of the resolved-transaction table (`transaction_resolved_cache_size`).
DEFAULT_RESOLVED_CACHE_SIZE = 100_000

_STORED = frozenset({"OK", "FLUSH_DISK_TIMEOUT", "FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE"})
_PUT_ERROR_CODES = {
    "MESSAGE_ILLEGAL": ResponseCode.MESSAGE_ILLEGAL,
    "PROPERTIES_SIZE_EXCEEDED": ResponseCode.MESSAGE_ILLEGAL,
    "SERVICE_NOT_AVAILABLE": ResponseCode.SERVICE_NOT_AVAILABLE,
}
_RW = PermName.READ | PermName.WRITE


def _now_ms() -> int:
    return int(time.time() * 1000)


def _status_name(result) -> str:
    return getattr(result.status, "name", str(result.status))


class TransactionalMessageService(CursorFile):
    """Half/op topics, END_TRANSACTION semantics and the back-check loop (docs/protocol.md §9.4)."""

    FILE_NAME = "transactionCheckOffset.json"

    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        config = broker.config
        self.timeout_ms = int(float(config.transaction_timeout_s) * 1000)
        self.check_max = int(config.transaction_check_max)
        self.check_interval_s = float(config.transaction_check_interval_s)
        self._open_cursor_file(os.path.join(config.data_dir, "config", self.FILE_NAME))
        #: half queue id -> first half offset not yet settled (persisted).
        self.half_offset: dict[int, int] = {}
        #: half queue id -> next op-queue offset to read.
        self.op_offset: dict[int, int] = {}
        # half queue id -> {half offset at/after the cursor that has an op: op offset}
        self._removed: dict[int, dict[int, int]] = {}
        self._resolved: OrderedDict[str, None] = OrderedDict()
        self._resolved_max = int(
            getattr(config, "transaction_resolved_cache_size", DEFAULT_RESOLVED_CACHE_SIZE)
        )
        self._check_lock = trio.Lock()
        # counters for runtime info and tests
        self.checks_sent = 0
        self.commits = 0
        self.rollbacks = 0
        self.discarded = 0

    # ------------------------------------------------------------------ persistence
    def load(self) -> None:
        """Read the check cursors (a missing file = start from the queues' beginnings)."""
        data = read_json(self.path, {}) or {}
        if not isinstance(data, dict):
            return
        for key, table in (("halfOffset", self.half_offset), ("opOffset", self.op_offset)):
            for qid, value in (data.get(key) or {}).items():
                try:
                    table[int(qid)] = max(0, int(value))
                except (TypeError, ValueError):
                    continue

    def _snapshot(self) -> bytes:
        """The file's content, encoded on the event loop (where the tables change)."""
        ops = {}
        for qid, offset in self.op_offset.items():
            pending = self._removed.get(qid)
            # Resume at the oldest op still needed: its half offset is not settled.
            ops[str(qid)] = min(pending.values(), default=offset) if pending else offset
        data = {
            "halfOffset": {str(q): o for q, o in sorted(self.half_offset.items())},
            "opOffset": dict(sorted(ops.items())),
        }
        self._dirty = False
        return encode_json(data)

    # ------------------------------------------------------------------ send path
    def prepare(self, inner: InnerMessage, batch: bool = False) -> None:
        """Rewrite a `TRAN_MSG=true` message into a half message, in place (docs/protocol.md
        §9.4); `batch`: it holds a whole prepared batch (transaction_batch.py)."""
        if not batch:
            inner.properties.pop(BATCH_HALF, None)  # reserved: only the broker sets it
        put_property(inner, MessageConst.REAL_TOPIC, inner.topic)
        put_property(inner, MessageConst.REAL_QUEUE_ID, inner.queue_id)
        inner.sys_flag = MessageSysFlag.reset_transaction_value(
            inner.sys_flag, MessageSysFlag.TRANSACTION_NOT_TYPE
        )
        inner.topic = TRANS_HALF_TOPIC
        inner.queue_id = 0
        self._ensure_topic(TRANS_HALF_TOPIC)

    def _ensure_topic(self, topic: str) -> None:
        tcm = self.broker.topic_config_manager
        if tcm.get(topic) is None:
            tcm.create_topic_in_send_back_method(topic, 1, _RW)

    # ------------------------------------------------------------------ END_TRANSACTION
    async def end_transaction(
        self,
        *,
        producer_group: str,
        tran_state_table_offset: int,
        commit_log_offset: int,
        commit_or_rollback: int,
    ) -> tuple[int, str | None]:
        """Commit or roll back the half message at `commit_log_offset` (docs/protocol.md §5.12).

        Returns (response code, remark). `commit_or_rollback` must be
        TRANSACTION_COMMIT_TYPE (8) or TRANSACTION_ROLLBACK_TYPE (12).
        """
        half = self.broker.store.look_message(commit_log_offset)
        if half is None or half.topic != TRANS_HALF_TOPIC:
            return ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed"
        if half.properties.get(MessageConst.PRODUCER_GROUP) != producer_group:
            return ResponseCode.SYSTEM_ERROR, "The producer group wrong"
        if half.queue_offset != tran_state_table_offset:
            return ResponseCode.SYSTEM_ERROR, "The transaction state table offset wrong"
        if half.commitlog_offset != commit_log_offset:
            return ResponseCode.SYSTEM_ERROR, "The commit log offset wrong"

        key = half.properties.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        if key is not None and key in self._resolved:
            # Already committed or rolled back through another copy: settle this copy
            # too, store nothing again.
            await self._write_op(half)
            return ResponseCode.SUCCESS, None
        self._mark_resolved(key)

        if commit_or_rollback == MessageSysFlag.TRANSACTION_COMMIT_TYPE:
            if BATCH_HALF in half.properties:  # a whole batch, one append (transaction_batch)
                inner = committed_batch(half, self.broker.store_host)
                put = self.broker.put_messages
            else:
                inner = self._final_message(half)
                put = self.broker.put_message
            if inner is None:
                self._unmark_resolved(key)
                return ResponseCode.SYSTEM_ERROR, "The half message has no REAL_TOPIC"
            try:
                result = await put(inner)
            except BaseException:
                self._unmark_resolved(key)
                raise
            status = _status_name(result)
            if status not in _STORED:
                self._unmark_resolved(key)
                code = _PUT_ERROR_CODES.get(status, ResponseCode.SYSTEM_ERROR)
                return code, f"commit of the transaction failed: {status}"
            self.commits += 1
        else:
            self.rollbacks += 1
        await self._write_op(half)
        return ResponseCode.SUCCESS, None

    def _final_message(self, half: MessageExt) -> InnerMessage | None:
        """The committed message: real topic/queue, sysflag COMMIT, TRAN_MSG removed."""
        dest = real_destination(half.properties)
        if dest is None:
            return None
        inner = inner_from_ext(half, topic=dest[0], queue_id=dest[1],
                               store_host=self.broker.store_host)
        clear_property(inner, MessageConst.TRANSACTION_PREPARED)
        inner.sys_flag = MessageSysFlag.reset_transaction_value(
            half.sys_flag, MessageSysFlag.TRANSACTION_COMMIT_TYPE
        )
        inner.prepared_transaction_offset = half.commitlog_offset
        if self.broker.schedule_service is not None:
            # Java's CommitLog delays committed transactional messages too (docs/protocol.md
            # §9.2): a DELAY level, or a delivery time still ahead (schedule.py "Timer messages").
            self.broker.schedule_service.hold(inner)
        return inner

    async def _write_op(self, half: MessageExt) -> None:
        """Append the op record that marks `half` resolved."""
        self._ensure_topic(TRANS_OP_HALF_TOPIC)
        now = _now_ms()
        op = InnerMessage(
            topic=TRANS_OP_HALF_TOPIC,
            body=str(half.queue_offset).encode("ascii"),
            queue_id=half.queue_id,
            properties={MessageConst.TAGS: REMOVE_TAG},
            born_timestamp=now,
            born_host=self.broker.store_host,
            store_host=self.broker.store_host,
        )
        result = await self.broker.put_message(op)
        if _status_name(result) not in _STORED:
            # The half message stays unresolved and will be checked again.
            log.warning("op record for half offset %d not stored: %s",
                        half.queue_offset, _status_name(result))

    def _mark_resolved(self, key: str | None) -> None:
        if key is None or self._resolved_max <= 0:
            return
        self._resolved[key] = None
        self._resolved.move_to_end(key)
        while len(self._resolved) > self._resolved_max:
            self._resolved.popitem(last=False)

    def _unmark_resolved(self, key: str | None) -> None:
        if key is not None:
            self._resolved.pop(key, None)

    # ------------------------------------------------------------------ check loop
    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run a check pass every `transaction_check_interval_s` until cancelled."""
        task_status.started()
        try:
            while True:
                await trio.sleep(self.check_interval_s)
                try:
                    await self.check_once()
                except Exception:  # keep checking after a bug or a store hiccup
                    log.exception("transaction check pass failed")
        finally:
            self._persist_at_shutdown()

    async def check_once(self, now_ms: int | None = None) -> int:
        """One pass over every half queue; returns the number of checks sent."""
        async with self._check_lock:
            now = _now_ms() if now_ms is None else now_ms
            sent = 0
            store = self.broker.store
            queue_ids = set(store.queue_ids(TRANS_HALF_TOPIC)) | set(self.half_offset)
            for qid in sorted(queue_ids):
                sent += await self._check_queue(qid, now)
            if self._dirty:
                await self._persist_in_thread()
            return sent

    def _scan_ops(self, qid: int) -> None:
        """Read new op records of half queue `qid` into the removed table."""
        store = self.broker.store
        offset = max(self.op_offset.get(qid, 0), store.min_offset(TRANS_OP_HALF_TOPIC, qid))
        op_max = store.max_offset(TRANS_OP_HALF_TOPIC, qid)
        half_cursor = self.half_offset.get(qid, 0)
        removed = self._removed.setdefault(qid, {})
        while offset < op_max:
            units = store.units(TRANS_OP_HALF_TOPIC, qid, offset, _SCAN_BATCH)
            if not units:
                break
            for phys, _size, _tag in units:
                for half_off in self._op_targets(phys):
                    if half_off >= half_cursor:
                        removed.setdefault(half_off, offset)
                offset += 1
        if self.op_offset.get(qid) != offset:
            self.op_offset[qid] = offset
            self._dirty = True

    def _op_targets(self, phys: int) -> list[int]:
        record = self.broker.store.read_record(phys)
        if record is None:
            return []
        try:
            msg = decode_record(record)
        except RecordError:
            return []
        if msg.properties.get(MessageConst.TAGS) != REMOVE_TAG:
            return []
        out = []
        # Java 5 may batch several offsets in one op body, comma separated.
        for part in msg.body.decode("ascii", "replace").split(","):
            part = part.strip()
            if part.isdigit():
                out.append(int(part))
        return out

    async def _check_queue(self, qid: int, now: int) -> int:
        store = self.broker.store
        self._scan_ops(qid)
        removed = self._removed.setdefault(qid, {})
        half_max = store.max_offset(TRANS_HALF_TOPIC, qid)
        start = self.half_offset.get(qid, 0)
        offset = min(max(start, store.min_offset(TRANS_HALF_TOPIC, qid)), half_max)
        if offset != start:
            self._set_half_offset(qid, offset)
        sent = 0
        steps = 0
        while offset < half_max:
            units = store.units(TRANS_HALF_TOPIC, qid, offset, _SCAN_BATCH)
            if not units:
                break
            for phys, _size, _tag in units:
                if removed.pop(offset, None) is None:
                    msg = store.look_message(phys)
                    if msg is not None:
                        if self._wait_ms(msg, now) > 0:
                            if now - msg.store_timestamp < self.timeout_ms:
                                return sent  # younger messages follow: wait for them
                            # Its own immunity is longer than the others' timeout: move
                            # it to the end so it does not hold up the queue (Java too).
                            copied = await self._copy_forward(msg, check_times=None)
                            outcome = "retry" if copied == "retry" else "requeued"
                        else:
                            outcome = await self._check_message(msg)
                        if outcome == "retry":
                            return sent
                        sent += outcome == "sent"
                offset += 1
                self._set_half_offset(qid, offset)
                steps += 1
                if steps % _PERSIST_EVERY == 0:
                    await self._persist_in_thread()
        # Entries below the cursor can never match again.
        for stale in [h for h in removed if h < offset]:
            del removed[stale]
        return sent

    def _set_half_offset(self, qid: int, offset: int) -> None:
        self.half_offset[qid] = offset
        self._dirty = True

    def _wait_ms(self, msg: MessageExt, now: int) -> int:
        """How long `msg` must still wait before its check (<= 0: check it now).

        The first check waits for the producer's CHECK_IMMUNITY_TIME_IN_SECONDS from the
        message's birth when set, else `transaction_timeout_s`; every later check waits
        `transaction_timeout_s` from the previous one (= the store time of the copy).
        """
        props = msg.properties
        if props.get(MessageConst.TRANSACTION_CHECK_TIMES, "0") == "0":
            raw = props.get(MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS)
            try:
                immunity_s = int(raw) if raw else -1
            except ValueError:
                immunity_s = -1
            if immunity_s > 0:
                return immunity_s * 1000 - (now - msg.born_timestamp)
        return self.timeout_ms - (now - msg.store_timestamp)

    async def _copy_forward(
        self, msg: MessageExt, check_times: int | None
    ) -> MessageExt | str:
        """Store `msg` again at the end of its half queue (with TRANSACTION_CHECK_TIMES =
        `check_times` unless None); returns the new record, or "retry"."""
        copy = inner_from_ext(msg, store_host=self.broker.store_host)
        if check_times is not None:
            put_property(copy, MessageConst.TRANSACTION_CHECK_TIMES, check_times)
        result = await self.broker.put_message(copy)
        if _status_name(result) not in _STORED:
            log.warning("half message %d could not be stored again: %s",
                        msg.commitlog_offset, _status_name(result))
            return "retry"
        record = self.broker.store.read_record(result.physical_offset)
        return "retry" if record is None else decode_record(record)

    async def _check_message(self, msg: MessageExt) -> str:
        """Settle one unresolved, timed-out half message: "sent", "moved", "resolved",
        "nochannel" or "retry" (store refused; try again next pass)."""
        props = msg.properties
        key = props.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        if key is not None and key in self._resolved:
            return "resolved"  # an older copy was committed/rolled back meanwhile
        try:
            times = int(props.get(MessageConst.TRANSACTION_CHECK_TIMES, "0"))
        except ValueError:
            times = 0
        group = props.get(MessageConst.PRODUCER_GROUP)
        if times >= self.check_max or not group:
            return await self._discard(msg)
        # Store the next copy first: the check must name a record the producer's answer
        # can resolve, and the counter must survive a restart.
        new_msg = await self._copy_forward(msg, check_times=times + 1)
        if new_msg == "retry":
            return "retry"
        conns = self.broker.producer_manager.connections_of_group(group)
        if not conns:
            log.debug("no live producer of group %s to check transaction", group)
            return "nochannel"
        await self._send_check(random.choice(conns), new_msg)
        return "sent"

    async def _discard(self, msg: MessageExt) -> str:
        """Move a half message checked too often to TRANS_CHECK_MAX_TIME_TOPIC."""
        self._ensure_topic(TRANS_CHECK_MAX_TIME_TOPIC)
        inner = inner_from_ext(msg, topic=TRANS_CHECK_MAX_TIME_TOPIC, queue_id=0,
                               store_host=self.broker.store_host)
        result = await self.broker.put_message(inner)
        if _status_name(result) not in _STORED:
            return "retry"
        self.discarded += 1
        log.info("half message %d of group %s dropped after %d checks",
                 msg.commitlog_offset, msg.properties.get(MessageConst.PRODUCER_GROUP),
                 self.check_max)
        return "moved"

    async def _send_check(self, conn, half: MessageExt) -> None:
        """CHECK_TRANSACTION_STATE (docs/protocol.md §5.13) about `half` to one producer connection."""
        uniq = half.properties.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "")
        ext = {
            "tranStateTableOffset": str(half.queue_offset),
            "commitLogOffset": str(half.commitlog_offset),
            "msgId": uniq,
            "transactionId": uniq,
            "offsetMsgId": half.offset_msg_id,
        }
        cmd = RemotingCommand.request(
            RequestCode.CHECK_TRANSACTION_STATE, ext, check_body(half)
        )
        try:
            await conn.invoke_oneway(cmd)
            self.checks_sent += 1
        except RemotingError as exc:
            log.debug("transaction check to %r failed: %r", conn, exc)


def check_body(half: MessageExt) -> bytes:
    """The half message as a stored record with its real topic and queue (docs/protocol.md §5.13)."""
    topic, queue_id = real_destination(half.properties) or (half.topic, half.queue_id)
    return encode_record(
        topic=topic.encode("utf-8"),
        body=half.body,
        properties=encode_properties(half.properties).encode("utf-8"),
        queue_id=queue_id,
        flag=half.flag,
        queue_offset=half.queue_offset,
        physical_offset=half.commitlog_offset,
        sys_flag=half.sys_flag,
        born_timestamp=half.born_timestamp,
        born_host=encode_host(half.born_host),
        store_timestamp=half.store_timestamp,
        store_host=encode_host(half.store_host),
        reconsume_times=half.reconsume_times,
        prepared_transaction_offset=half.prepared_transaction_offset,
    )
