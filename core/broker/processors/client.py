"""HEART_BEAT (34), UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP (38) and
CHECK_CLIENT_CONFIG (46) — protocol doc §5.5–§5.7, heartbeat body §6.2.

Heartbeats come in two dialects: C++ (enum ordinals, empty sets omitted, `subVersion` a
string, `codeSet` garbage) and Java (enum names, all sets present, numbers). Both are
accepted; tag hash codes are always computed here from the subscription string.
"""

from __future__ import annotations

import logging
from typing import Any

from core.broker.clients import (
    CONSUME_FROM_WHERE,
    CONSUME_TYPES,
    MESSAGE_MODELS,
    ClientChannelInfo,
    SubscriptionData,
    enum_name,
)
from core.broker.filter import FilterParseError, build_message_filter
from core.common import names
from core.common.sysflag import PermName, TopicSysFlag
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode, ResponseCode
from core.remoting.errors import HeaderError

from .common import error, json_body, ok, parse_json_body, required_group

log = logging.getLogger(__name__)

# A heartbeat naming more groups or subscriptions than this is refused (named limits;
# real clients send a handful).
MAX_GROUPS_PER_HEARTBEAT = 1000
MAX_SUBSCRIPTIONS_PER_GROUP = 1000


def _as_list(value: Any) -> list:
    """Missing/null sets are empty (C++ omits empty sets, §6.2)."""
    return value if isinstance(value, list) else []


class ClientProcessor:
    """Client registration and consumer-group membership."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.config = broker.config

    async def heart_beat(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        data = parse_json_body(cmd)
        if not isinstance(data, dict):
            raise HeaderError("body", "heartbeat body is not a JSON object")
        client_id = data.get("clientID")
        if not isinstance(client_id, str) or not client_id:
            raise HeaderError("clientID", "heartbeat without clientID")
        consumers = _as_list(data.get("consumerDataSet"))
        producers = _as_list(data.get("producerDataSet"))
        if len(consumers) + len(producers) > MAX_GROUPS_PER_HEARTBEAT:
            return error(cmd, ResponseCode.SYSTEM_ERROR, "too many groups in one heartbeat")
        broker = self.broker
        conn = ctx.connection
        broker.watch_connection(conn)
        version = cmd.version if isinstance(cmd.version, int) else 0
        for raw in consumers:
            if not isinstance(raw, dict):
                continue
            group = raw.get("groupName")
            if not isinstance(group, str) or names.validate_group(group) is not None:
                continue
            subs_raw = _as_list(raw.get("subscriptionDataSet"))
            if len(subs_raw) > MAX_SUBSCRIPTIONS_PER_GROUP:
                return error(cmd, ResponseCode.SYSTEM_ERROR, "too many subscriptions in one group")
            subs = []
            for s in subs_raw:
                if not isinstance(s, dict):
                    continue
                try:
                    sub = SubscriptionData.from_heartbeat(s)
                except ValueError:
                    continue
                if names.validate_topic(sub.topic) is None:
                    subs.append(sub)
            sg = broker.subscription_group_manager.find_or_create(group)
            notify = self.config.notify_consumer_ids_changed
            if sg is not None:
                notify = notify and sg.notify_consumer_ids_changed_enable
                if not names.is_lmq(group):
                    sys_flag = TopicSysFlag.UNIT_SUB if raw.get("unitMode") is True else 0
                    broker.topic_config_manager.create_topic_in_send_back_method(
                        names.retry_topic(group), sg.retry_queue_nums,
                        PermName.READ | PermName.WRITE, sys_flag,
                    )
            broker.consumer_manager.register(
                group,
                ClientChannelInfo(conn, client_id, str(cmd.language), version),
                consume_type=enum_name(raw.get("consumeType"), CONSUME_TYPES, "CONSUME_PASSIVELY"),
                message_model=enum_name(raw.get("messageModel"), MESSAGE_MODELS, "CLUSTERING"),
                consume_from_where=enum_name(
                    raw.get("consumeFromWhere"), CONSUME_FROM_WHERE, "CONSUME_FROM_LAST_OFFSET"
                ),
                subscriptions=subs,
                notify=notify,
            )
        for raw in producers:
            if not isinstance(raw, dict):
                continue
            group = raw.get("groupName")
            if not isinstance(group, str) or names.validate_group(group) is not None:
                continue
            broker.producer_manager.register(
                group, ClientChannelInfo(conn, client_id, str(cmd.language), version)
            )
        return ok(cmd)

    async def unregister_client(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        client_id = cmd.ext_str("clientID", required=True)
        producer_group = cmd.ext_str("producerGroup") or None  # C++ sends "" (§5.6)
        consumer_group = cmd.ext_str("consumerGroup") or None
        broker = self.broker
        conn = ctx.connection
        if producer_group:
            broker.producer_manager.unregister(producer_group, conn)
        if consumer_group:
            sg = broker.subscription_group_manager.get(consumer_group)
            notify = self.config.notify_consumer_ids_changed and (
                sg is None or sg.notify_consumer_ids_changed_enable
            )
            broker.consumer_manager.unregister(consumer_group, conn, client_id, notify=notify)
        return ok(cmd)

    async def get_consumer_list(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        group = required_group(cmd, "consumerGroup")
        info = self.broker.consumer_manager.get(group)
        ids = info.client_ids() if info is not None else []
        if not ids:
            return error(cmd, ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return ok(cmd, body=json_body({"consumerIdList": ids}))

    async def check_client_config(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        """CHECK_CLIENT_CONFIG: does the broker accept this subscription? (Java clients
        call it before subscribing with SQL92.)"""
        data = parse_json_body(cmd)
        sub = data.get("subscriptionData") if isinstance(data, dict) else None
        if isinstance(sub, dict):
            try:
                build_message_filter(sub.get("expressionType"), sub.get("subString"))
            except FilterParseError as exc:
                return error(cmd, ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc))
        return ok(cmd)


def register(table, broker) -> None:
    proc = ClientProcessor(broker)
    table.register(RequestCode.HEART_BEAT, proc.heart_beat)
    table.register(RequestCode.UNREGISTER_CLIENT, proc.unregister_client)
    table.register(RequestCode.GET_CONSUMER_LIST_BY_GROUP, proc.get_consumer_list)
    table.register(RequestCode.CHECK_CLIENT_CONFIG, proc.check_client_config)
