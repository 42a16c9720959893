"""HEART_BEAT (34), UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP (38) and
CHECK_CLIENT_CONFIG (46) — docs/protocol.md §5.5–§5.7, heartbeat body docs/protocol.md §6.2.

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
from .routes import handles, register_handlers

log = logging.getLogger(__name__)


def _as_list(value: Any) -> list:
    """Missing/null sets are empty (C++ omits empty sets, docs/protocol.md §6.2)."""
    return value if isinstance(value, list) else []


def _valid_group(raw: Any) -> str | None:
    group = raw.get("groupName") if isinstance(raw, dict) else None
    if not isinstance(group, str) or names.validate_group(group) is not None:
        return None
    return group


class ClientProcessor:
    """Client registration and consumer-group membership."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.config = broker.config

    def _read_body(self, cmd: RemotingCommand) -> Any:
        """The JSON body, refused unparsed above `max_heartbeat_body_bytes`."""
        limit = self.config.max_heartbeat_body_bytes
        if cmd.body_length > limit:
            raise HeaderError("body", f"body is {cmd.body_length} bytes, the limit is {limit}")
        return parse_json_body(cmd)

    @handles(RequestCode.HEART_BEAT)
    async def heart_beat(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        """Everything is checked before anything is registered: a refused heartbeat
        changes nothing, except that groups the broker may not create (auto-creation
        off or `max_auto_created_groups` reached) are skipped and answered with
        SUBSCRIPTION_GROUP_NOT_EXIST while the others are registered."""
        config = self.config
        data = self._read_body(cmd)
        if not isinstance(data, dict):
            raise HeaderError("body", "heartbeat body is not a JSON object")
        client_id = data.get("clientID")
        if not isinstance(client_id, str) or not client_id:
            raise HeaderError("clientID", "heartbeat without clientID")
        consumers = _as_list(data.get("consumerDataSet"))
        producers = _as_list(data.get("producerDataSet"))
        if len(consumers) + len(producers) > config.max_heartbeat_groups:
            return error(cmd, ResponseCode.SYSTEM_ERROR,
                         f"too many groups in one heartbeat (max_heartbeat_groups "
                         f"{config.max_heartbeat_groups})")
        n_subs = sum(len(_as_list(raw.get("subscriptionDataSet")))
                     for raw in consumers if isinstance(raw, dict))
        if n_subs > config.max_heartbeat_subscriptions:
            return error(cmd, ResponseCode.SYSTEM_ERROR,
                         f"too many subscriptions in one heartbeat (max_heartbeat_subscriptions "
                         f"{config.max_heartbeat_subscriptions})")
        # Validate every consumer entry first; an over-long expression is refused unparsed.
        entries: list[tuple[str, dict, list[SubscriptionData]]] = []
        for raw in consumers:
            group = _valid_group(raw)
            if group is None:
                continue
            subs = []
            for s in _as_list(raw.get("subscriptionDataSet")):
                if not isinstance(s, dict):
                    continue
                try:
                    sub = SubscriptionData.from_heartbeat(s)
                except FilterParseError as exc:
                    return error(cmd, exc.response_code, f"group {group}: {exc}")
                except ValueError:
                    continue
                if names.validate_topic_or_lmq(sub.topic) is None:
                    subs.append(sub)
            entries.append((group, raw, subs))
        producer_groups = [g for g in map(_valid_group, producers) if g is not None]
        broker = self.broker
        conn = ctx.connection
        for manager, named in ((broker.consumer_manager, [e[0] for e in entries]),
                               (broker.producer_manager, producer_groups)):
            mine = manager.groups_of_connection(conn)
            if len(mine | set(named)) > config.max_groups_per_connection:
                return error(cmd, ResponseCode.SYSTEM_ERROR,
                             f"a connection may be a member of at most "
                             f"{config.max_groups_per_connection} groups "
                             f"(max_groups_per_connection)")
        broker.watch_connection(conn)
        version = cmd.version if isinstance(cmd.version, int) else 0
        refused: list[str] = []
        for group, raw, subs in entries:
            if not self._ensure_group(group, raw):
                refused.append(group)
                continue
            sg = broker.subscription_group_manager.get(group)
            notify = config.notify_consumer_ids_changed and (
                sg is None or sg.notify_consumer_ids_changed_enable
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
        for group in producer_groups:
            broker.producer_manager.register(
                group, ClientChannelInfo(conn, client_id, str(cmd.language), version)
            )
        if refused:
            more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
            return error(cmd, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                         f"subscription group [{refused[0]}] does not exist{more}")
        return ok(cmd)

    def _ensure_group(self, group: str, raw: dict) -> bool:
        """The group's config (created if allowed) and its %RETRY% topic; False when the
        group may not be created. A retry topic made for an auto-created group counts
        against max_auto_created_topics; past that cap the group gets none (a send-back
        then creates it or fails as any send does)."""
        broker = self.broker
        sgm = broker.subscription_group_manager
        if names.is_lmq(group):
            return True
        sg = sgm.find_or_create(group)
        if sg is None:
            return False
        tcm = broker.topic_config_manager
        retry = names.retry_topic(group)
        sys_flag = TopicSysFlag.UNIT_SUB if raw.get("unitMode") is True else 0
        if group in sgm.auto_created:
            tcm.create_retry_topic_in_send_message_method(retry, sys_flag)
        else:
            tcm.create_topic_in_send_back_method(
                retry, sg.retry_queue_nums, PermName.READ | PermName.WRITE, sys_flag
            )
        return True

    @handles(RequestCode.UNREGISTER_CLIENT)
    async def unregister_client(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        client_id = cmd.ext_str("clientID", required=True)
        producer_group = cmd.ext_str("producerGroup") or None  # C++ sends "" (docs/protocol.md §5.6)
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

    @handles(RequestCode.GET_CONSUMER_LIST_BY_GROUP)
    async def get_consumer_list(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        group = required_group(cmd, "consumerGroup")
        info = self.broker.consumer_manager.get(group)
        ids = info.client_ids() if info is not None else []
        if not ids:
            return error(cmd, ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return ok(cmd, body=json_body({"consumerIdList": ids}))

    @handles(RequestCode.CHECK_CLIENT_CONFIG)
    async def check_client_config(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        """CHECK_CLIENT_CONFIG: does the broker accept this subscription? (Java clients
        call it before subscribing with SQL92.)"""
        data = self._read_body(cmd)
        sub = data.get("subscriptionData") if isinstance(data, dict) else None
        if isinstance(sub, dict):
            etype, expression = sub.get("expressionType"), sub.get("subString")
            try:
                build_message_filter(
                    etype if isinstance(etype, str) else None,
                    expression if isinstance(expression, str) else None,
                )
            except FilterParseError as exc:
                return error(cmd, ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc))
        return ok(cmd)


def register(table, broker) -> None:
    register_handlers(table, ClientProcessor(broker))
