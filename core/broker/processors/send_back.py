"""CONSUMER_SEND_MSG_BACK (36): a consumer gives a message back for a later retry
(docs/protocol.md §5.10, §9.3).

The broker reads the message at the given commit-log offset and stores a copy either in
`%RETRY%<group>` (delayed through the schedule service: level 3 + reconsume times when
the client leaves the level to the broker) or, once the group's retry budget is spent or
the client asks for it (`delayLevel < 0`), in `%DLQ%<group>`. The copy keeps body,
flags, born data and properties, records the original topic in `RETRY_TOPIC` and the
first message id in `ORIGIN_MESSAGE_ID`, and counts one more reconsume.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from core.broker.message_util import clear_property, inner_from_ext, put_property
from core.common import names
from core.common.properties import MessageConst
from core.common.sysflag import PermName, TopicSysFlag
from core.remoting import MQVersion, ProcessorTable, RemotingCommand, RequestCode, ResponseCode

if TYPE_CHECKING:
    from core.broker.controller import BrokerController

__all__ = ["register", "DLQ_QUEUE_NUMS", "FIRST_RETRY_LEVEL_BASE"]

#: Queues of a %DLQ% topic (Java's DLQ_NUMS_PER_GROUP).
DLQ_QUEUE_NUMS = 1
#: delayLevel 0 from the client means "broker decides": 3 + reconsumeTimes (docs/protocol.md §9.3).
FIRST_RETRY_LEVEL_BASE = 3

_STORED = frozenset({"OK", "FLUSH_DISK_TIMEOUT", "FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE"})


def register(table: ProcessorTable, broker: BrokerController) -> None:
    """Register the CONSUMER_SEND_MSG_BACK handler of `broker` in `table`."""

    async def handle(ctx, cmd: RemotingCommand) -> RemotingCommand:
        return await send_back(broker, cmd)

    # Not inline: the put may wait for a SYNC_FLUSH group commit.
    table.register(RequestCode.CONSUMER_SEND_MSG_BACK, handle, inline=False)


async def send_back(broker, cmd: RemotingCommand) -> RemotingCommand:
    """Handle one CONSUMER_SEND_MSG_BACK request (docs/protocol.md §5.10)."""
    offset = cmd.ext_int("offset", required=True)
    group = cmd.ext_str("group", required=True)
    delay_level = cmd.ext_int("delayLevel", 0)
    unit_mode = bool(cmd.ext_bool("unitMode", False))
    reason = names.validate_group(group)
    if reason is not None:
        # The group names the retry/DLQ topics: refuse it before creating anything.
        return cmd.make_response(ResponseCode.SYSTEM_ERROR, reason)

    sg = broker.subscription_group_manager.find_or_create(group)
    if sg is None:
        return cmd.make_response(
            ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
            f"subscription group not exist, {group}",
        )
    if not PermName.is_writeable(getattr(broker.config, "broker_permission", 6)):
        return cmd.make_response(
            ResponseCode.NO_PERMISSION,
            f"the broker[{broker.broker_addr}] sending message is forbidden",
        )
    if sg.retry_queue_nums <= 0:
        # Java's answer for a group that disabled retries: accepted and dropped.
        return cmd.make_response(ResponseCode.SUCCESS)

    tcm = broker.topic_config_manager
    new_topic = names.retry_topic(group)
    queue_id = random.randrange(sg.retry_queue_nums)
    topic_sys_flag = TopicSysFlag.UNIT_SUB if unit_mode else 0
    tc = tcm.create_topic_in_send_back_method(
        new_topic, sg.retry_queue_nums, PermName.READ | PermName.WRITE, topic_sys_flag
    )
    if tc is None:
        return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"topic[{new_topic}] not exist")
    if not PermName.is_writeable(tc.perm):
        return cmd.make_response(
            ResponseCode.NO_PERMISSION, f"the topic[{new_topic}] sending message is forbidden"
        )

    msg = broker.store.look_message(offset)
    if msg is None:
        return cmd.make_response(
            ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}"
        )

    props = msg.properties
    if not props.get(MessageConst.RETRY_TOPIC):
        props[MessageConst.RETRY_TOPIC] = msg.topic

    max_reconsume = sg.retry_max_times
    if cmd.version >= MQVersion.V3_4_9:
        # Honoured only for clients >= V3_4_9 (docs/protocol.md §1.2): not for the C++ wheel (63).
        header_max = cmd.ext_int("maxReconsumeTimes")
        if header_max is not None:
            max_reconsume = header_max

    to_dlq = msg.reconsume_times >= max_reconsume or delay_level < 0
    if to_dlq:
        new_topic = names.dlq_topic(group)
        queue_id = random.randrange(DLQ_QUEUE_NUMS)
        tc = tcm.create_topic_in_send_back_method(
            new_topic, DLQ_QUEUE_NUMS, PermName.READ | PermName.WRITE, 0
        )
        if tc is None:
            return cmd.make_response(
                ResponseCode.SYSTEM_ERROR, f"topic[{new_topic}] not exist"
            )
    elif delay_level == 0:
        delay_level = FIRST_RETRY_LEVEL_BASE + msg.reconsume_times

    inner = inner_from_ext(msg, topic=new_topic, queue_id=queue_id, store_host=broker.store_host)
    inner.reconsume_times = msg.reconsume_times + 1
    # The copy is for the group's retry/DLQ topic only: indexing it into the LMQs the
    # original went to would deliver it to their subscribers again (docs/acl.md §4).
    clear_property(inner, MessageConst.INNER_MULTI_DISPATCH)
    clear_property(inner, MessageConst.INNER_MULTI_QUEUE_OFFSET)
    if not inner.properties.get(MessageConst.ORIGIN_MESSAGE_ID):
        # The first send-back names the stored message by its offset msgId (Java's
        # MessageExt.getMsgId() of a record read from the store).
        put_property(inner, MessageConst.ORIGIN_MESSAGE_ID, msg.offset_msg_id)
    if to_dlq:
        clear_property(inner, MessageConst.DELAY_TIME_LEVEL)
    else:
        put_property(inner, MessageConst.DELAY_TIME_LEVEL, delay_level)
        broker.schedule_service.divert(inner)

    result = await broker.put_message(inner)
    status = getattr(result.status, "name", str(result.status))
    if status in _STORED:
        return cmd.make_response(ResponseCode.SUCCESS)
    return cmd.make_response(ResponseCode.SYSTEM_ERROR, status)
