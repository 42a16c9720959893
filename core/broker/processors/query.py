"""VIEW_MESSAGE_BY_ID (33) and QUERY_MESSAGE (12) — docs/protocol.md §5.16, §5.17."""

from __future__ import annotations

from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode, ResponseCode
from core.remoting.errors import HeaderError

from .common import error, ext_int32, ext_int64, ok, required_topic
from .routes import handles, register_handlers

UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"


class QueryProcessor:
    """Message lookups by physical offset, key or UNIQ_KEY."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.config = broker.config

    @handles(RequestCode.VIEW_MESSAGE_BY_ID)
    async def view_message_by_id(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        offset = ext_int64(cmd, "offset", required=True)
        record = None
        if offset >= 0:
            record = self.broker.store.read_record(offset)
        if record is None:
            return error(
                cmd, ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}"
            )
        return ok(cmd, body=record)

    @handles(RequestCode.QUERY_MESSAGE)
    async def query_message(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        topic = required_topic(cmd)
        key = cmd.ext_str("key", required=True)
        max_num = ext_int32(cmd, "maxNum", required=True)
        begin = ext_int64(cmd, "beginTimestamp", required=True)
        end = ext_int64(cmd, "endTimestamp", required=True)
        if not key:
            raise HeaderError("key", "empty key")
        store = self.broker.store
        if cmd.ext_bool(UNIQUE_KEY_QUERY, False):
            records = store.query_by_uniq_key(topic, key)[: self.config.default_query_max_num]
        else:
            limit = max(1, min(max_num, self.config.max_query_msg_num))
            records = store.query_by_key(topic, key, limit, begin, end)
        ext = {
            "indexLastUpdateTimestamp": str(store.index_last_update_timestamp())
            if hasattr(store, "index_last_update_timestamp") else "0",
            "indexLastUpdatePhyoffset": str(store.max_physical_offset),
        }
        if not records:
            return cmd.make_response(
                ResponseCode.QUERY_NOT_FOUND,
                "can not find message, maybe time range not correct",
                ext,
            )
        return ok(cmd, ext, list(records))


def register(table, broker) -> None:
    register_handlers(table, QueryProcessor(broker))
