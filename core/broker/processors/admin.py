"""Admin requests — topics, groups, statistics and connections (docs/protocol.md §5.18, §6.5).

Bodies keyed by a MessageQueue (TopicStatsTable, ConsumeStats) are written the way a Java
broker's fastjson writes them, with the MessageQueue object itself as the map key
(`{{"brokerName":"b","queueId":0,"topic":"T"}:{...}}`). That is not standard JSON, but it
is what Java admin tools parse; `decode_mq_map` reads it back for our own tools.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import trio

from core.broker.subscription_group import SubscriptionGroupConfig
from core.broker.topic_config import MULTI_TAG, SINGLE_TAG, TopicConfig
from core.common import names
from core.remoting.codec import RemotingCommand
from core.remoting.codes import SERVER_VERSION, RequestCode, ResponseCode
from core.remoting.errors import HeaderError

from .common import (
    error,
    ext_int32,
    json_body,
    ok,
    parse_json_body,
    required_group,
    required_topic,
)
from .routes import handles, register_handlers

# UPDATE_AND_CREATE_TOPIC answers once the name servers have the new route, but never
# waits longer than this for them (admin clients time out after 3 s).
REGISTER_WAIT_S = 2.0


def _mq_key(topic: str, broker_name: str, queue_id: int) -> str:
    return json.dumps(
        {"brokerName": broker_name, "queueId": queue_id, "topic": topic},
        separators=(",", ":"), sort_keys=True,
    )


def encode_mq_map(entries: list[tuple[str, str, int, dict[str, Any]]]) -> str:
    """fastjson's form of a Map<MessageQueue, V> (object keys)."""
    items = [
        f"{_mq_key(t, b, q)}:{json.dumps(v, separators=(',', ':'), sort_keys=True)}"
        for t, b, q, v in entries
    ]
    return "{" + ",".join(items) + "}"


def decode_mq_map(text: str) -> list[tuple[dict[str, Any], Any]]:
    """Parse a fastjson Map<MessageQueue, V> (as `encode_mq_map` writes it) into
    [(message queue dict, value)]."""
    decoder = json.JSONDecoder()
    out = []
    pos = text.index("{") + 1
    while True:
        while text[pos] in " ,\n\t\r":
            pos += 1
        if text[pos] == "}":
            return out
        key, pos = decoder.raw_decode(text, pos)
        while text[pos] in " :":
            pos += 1
        value, pos = decoder.raw_decode(text, pos)
        out.append((key, value))


