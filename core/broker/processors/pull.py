"""PULL_MESSAGE (11) — docs/protocol.md §5.2, including long polling and LMQ pulls (docs/protocol.md §10.2).

Store results map to codes exactly as Java 4.9.7 does:

| store status                              | code | nextBeginOffset        |
|-------------------------------------------|------|------------------------|
| FOUND                                     | 0    | offset + scanned       |
| NO_MATCHED_MESSAGE, MESSAGE_WAS_REMOVING  | 20   | offset + scanned       |
| NO_MESSAGE_IN_QUEUE (offset 0), OVERFLOW_ONE, OFFSET_FOUND_NULL | 19 | from the store |
| OFFSET_TOO_SMALL, OVERFLOW_BADLY, NO_MESSAGE_IN_QUEUE (offset≠0) | 21 | corrected  |

A 19 on a request with the SUSPEND bit is held (`PullRequestHoldService`) until a message
reaches the queue or the suspend time (capped by `max_suspend_ms`, clients time out at
30 s) passes, then the read runs again. The body of a 0 answer is the list of record
memoryviews the store returned: the transport writes them without copying.
"""

from __future__ import annotations

from functools import lru_cache

import trio

from core.broker.filter import FilterParseError, build_message_filter
from core.common.sysflag import PermName, PullSysFlag
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode, ResponseCode

from .common import (
    error,
    ext_int32,
    ext_int64,
    required_group,
    required_queue_id,
    required_topic,
)

_MASTER_ID = "0"

# GetStatus name -> response code (see the module table).
_CODES = {
    "FOUND": ResponseCode.SUCCESS,
    "NO_MATCHED_MESSAGE": ResponseCode.PULL_RETRY_IMMEDIATELY,
    "MESSAGE_WAS_REMOVING": ResponseCode.PULL_RETRY_IMMEDIATELY,
    "OFFSET_FOUND_NULL": ResponseCode.PULL_NOT_FOUND,
    "OFFSET_OVERFLOW_ONE": ResponseCode.PULL_NOT_FOUND,
    "OFFSET_TOO_SMALL": ResponseCode.PULL_OFFSET_MOVED,
    "OFFSET_OVERFLOW_BADLY": ResponseCode.PULL_OFFSET_MOVED,
}


@lru_cache(maxsize=1024)
def _cached_filter(expression_type: str | None, expression: str | None):
    # Compiling SQL92 on every pull would dominate; subscriptions repeat.
    return build_message_filter(expression_type, expression)


def status_code(status_name: str, request_offset: int) -> int:
    """Java's GetMessageStatus -> response code mapping."""
    if status_name in ("NO_MESSAGE_IN_QUEUE", "NO_MATCHED_LOGIC_QUEUE"):
        return ResponseCode.PULL_OFFSET_MOVED if request_offset != 0 else ResponseCode.PULL_NOT_FOUND
    return _CODES.get(status_name, ResponseCode.SYSTEM_ERROR)


