"""LOCK_BATCH_MQ (41) / UNLOCK_BATCH_MQ (42): queue locks of orderly consumers
(docs/protocol.md §5.11, §6.4).

Request body: `{"consumerGroup", "clientId", "mqSet": [MessageQueue, ...]}`. LOCK answers
0 with `{"lockOKMQSet": [...]}`, the requested queues this client now holds; UNLOCK
answers 0 without a body. A body that is not such an object gets SYSTEM_ERROR.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from core.broker.lock_manager import MessageQueue
from core.remoting import ProcessorTable, RemotingCommand, RequestCode, ResponseCode

if TYPE_CHECKING:
    from core.broker.controller import BrokerController

__all__ = ["register", "parse_lock_body"]


class _BadBody(ValueError):
    pass


def parse_lock_body(body: bytes) -> tuple[str, str, list[MessageQueue]]:
    """(consumerGroup, clientId, mqSet) of a Lock/UnlockBatchRequestBody."""
    try:
        data: Any = json.loads(body)
    except (ValueError, RecursionError):
        raise _BadBody("request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise _BadBody("request body is not a JSON object")
    group = data.get("consumerGroup")
    client_id = data.get("clientId")
    if not isinstance(group, str) or not group:
        raise _BadBody("consumerGroup is missing")
    if not isinstance(client_id, str) or not client_id:
        raise _BadBody("clientId is missing")
    raw = data.get("mqSet") or []
    if not isinstance(raw, list):
        raise _BadBody("mqSet is not a list")
    try:
        mqs = [MessageQueue.from_json(item) for item in raw]
    except (TypeError, ValueError) as exc:
        raise _BadBody(f"bad MessageQueue in mqSet: {exc}") from None
    return group, client_id, mqs


def register(table: ProcessorTable, broker: BrokerController) -> None:
    """Register the lock handlers of `broker` in `table` (inline: memory only)."""

    async def lock(ctx, cmd: RemotingCommand) -> RemotingCommand:
        try:
            group, client_id, mqs = parse_lock_body(cmd.body_bytes())
        except _BadBody as exc:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, str(exc))
        locked = broker.lock_manager.try_lock_batch(group, mqs, client_id)
        body = json.dumps({"lockOKMQSet": [mq.to_json() for mq in locked]}, separators=(",", ":"))
        return cmd.make_response(ResponseCode.SUCCESS, body=body.encode("utf-8"))

    async def unlock(ctx, cmd: RemotingCommand) -> RemotingCommand:
        try:
            group, client_id, mqs = parse_lock_body(cmd.body_bytes())
        except _BadBody as exc:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, str(exc))
        broker.lock_manager.unlock_batch(group, mqs, client_id)
        return cmd.make_response(ResponseCode.SUCCESS)

    table.register(RequestCode.LOCK_BATCH_MQ, lock)
    table.register(RequestCode.UNLOCK_BATCH_MQ, unlock)
