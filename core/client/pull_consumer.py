"""`PullConsumer`: the application names queues and offsets (Java DefaultMQPullConsumer).

Also home of `pull_kernel`, the one PULL_MESSAGE path every consumer uses: it builds the
request (docs/protocol.md §5.2), decodes records with inflated bodies, re-checks tags exactly
(the broker filtered by tag hash only) and stamps MIN_OFFSET / MAX_OFFSET on each message as
Java does.
"""

from __future__ import annotations

import logging

import trio

from core.client.errors import MQClientError
from core.client.instance import ClientInstance
from core.client.model import ExpressionType, MessageQueue, PullResult, PullStatus, SubscriptionData
from core.common.message import MessageExt
from core.common.names import validate_group
from core.common.properties import MessageConst
from core.common.sysflag import PullSysFlag

log = logging.getLogger(__name__)

#: Long-poll hold asked of the broker by push consumers (brokerSuspendMaxTimeMillis) and
#: the socket timeout of such a pull (consumerTimeoutMillisWhenSuspend) (docs/protocol.md §8.7).
BROKER_SUSPEND_MAX_MS = 15000
TIMEOUT_WHEN_SUSPEND_S = 30.0


async def broker_addr_for(client: ClientInstance, mq: MessageQueue) -> str:
    """The broker pulls and offsets of `mq` go to: the master, else a slave."""
    addr = client.find_subscribe_addr(mq.broker_name)
    if addr is None and not mq.topic.startswith("%LMQ%"):
        await client.update_route(mq.topic)
        addr = client.find_subscribe_addr(mq.broker_name)
    if addr is None:
        raise MQClientError(f"The broker[{mq.broker_name}] not exist")
    return addr


async def pull_kernel(
    client: ClientInstance,
    group: str,
    mq: MessageQueue,
    sub: SubscriptionData,
    offset: int,
    max_nums: int,
    *,
    commit_offset: int = 0,
    suspend_ms: int = 0,
    timeout: float | None = None,
) -> PullResult:
    """One PULL_MESSAGE. The subscription always travels in the request (SUBSCRIPTION bit),
    so the broker needs no heartbeat from a pull consumer (docs/protocol.md §8.5)."""
    if offset < 0:
        raise MQClientError(f"illegal pull offset {offset}")
    if max_nums <= 0:
        raise MQClientError(f"illegal max_nums {max_nums}")
    addr = await broker_addr_for(client, mq)
    sys_flag = PullSysFlag.SUBSCRIPTION
    if suspend_ms > 0:
        sys_flag |= PullSysFlag.SUSPEND
    if commit_offset > 0:
        sys_flag |= PullSysFlag.COMMIT_OFFSET
    ext = {
        "consumerGroup": group,
        "topic": mq.topic,
        "queueId": str(mq.queue_id),
        "queueOffset": str(offset),
        "maxMsgNums": str(max_nums),
        "sysFlag": str(int(sys_flag)),
        "commitOffset": str(commit_offset),
        "suspendTimeoutMillis": str(suspend_ms),
        "subscription": sub.sub_string,
        "subVersion": str(sub.sub_version),
        "expressionType": sub.expression_type,
    }
    if timeout is None:
        timeout = TIMEOUT_WHEN_SUSPEND_S if suspend_ms > 0 else client.config.request_timeout
    result = await client.api.pull_message(addr, ext, timeout)
    if result.status is PullStatus.FOUND:
        msgs = [m for m in result.messages if sub.matches(m)]
        min_s, max_s = str(result.min_offset), str(result.max_offset)
        for m in msgs:
            m.properties[MessageConst.MIN_OFFSET] = min_s
            m.properties[MessageConst.MAX_OFFSET] = max_s
        result.messages = msgs
        if not msgs:
            result.status = PullStatus.NO_MATCHED_MSG
    return result


