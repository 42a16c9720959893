"""`TransactionProducer`: half message, local transaction, END_TRANSACTION (docs/protocol.md §9.4).

1. The message goes out as a half message (``TRAN_MSG=true``, ``PGROUP=<group>``, sysFlag
   PREPARED); the broker keeps it invisible to consumers.
2. ``execute_local(msg, arg)`` runs the application's local transaction and returns a
   `LocalTransactionState`; an exception counts as UNKNOW, a failed half send as ROLLBACK.
3. END_TRANSACTION (one-way) commits (8), rolls back (12) or leaves it unknown (0).
4. For unknown or lost outcomes the broker later sends CHECK_TRANSACTION_STATE with the half
   message; ``check(msg)`` answers and the producer sends END_TRANSACTION with
   ``fromTransactionCheck=true`` to the broker that asked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from core.client.errors import MQClientError
from core.client.instance import ClientInstance
from core.client.model import SendResult, SendStatus
from core.client.producer import Producer, call_maybe_async
from core.common.message import Message, MessageExt
from core.common.msgid import decode_offset_msg_id
from core.common.properties import MessageConst
from core.common.sysflag import MessageSysFlag
from core.remoting.codec import RemotingCommand

log = logging.getLogger(__name__)


class LocalTransactionState(Enum):
    COMMIT_MESSAGE = MessageSysFlag.TRANSACTION_COMMIT_TYPE
    ROLLBACK_MESSAGE = MessageSysFlag.TRANSACTION_ROLLBACK_TYPE
    UNKNOW = MessageSysFlag.TRANSACTION_NOT_TYPE  # sic: Java's name


@dataclass(slots=True)
class TransactionSendResult:
    send_result: SendResult
    local_state: LocalTransactionState

    @property
    def msg_id(self) -> str:
        return self.send_result.msg_id


#: execute_local(msg, arg) -> state (plain or async); check(msg) -> state (plain or async).
LocalExecutor = Callable[[Message, Any], Any]
TransactionChecker = Callable[[MessageExt], Any]


def _as_state(value: Any) -> LocalTransactionState:
    if isinstance(value, LocalTransactionState):
        return value
    if isinstance(value, str):
        return LocalTransactionState[value.upper()]
    return LocalTransactionState.UNKNOW


class TransactionProducer(Producer):
    """A producer whose sends are transactional; see the module docstring."""

    def __init__(self, client: ClientInstance, group: str, *, execute_local: LocalExecutor,
                 check: TransactionChecker, **kwargs: Any) -> None:
        super().__init__(client, group, **kwargs)
        self.execute_local = execute_local
        self.check = check

    async def send_in_transaction(self, msg: Message, arg: Any = None) -> TransactionSendResult:
        """Send `msg` as a half message, run the local transaction, end the transaction."""
        self._validate(msg)
        if msg.delay_level > 0:
            # Java clears the delay of transactional messages.
            msg.delay_level = 0
        msg.properties[MessageConst.TRANSACTION_PREPARED] = "true"
        msg.properties[MessageConst.PRODUCER_GROUP] = self.group
        try:
            result = await self.send(msg)
        finally:
            msg.properties.pop(MessageConst.TRANSACTION_PREPARED, None)
        state = LocalTransactionState.ROLLBACK_MESSAGE
        if result.status is SendStatus.SEND_OK:
            try:
                state = _as_state(await call_maybe_async(self.execute_local, msg, arg))
            except Exception:
                log.exception("local transaction of %s failed; left UNKNOW for the back-check",
                              result.msg_id)
                state = LocalTransactionState.UNKNOW
        try:
            await self._end_transaction(result, state)
        except Exception as exc:
            # The broker's back-check resolves it (docs/protocol.md §9.4); the send itself succeeded.
            log.warning("END_TRANSACTION for %s failed: %r", result.msg_id, exc)
        return TransactionSendResult(result, state)

    async def _end_transaction(self, result: SendResult, state: LocalTransactionState) -> None:
        addr = await self._broker_addr(result.message_queue)
        try:
            _, _, commit_log_offset = decode_offset_msg_id(result.offset_msg_id)
        except ValueError:
            raise MQClientError(f"broker answered an unusable msgId {result.offset_msg_id!r}") from None
        await self.client.api.end_transaction(addr, {
            "producerGroup": self.group,
            "tranStateTableOffset": str(result.queue_offset),
            "commitLogOffset": str(commit_log_offset),
            "commitOrRollback": str(state.value),
            "fromTransactionCheck": "false",
            "msgId": result.msg_id,
            "transactionId": result.transaction_id or result.msg_id,
        })

    async def check_transaction_state(self, addr: str, msg: MessageExt, cmd: RemotingCommand) -> None:
        """Answer a CHECK_TRANSACTION_STATE (docs/protocol.md §5.13) with END_TRANSACTION to `addr`."""
        try:
            state = _as_state(await call_maybe_async(self.check, msg))
        except Exception:
            log.exception("transaction check of %s failed; answering UNKNOW", msg.msg_id)
            state = LocalTransactionState.UNKNOW
        uniq = msg.properties.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or cmd.ext_str("msgId", "")
        ext = {
            "producerGroup": self.group,
            "tranStateTableOffset": cmd.ext_str("tranStateTableOffset", str(msg.queue_offset)),
            "commitLogOffset": cmd.ext_str("commitLogOffset", str(msg.commitlog_offset)),
            "commitOrRollback": str(state.value),
            "fromTransactionCheck": "true",
            "msgId": uniq,
            "transactionId": cmd.ext_str("transactionId") or uniq,
        }
        try:
            await self.client.api.end_transaction(addr, ext, remark="from transaction check")
        except Exception as exc:
            log.warning("END_TRANSACTION after check to %s failed: %r", addr, exc)