class PullProcessor:
    """Serves pulls from the store; holds empty ones."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.config = broker.config

    def _filter(self, cmd: RemotingCommand, group: str, topic: str, sys_flag: int):
        """The pull's filter (None = all) or an error response."""
        if sys_flag & PullSysFlag.SUBSCRIPTION:
            etype = cmd.ext_str("expressionType")
            expression = cmd.ext_str("subscription")
        else:
            # Java push consumers send no subscription: use the heartbeat's (docs/protocol.md §5.2).
            info = self.broker.consumer_manager.get(group)
            if info is None:
                return error(
                    cmd, ResponseCode.SUBSCRIPTION_NOT_EXIST,
                    f"the consumer's group info not exist, group: {group}",
                )
            sg = self.broker.subscription_group_manager.get(group)
            if (
                sg is not None
                and not sg.consume_broadcast_enable
                and info.message_model == "BROADCASTING"
            ):
                return error(
                    cmd, ResponseCode.NO_PERMISSION,
                    f"the consumer group[{group}] can not consume by broadcast way",
                )
            sub = info.subscriptions.get(topic)
            if sub is None:
                return error(
                    cmd, ResponseCode.SUBSCRIPTION_NOT_EXIST,
                    f"the consumer's subscription not exist, group: {group}, topic: {topic}",
                )
            if sub.sub_version < (ext_int64(cmd, "subVersion", 0) or 0):
                return error(
                    cmd, ResponseCode.SUBSCRIPTION_NOT_LATEST,
                    f"the consumer's subscription not latest, group: {group}",
                )
            etype, expression = sub.expression_type, sub.sub_string
        try:
            return _cached_filter(etype or None, expression)
        except FilterParseError as exc:
            return error(cmd, ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc))

    def _read(self, cmd: RemotingCommand, topic: str, queue_id: int, offset: int,
              max_nums: int, filt) -> tuple[RemotingCommand, bool]:
        """One store read -> (response, at_end). `at_end` = nothing beyond `offset` yet."""
        config = self.config
        result = self.broker.store.get(
            topic, queue_id, offset, min(max_nums, config.max_pull_msg_nums),
            config.max_pull_bytes, filt,
        )
        status = result.status.name
        code = status_code(status, offset)
        ext = {
            "suggestWhichBrokerId": _MASTER_ID,
            "nextBeginOffset": str(result.next_begin_offset),
            "minOffset": str(result.min_offset),
            "maxOffset": str(result.max_offset),
        }
        body = result.buffers if code == ResponseCode.SUCCESS else None
        at_end = code == ResponseCode.PULL_NOT_FOUND and result.next_begin_offset == offset
        return cmd.make_response(code, None, ext, body), at_end

    async def handle(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        broker = self.broker
        group = required_group(cmd, "consumerGroup")
        topic = required_topic(cmd)
        queue_id = required_queue_id(cmd)
        offset = ext_int64(cmd, "queueOffset", required=True)
        max_nums = ext_int32(cmd, "maxMsgNums", required=True)
        sys_flag = ext_int32(cmd, "sysFlag", required=True)
        commit_offset = ext_int64(cmd, "commitOffset", required=True)
        suspend_ms = ext_int64(cmd, "suspendTimeoutMillis", required=True)
        ext_int64(cmd, "subVersion", required=True)

        if not PermName.is_readable(self.config.broker_permission):
            return error(
                cmd, ResponseCode.NO_PERMISSION,
                f"the broker[{broker.broker_addr}] pulling message is forbidden",
            )
        sg = broker.subscription_group_manager.find_or_create(group)
        if sg is None:
            return error(
                cmd, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group [{group}] does not exist",
            )
        if not sg.consume_enable:
            return error(cmd, ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}")
        tc = broker.topic_config_manager.get(topic)
        if tc is None:
            return error(
                cmd, ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
            )
        if not PermName.is_readable(tc.perm):
            return error(
                cmd, ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden"
            )
        if queue_id >= tc.read_queue_nums:
            return error(
                cmd, ResponseCode.SYSTEM_ERROR,
                f"queueId[{queue_id}] is illegal, topic:[{topic}] "
                f"topicConfig.readQueueNums:[{tc.read_queue_nums}] consumer:[{ctx.remote_addr}]",
            )
        if max_nums <= 0:
            return error(cmd, ResponseCode.SYSTEM_ERROR, f"illegal maxMsgNums {max_nums}: maxMsgNums")
        filt = self._filter(cmd, group, topic, sys_flag)
        if isinstance(filt, RemotingCommand):
            return filt
        # Commit-offset side effect (bit 0), before the read, as Java's master does.
        if sys_flag & PullSysFlag.COMMIT_OFFSET and commit_offset >= 0:
            broker.offset_manager.commit(group, topic, queue_id, commit_offset)

        response, at_end = self._read(cmd, topic, queue_id, offset, max_nums, filt)
        if not (at_end and sys_flag & PullSysFlag.SUSPEND):
            return response
        if self.config.long_polling:
            hold_s = min(max(suspend_ms, 0), self.config.max_suspend_ms) / 1000.0
        else:
            hold_s = self.config.short_polling_ms / 1000.0
        deadline = trio.current_time() + hold_s
        hold = broker.pull_hold_service
        while True:
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                return response
            await hold.wait(topic, queue_id, offset, remaining)
            if broker.closing:
                return response
            response, at_end = self._read(cmd, topic, queue_id, offset, max_nums, filt)
            if response.code == ResponseCode.PULL_RETRY_IMMEDIATELY:
                # New messages, none matching: keep waiting past them while time remains
                # (the client would only ask again from nextBeginOffset).
                offset = int(response.ext_fields["nextBeginOffset"])
                continue
            if not at_end:
                return response


def register(table, broker) -> None:
    # Not inline: a held pull waits in its own task (in the connection's nursery).
    table.register(RequestCode.PULL_MESSAGE, PullProcessor(broker).handle, inline=False)


__all__ = ["PullProcessor", "register", "status_code"]
