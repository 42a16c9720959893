"""Offset requests — docs/protocol.md §5.3, §5.4, §5.8, §5.9.

QUERY_CONSUMER_OFFSET for a queue the group never committed (a new group): we answer
`0` (code 0, offset "0") while the queue's min offset is 0, i.e. nothing was deleted yet —
Java's answer when the first message is still in memory — so a new group consumes the
queue's history. Once retention has removed the start of the queue (min offset > 0) we
answer 22 QUERY_NOT_FOUND and the client applies its consumeFromWhere (C++ default: start
at the max offset). This is deterministic, unlike Java's "is it still in the page cache".
A request with `setZeroIfNotFound=false` (RocketMQ 5 header) always gets 22 for a new group.
"""

from __future__ import annotations

from core.common import names
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode, ResponseCode
from core.remoting.errors import HeaderError

from .common import (
    error,
    ext_int64,
    ok,
    required_group,
    required_queue_id,
    required_topic,
)
from .routes import handles, register_handlers

NOT_FOUND_REMARK = "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first"


class OffsetProcessor:
    """Consumer offsets and queue offset lookups."""

    def __init__(self, broker) -> None:
        self.broker = broker

    def _queue(self, cmd: RemotingCommand) -> tuple[str, int]:
        topic = required_topic(cmd)
        queue_id = required_queue_id(cmd)
        if names.is_lmq(topic) and queue_id != names.LMQ_QUEUE_ID:
            raise HeaderError("queueId", f"an LMQ has only queue {names.LMQ_QUEUE_ID}")
        return topic, queue_id

    @handles(RequestCode.QUERY_CONSUMER_OFFSET)
    async def query_consumer_offset(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        group = required_group(cmd, "consumerGroup")
        topic, queue_id = self._queue(cmd)
        broker = self.broker
        offset = broker.offset_manager.query(group, topic, queue_id)
        if offset >= 0:
            return ok(cmd, {"offset": str(offset)})
        # RocketMQ 5 clients send setZeroIfNotFound=false to apply their own
        # consumeFromWhere to a new group; absent (4.x clients) means the 4.x rule below.
        zero_if_not_found = cmd.ext_bool("setZeroIfNotFound", default=True)
        if zero_if_not_found and broker.store.min_offset(topic, queue_id) <= 0:
            return ok(cmd, {"offset": "0"})
        return error(cmd, ResponseCode.QUERY_NOT_FOUND, NOT_FOUND_REMARK)

    @handles(RequestCode.UPDATE_CONSUMER_OFFSET)
    async def update_consumer_offset(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        group = required_group(cmd, "consumerGroup")
        topic, queue_id = self._queue(cmd)
        offset = ext_int64(cmd, "commitOffset", required=True)
        if offset < 0:
            raise HeaderError("commitOffset", f"illegal offset {offset}")
        self.broker.offset_manager.commit(group, topic, queue_id, offset)
        return ok(cmd)

    @handles(RequestCode.GET_MAX_OFFSET)
    async def get_max_offset(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        topic, queue_id = self._queue(cmd)
        return ok(cmd, {"offset": str(self.broker.store.max_offset(topic, queue_id))})

    @handles(RequestCode.GET_MIN_OFFSET)
    async def get_min_offset(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        topic, queue_id = self._queue(cmd)
        return ok(cmd, {"offset": str(self.broker.store.min_offset(topic, queue_id))})

    @handles(RequestCode.GET_EARLIEST_MSG_STORETIME)
    async def get_earliest_msg_storetime(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        topic, queue_id = self._queue(cmd)
        ts = self.broker.store.earliest_message_time(topic, queue_id)
        return ok(cmd, {"timestamp": str(ts)})

    @handles(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP)
    async def search_offset_by_timestamp(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        topic, queue_id = self._queue(cmd)
        timestamp = ext_int64(cmd, "timestamp", required=True)
        offset = self.broker.store.offset_by_time(topic, queue_id, timestamp)
        return ok(cmd, {"offset": str(offset)})


def register(table, broker) -> None:
    register_handlers(table, OffsetProcessor(broker))
