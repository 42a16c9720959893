"""END_TRANSACTION (37): a producer commits or rolls back a half message
(docs/protocol.md §5.12, §9.4); the work is done by `broker.transaction_service`.

Producers send it one-way. Java answers nothing for an "unknown" (0) state and nothing at
all to a one-way request; the C++ client's one-way frames arrive without the one-way bit
(docs/protocol.md §1.5), so they get an answer, which that client drops.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from core.common.sysflag import MessageSysFlag
from core.remoting import ProcessorTable, RemotingCommand, RequestCode, ResponseCode

if TYPE_CHECKING:
    from core.broker.controller import BrokerController

__all__ = ["register"]

log = logging.getLogger(__name__)

_DECISIONS = (MessageSysFlag.TRANSACTION_COMMIT_TYPE, MessageSysFlag.TRANSACTION_ROLLBACK_TYPE)


def register(table: ProcessorTable, broker: BrokerController) -> None:
    """Register the END_TRANSACTION handler of `broker` in `table`."""

    async def handle(ctx, cmd: RemotingCommand) -> RemotingCommand | None:
        return await end_transaction(broker, cmd)

    # Not inline: a commit re-stores the message and may wait for a SYNC_FLUSH.
    table.register(RequestCode.END_TRANSACTION, handle, inline=False)


async def end_transaction(broker, cmd: RemotingCommand) -> RemotingCommand | None:
    """Handle one END_TRANSACTION request (docs/protocol.md §5.12)."""
    group = cmd.ext_str("producerGroup", required=True)
    table_offset = cmd.ext_int("tranStateTableOffset", required=True)
    commit_log_offset = cmd.ext_int("commitLogOffset", required=True)
    decision = cmd.ext_int("commitOrRollback", required=True)
    if getattr(broker, "ha_link", None) is None and getattr(broker.config, "broker_id", 0) != 0:
        return cmd.make_response(
            ResponseCode.SLAVE_NOT_AVAILABLE, "slave broker does not support transactions"
        )
    if decision not in _DECISIONS:
        # 0 = unknown: the broker keeps the half message and will check it (docs/protocol.md §9.4).
        if cmd.ext_bool("fromTransactionCheck", False):
            log.debug("producer %s: transaction at %s still unknown", group, commit_log_offset)
        return None
    code, remark = await broker.transaction_service.end_transaction(
        producer_group=group,
        tran_state_table_offset=table_offset,
        commit_log_offset=commit_log_offset,
        commit_or_rollback=decision,
    )
    return cmd.make_response(code, remark)