class AdminProcessor:
    """Topic and group administration, statistics, connection lists."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.config = broker.config

    # ------------------------------------------------------------------ topics
    @handles(RequestCode.UPDATE_AND_CREATE_TOPIC)
    async def update_and_create_topic(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        topic = required_topic(cmd)
        if names.is_system_topic(topic) or topic in (
            self.config.cluster_name, self.config.broker_name,
        ):
            return error(
                cmd, ResponseCode.SYSTEM_ERROR, f"The topic[{topic}] is conflict with system topic."
            )
        if names.is_lmq(topic):
            return error(
                cmd, ResponseCode.SYSTEM_ERROR,
                f"The topic[{topic}] is an LMQ; LMQs exist without configuration.",
            )
        read = ext_int32(cmd, "readQueueNums", required=True)
        write = ext_int32(cmd, "writeQueueNums", required=True)
        perm = ext_int32(cmd, "perm", required=True)
        filter_type = cmd.ext_str("topicFilterType", SINGLE_TAG) or SINGLE_TAG
        limit = self.config.max_topic_queue_nums
        for name, value in (("readQueueNums", read), ("writeQueueNums", write)):
            if not 0 < value <= limit:
                raise HeaderError(name, f"queue count must be in 1..{limit}, not {value}")
        if not 0 <= perm <= 15:
            raise HeaderError("perm", f"illegal permission {perm}")
        if filter_type not in (SINGLE_TAG, MULTI_TAG):
            raise HeaderError("topicFilterType", f"illegal topic filter type {filter_type!r}")
        tc = TopicConfig(
            topic, read, write, perm, filter_type,
            ext_int32(cmd, "topicSysFlag", 0) or 0, bool(cmd.ext_bool("order", False)),
        )
        self.broker.topic_config_manager.update(tc)
        failed = await _durable(cmd, self.broker.topic_config_manager)
        if failed is not None:
            return failed
        with trio.move_on_after(REGISTER_WAIT_S):
            await self.broker.register_all()
        return ok(cmd)

    @handles(RequestCode.DELETE_TOPIC_IN_BROKER)
    async def delete_topic(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        topic = required_topic(cmd)
        broker = self.broker
        if names.is_lmq(topic):
            # An LMQ is only its index queue; its offsets go with it (docs/protocol.md §10.2).
            broker.store.delete_topic(topic)
            broker.offset_manager.remove_topic(topic)
            return ok(cmd)
        if names.is_system_topic(topic):
            return error(
                cmd, ResponseCode.SYSTEM_ERROR, f"The topic[{topic}] is conflict with system topic."
            )
        broker.topic_config_manager.delete(topic)
        broker.offset_manager.remove_topic(topic)
        broker.store.delete_topic(topic)
        failed = await _durable(cmd, broker.topic_config_manager)
        return ok(cmd) if failed is None else failed

    @handles(RequestCode.GET_ALL_TOPIC_CONFIG)
    async def get_all_topic_config(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        return ok(cmd, body=json_body(self.broker.topic_config_manager.wrapper_json()))

    @handles(RequestCode.GET_TOPIC_STATS_INFO)
    async def get_topic_stats_info(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        topic = required_topic(cmd)
        broker = self.broker
        tc = broker.topic_config_manager.get(topic)
        if tc is None:
            return error(cmd, ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        store = broker.store
        entries = []
        for qid in range(tc.write_queue_nums):
            max_off = store.max_offset(topic, qid)
            last = store.message_store_time(topic, qid, max_off - 1) if max_off > 0 else 0
            entries.append((topic, self.config.broker_name, qid, {
                "minOffset": store.min_offset(topic, qid),
                "maxOffset": max_off,
                "lastUpdateTimestamp": max(last, 0),
            }))
        body = '{"offsetTable":' + encode_mq_map(entries) + "}"
        return ok(cmd, body=body.encode("ascii"))

    # ------------------------------------------------------------------ consumers
    @handles(RequestCode.GET_CONSUME_STATS)
    async def get_consume_stats(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        group = required_group(cmd, "consumerGroup")
        broker = self.broker
        topic = cmd.ext_str("topic") or None
        if topic is not None:
            topics = [topic]
        else:
            topics = set(broker.offset_manager.topics_of_group(group))
            info = broker.consumer_manager.get(group)
            if info is not None:
                topics |= set(info.subscriptions)
            topics = sorted(topics)
        store = broker.store
        entries = []
        for t in topics:
            tc = broker.topic_config_manager.get(t)
            if tc is None:
                continue
            for qid in range(tc.read_queue_nums):
                broker_offset = store.max_offset(t, qid)
                consumer_offset = max(broker.offset_manager.query(group, t, qid), 0)
                last = 0
                if consumer_offset > 0:
                    last = max(store.message_store_time(t, qid, consumer_offset - 1), 0)
                entries.append((t, self.config.broker_name, qid, {
                    "brokerOffset": broker_offset,
                    "consumerOffset": consumer_offset,
                    "lastTimestamp": last,
                }))
        body = '{"consumeTps":0.0,"offsetTable":' + encode_mq_map(entries) + "}"
        return ok(cmd, body=body.encode("ascii"))

    @handles(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, inline=False)
    async def invoke_broker_to_reset_offset(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        """INVOKE_BROKER_TO_RESET_OFFSET (222): move a group's offsets on `topic` to the
        first message stored at or after `timestamp` (-1 = the end), as mqadmin
        resetOffsetByTime does. Without isForce an offset only moves backwards. The new
        offsets are committed here (so an offline group is reset too) and pushed to every
        live member with RESET_CONSUMER_CLIENT_OFFSET (220), which clients apply at once
        instead of overwriting the reset with their next periodic commit."""
        topic = required_topic(cmd)
        group = required_group(cmd, "group")
        timestamp = cmd.ext_int("timestamp", required=True)
        force = cmd.ext_bool("isForce", default=True)
        broker = self.broker
        tc = broker.topic_config_manager.get(topic)
        if tc is None:
            return error(cmd, ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        store = broker.store
        table: list[tuple[int, int]] = []
        for qid in range(tc.write_queue_nums):
            if timestamp < 0:
                target = store.max_offset(topic, qid)
            else:
                target = store.offset_by_time(topic, qid, timestamp)
            current = broker.offset_manager.query(group, topic, qid)
            if force or current < 0 or target < current:
                current = target
            broker.offset_manager.commit(group, topic, qid, current)
            table.append((qid, current))
        bname = self.config.broker_name
        as_list = {
            "offsetTable": [
                {"brokerName": bname, "queueId": q, "topic": topic, "offset": o} for q, o in table
            ]
        }
        list_body = json.dumps(as_list, separators=(",", ":")).encode()
        java_body = (
            '{"offsetTable":' + encode_mq_map([(topic, bname, q, o) for q, o in table]) + "}"
        ).encode()
        ext = {"topic": topic, "group": group, "timestamp": str(timestamp), "isForce": "1"}
        info = broker.consumer_manager.get(group)
        for channel in list(info.channels.values()) if info is not None else []:
            # Java clients parse fastjson's MessageQueue-keyed map; the C++ client (and
            # ours) read the list form (docs/protocol.md §6.6).
            body = java_body if channel.language == "JAVA" else list_body
            push = RemotingCommand.request(
                RequestCode.RESET_CONSUMER_CLIENT_OFFSET, dict(ext), body
            )
            try:
                await channel.connection.invoke_oneway(push)
            except Exception:  # a vanished member: it reads the committed offset later
                continue
        return ok(cmd, body=list_body)

    @handles(RequestCode.GET_ALL_DELAY_OFFSET)
    async def get_all_delay_offset(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        """GET_ALL_DELAY_OFFSET (45): the delay service's per-level progress."""
        return ok(cmd, body=json_body(self.broker.schedule_service.offset_table_json()))

    @handles(RequestCode.GET_CONSUMER_CONNECTION_LIST)
    async def get_consumer_connection_list(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        group = required_group(cmd, "consumerGroup")
        info = self.broker.consumer_manager.get(group)
        if info is None or not info.channels:
            return error(
                cmd, ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online"
            )
        body = {
            "connectionSet": [ch.to_json() for ch in info.channels.values()],
            "subscriptionTable": {t: s.to_json() for t, s in info.subscriptions.items()},
            "consumeType": info.consume_type,
            "messageModel": info.message_model,
            "consumeFromWhere": info.consume_from_where,
        }
        return ok(cmd, body=json_body(body))

    @handles(RequestCode.GET_PRODUCER_CONNECTION_LIST)
    async def get_producer_connection_list(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        group = required_group(cmd, "producerGroup")
        channels = self.broker.producer_manager.channels_of_group(group)
        if not channels:
            return error(cmd, ResponseCode.SYSTEM_ERROR, f"the producer group[{group}] not exist")
        return ok(cmd, body=json_body({"connectionSet": [ch.to_json() for ch in channels]}))

    # ------------------------------------------------------------------ groups
    @handles(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP)
    async def update_and_create_group(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        data = parse_json_body(cmd)
        if not isinstance(data, dict) or not isinstance(data.get("groupName"), str):
            raise HeaderError("groupName", "subscription group config without groupName")
        reason = names.validate_group(data["groupName"])
        if reason is not None:
            raise HeaderError("groupName", reason)
        try:
            sg = SubscriptionGroupConfig.from_json(data)
        except (TypeError, ValueError) as exc:
            raise HeaderError("body", f"bad subscription group config: {exc}") from None
        manager = self.broker.subscription_group_manager
        manager.update(sg)
        failed = await _durable(cmd, manager)
        return ok(cmd) if failed is None else failed

    @handles(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    async def get_all_groups(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        manager = self.broker.subscription_group_manager
        body = {
            "subscriptionGroupTable": {n: g.to_json() for n, g in manager.table.items()},
            "dataVersion": self.broker.topic_config_manager.data_version.to_json(),
        }
        return ok(cmd, body=json_body(body))

    @handles(RequestCode.DELETE_SUBSCRIPTIONGROUP)
    async def delete_group(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        group = required_group(cmd, "groupName")
        broker = self.broker
        broker.subscription_group_manager.delete(group)
        if cmd.ext_bool("removeOffset", False):
            broker.offset_manager.remove_group(group)
        failed = await _durable(cmd, broker.subscription_group_manager)
        return ok(cmd) if failed is None else failed

    @handles(RequestCode.GET_ALL_CONSUMER_OFFSET)
    async def get_all_consumer_offset(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        om = self.broker.offset_manager
        body = {
            "offsetTable": {k: {str(q): o for q, o in v.items()} for k, v in om.table.items()},
        }
        return ok(cmd, body=json_body(body))

    # ------------------------------------------------------------------ broker
    @handles(RequestCode.GET_BROKER_RUNTIME_INFO)
    async def get_broker_runtime_info(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        broker = self.broker
        store = broker.store
        table: dict[str, Any] = {
            "brokerVersionDesc": "V4_9_7 (lmq-gateway)",
            "brokerVersion": SERVER_VERSION,
            "brokerName": self.config.broker_name,
            "brokerAddr": broker.broker_addr,
            "clusterName": self.config.cluster_name,
            "bootTimestamp": broker.boot_timestamp,
            "runtime": _uptime(broker.boot_timestamp),
            "commitLogMinOffset": store.min_physical_offset,
            "commitLogMaxOffset": store.max_physical_offset,
            "commitLogFlushedOffset": store.flushed_offset,
            "flushDiskType": "SYNC_FLUSH" if broker.sync_flush else "ASYNC_FLUSH",
            "topicCount": len(broker.topic_config_manager.table),
            "consumerGroupOnline": len(broker.consumer_manager.groups),
            "producerGroupOnline": len(broker.producer_manager.groups),
            "pullHeldCount": broker.pull_hold_service.held,
            "pid": os.getpid(),
        }
        try:
            stats = store.stats()
        except Exception:  # statistics must never fail the request
            stats = {}
        for key, value in (stats or {}).items():
            table.setdefault(str(key), value)
        return ok(cmd, body=json_body({"table": {k: str(v) for k, v in table.items()}}))

    @handles(RequestCode.GET_BROKER_CONFIG)
    async def get_broker_config(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        """Java answers a properties text ("key=value" lines) and ext `version`."""
        from dataclasses import asdict

        lines = [f"{k}={v}" for k, v in sorted(asdict(self.config).items())]
        version = self.broker.topic_config_manager.data_version.to_json()
        return ok(
            cmd, {"version": json.dumps(version)}, ("\n".join(lines) + "\n").encode("utf-8")
        )


async def _durable(cmd: RemotingCommand, manager) -> RemotingCommand | None:
    """Wait until the manager's changes are on disk (written off the event loop); the
    error response when the write failed, None when they are durable."""
    try:
        await manager.flush()
    except OSError as exc:
        return error(cmd, ResponseCode.SYSTEM_ERROR, f"cannot persist the change: {exc}")
    return None


def _uptime(boot_ms: int) -> str:
    seconds = max(0, int(time.time() - boot_ms / 1000))
    days, rem = divmod(seconds, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    return f"[ {days} days, {hours} hours, {minutes} minutes, {secs} seconds ]"


def register(table, broker) -> None:
    register_handlers(table, AdminProcessor(broker))