async def pull_or_pause(client: ClientInstance, group: str, mq: MessageQueue, *args,
                        pause_s: float, **kwargs) -> PullResult | None:
    """`pull_kernel(client, group, mq, *args, **kwargs)` for a consumer's pull loop: None
    when the pull failed (logged at debug level), after a pause of `pause_s` seconds; the
    loop then tries again."""
    try:
        return await pull_kernel(client, group, mq, *args, **kwargs)
    except Exception as exc:
        log.debug("pull of %s failed: %r", mq, exc)
        await trio.sleep(pause_s)
        return None


class PullConsumer:
    """Pull from queues the application chooses; offsets are the application's business
    unless it stores them at the broker with `update_consume_offset`.

    It sends no heartbeat and takes no part in rebalancing (like the C++ pull consumer, docs/protocol.md §8.5).
    """

    def __init__(self, client: ClientInstance, group: str) -> None:
        reason = validate_group(group)
        if reason:
            raise MQClientError(reason)
        self.client = client
        self.group = group

    async def __aenter__(self) -> PullConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def fetch_subscribe_message_queues(self, topic: str) -> list[MessageQueue]:
        """Readable queues of `topic` (from its route)."""
        route = await self.client.update_route(topic)
        if route is None:
            raise MQClientError(f"no route info for topic {topic!r}", 17)
        return route.subscribe_queues(topic)

    async def pull(self, mq: MessageQueue, expression: str | None, offset: int, max_nums: int = 32,
                   *, expression_type: str = ExpressionType.TAG.value,
                   timeout: float | None = None) -> PullResult:
        """Pull up to `max_nums` messages from `offset`; answers at once when there is none."""
        sub = SubscriptionData.build(mq.topic, expression, expression_type)
        return await pull_kernel(self.client, self.group, mq, sub, offset, max_nums, timeout=timeout)

    async def pull_block_if_not_found(self, mq: MessageQueue, expression: str | None, offset: int,
                                      max_nums: int = 32, *, suspend: float = 20.0,
                                      expression_type: str = ExpressionType.TAG.value) -> PullResult:
        """Like `pull`, but the broker holds the request up to `suspend` seconds for news."""
        sub = SubscriptionData.build(mq.topic, expression, expression_type)
        return await pull_kernel(self.client, self.group, mq, sub, offset, max_nums,
                                 suspend_ms=int(suspend * 1000), timeout=suspend + 10.0)

    async def min_offset(self, mq: MessageQueue) -> int:
        return await self.client.api.get_min_offset(await broker_addr_for(self.client, mq),
                                                    mq.topic, mq.queue_id)

    async def max_offset(self, mq: MessageQueue) -> int:
        return await self.client.api.get_max_offset(await broker_addr_for(self.client, mq),
                                                    mq.topic, mq.queue_id)

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return await self.client.api.search_offset(await broker_addr_for(self.client, mq),
                                                   mq.topic, mq.queue_id, timestamp_ms)

    async def earliest_msg_store_time(self, mq: MessageQueue) -> int:
        return await self.client.api.get_earliest_msg_storetime(
            await broker_addr_for(self.client, mq), mq.topic, mq.queue_id)

    async def fetch_consume_offset(self, mq: MessageQueue) -> int:
        """The group's offset stored at the broker (-1 when none)."""
        return await self.client.api.query_consumer_offset(
            await broker_addr_for(self.client, mq), self.group, mq.topic, mq.queue_id)

    async def update_consume_offset(self, mq: MessageQueue, offset: int) -> None:
        """Store the group's offset (next message to consume) at the broker."""
        await self.client.api.update_consumer_offset(
            await broker_addr_for(self.client, mq), self.group, mq.topic, mq.queue_id, offset)

    async def send_back(self, msg: MessageExt, delay_level: int = 0, broker_name: str | None = None,
                        max_reconsume_times: int = 16) -> None:
        """Hand a message back for redelivery via %RETRY%<group> (or the DLQ, docs/protocol.md §5.10)."""
        addr = self.client.find_broker_addr(broker_name) if broker_name else None
        await self.client.api.consumer_send_msg_back(addr or msg.store_host, msg, self.group,
                                                     delay_level, max_reconsume_times)
