"""Request handlers of the name server (docs/protocol.md §4), one per request code.

All handlers are inline: they only touch in-memory tables and never wait.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections import Counter, deque
from dataclasses import dataclass, field

from core.namesrv.bodies import (
    decode_data_version,
    decode_register_body,
    encode_json,
    parse_inflated_register_body,
)
from core.namesrv.config import NamesrvConfig
from core.namesrv.kvconfig import NAMESPACE_ORDER_TOPIC_CONFIG, KVConfigManager
from core.namesrv.routes import RouteInfoManager
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode, ResponseCode
from core.remoting.inflate import inflate_async, run_large
from core.remoting.processor import ProcessorTable, RequestContext

__all__ = ["NamesrvProcessors", "NamesrvStats"]

log = logging.getLogger(__name__)

_RECENT_QUERIES = 256


@dataclass
class NamesrvStats:
    """Request counters, and the latest route queries (topic, found) for diagnostics."""

    requests: Counter[int] = field(default_factory=Counter)
    #: REGISTER_BROKERs refused because they would replace a live broker.
    refused_registrations: int = 0
    recent_route_queries: deque[tuple[str, bool]] = field(
        default_factory=lambda: deque(maxlen=_RECENT_QUERIES)
    )


def _ok(cmd: RemotingCommand, **kwargs: object) -> RemotingCommand:
    return cmd.make_response(ResponseCode.SUCCESS, **kwargs)


class NamesrvProcessors:
    """Binds a RouteInfoManager and a KVConfigManager to request codes."""

    def __init__(
        self,
        routes: RouteInfoManager,
        kv: KVConfigManager,
        config: NamesrvConfig,
    ) -> None:
        self.routes = routes
        self.kv = kv
        self.config = config
        self.stats = NamesrvStats()
        self.controller = None  # the HA controller when this name server runs it
        # Connection attribute marking that we watch its close (one callback each).
        self._watch_key = f"namesrv.{id(self)}.watched"
        # Ids of the open connections brokers registered through.
        self._open_channels: set[int] = set()

    def register(self, table: ProcessorTable) -> None:
        handlers = {
            RequestCode.REGISTER_BROKER: self.register_broker,
            RequestCode.UNREGISTER_BROKER: self.unregister_broker,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self.get_route,
            RequestCode.GET_BROKER_CLUSTER_INFO: self.get_cluster_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.get_all_topics,
            RequestCode.GET_TOPICS_BY_CLUSTER: self.get_topics_by_cluster,
            RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS: self.get_system_topics,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self.delete_topic,
            RequestCode.PUT_KV_CONFIG: self.put_kv,
            RequestCode.GET_KV_CONFIG: self.get_kv,
            RequestCode.DELETE_KV_CONFIG: self.delete_kv,
            RequestCode.GET_KVLIST_BY_NAMESPACE: self.get_kv_namespace,
            RequestCode.QUERY_DATA_VERSION: self.query_data_version,
            RequestCode.WIPE_WRITE_PERM_OF_BROKER: self.wipe_write_perm,
            RequestCode.ADD_WRITE_PERM_OF_BROKER: self.add_write_perm,
        }
        for code, handler in handlers.items():
            table.register(code, handler)

    # -- brokers ----------------------------------------------------------------------

    async def register_broker(self, ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        self.stats.requests[RequestCode.REGISTER_BROKER] += 1
        cluster = cmd.ext_str("clusterName", required=True)
        addr = cmd.ext_str("brokerAddr", required=True)
        name = cmd.ext_str("brokerName", required=True)
        broker_id = cmd.ext_int("brokerId", required=True)
        ha_addr = cmd.ext_str("haServerAddr", "")
        body = cmd.body_bytes()
        crc = cmd.ext_int("bodyCrc32", 0)
        # A peer-sent body may be 16 MiB (or inflate to the cap): the checksum, inflating
        # and parsing of large ones run in a worker thread (core.remoting.inflate).
        if crc and (await run_large(len(body), zlib.crc32, body) & 0x7FFFFFFF) != crc:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, "crc32 not match")
        try:
            if body and cmd.ext_bool("compressed", False):
                try:
                    raw = await inflate_async(body, self.config.max_register_body_bytes)
                except ValueError as exc:
                    raise ValueError(f"compressed register body: {exc}") from None
                reg = await run_large(len(raw), parse_inflated_register_body, raw)
            else:
                reg = await run_large(len(body), decode_register_body, body)
        except ValueError as exc:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"bad register body: {exc}")
        conn = ctx.connection
        conflict = self.routes.registration_conflict(
            name, broker_id, addr, conn.id, self._open_channels.__contains__
        )
        if conflict is not None and broker_id == 0 and self.controller is not None \
                and self.controller.is_master(name, addr):
            conflict = None  # the controller elected it: it replaces a paused old master
        if conflict is not None:
            self.stats.refused_registrations += 1
            log.warning("REGISTER_BROKER from %s refused: %s", ctx.remote_addr, conflict)
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, conflict)
        result = self.routes.register_broker(
            cluster,
            addr,
            name,
            broker_id,
            ha_addr,
            reg.topic_configs if body else None,
            reg.data_version,
            reg.filter_servers,
            channel=conn.id,
        )
        if not conn.attributes.get(self._watch_key):
            # A broker whose connection closes is dropped at once (docs/protocol.md §4).
            conn.attributes[self._watch_key] = True
            conn_id = conn.id
            self._open_channels.add(conn_id)

            def closed() -> None:
                self._open_channels.discard(conn_id)
                self.routes.on_channel_closed(conn_id)

            conn.add_close_callback(closed)
        ext = {}
        if result.ha_server_addr:
            ext["haServerAddr"] = result.ha_server_addr
        if result.master_addr:
            ext["masterAddr"] = result.master_addr
        order_conf = self.kv.namespace(NAMESPACE_ORDER_TOPIC_CONFIG)
        return _ok(
            cmd,
            ext_fields=ext or None,
            body=encode_json({"table": order_conf}) if order_conf else None,
        )

    async def unregister_broker(self, ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        self.routes.unregister_broker(
            cmd.ext_str("clusterName", required=True),
            cmd.ext_str("brokerAddr", required=True),
            cmd.ext_str("brokerName", required=True),
            cmd.ext_int("brokerId", required=True),
        )
        return _ok(cmd)

    async def query_data_version(
        self, ctx: RequestContext, cmd: RemotingCommand
    ) -> RemotingCommand:
        addr = cmd.ext_str("brokerAddr", required=True)
        try:
            version = decode_data_version(json.loads(cmd.body_bytes() or b"null"))
        except (ValueError, RecursionError) as exc:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"bad DataVersion body: {exc}")
        changed = self.routes.is_broker_topic_config_changed(addr, version)
        if not changed:
            # An unchanged broker asking is alive: this doubles as its heartbeat.
            self.routes.touch_broker(addr)
        stored = self.routes.broker_data_version(addr)
        return _ok(
            cmd,
            ext_fields={"changed": "true" if changed else "false"},
            body=encode_json(stored.to_json()) if stored is not None else None,
        )

    async def wipe_write_perm(self, ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        count = self.routes.wipe_write_perm_of_broker(cmd.ext_str("brokerName", required=True))
        return _ok(cmd, ext_fields={"wipeTopicCount": str(count)})

    async def add_write_perm(self, ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        count = self.routes.add_write_perm_of_broker(cmd.ext_str("brokerName", required=True))
        return _ok(cmd, ext_fields={"addTopicCount": str(count)})

    # -- routes and topics ------------------------------------------------------------

    async def get_route(self, ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        self.stats.requests[RequestCode.GET_ROUTEINFO_BY_TOPIC] += 1
        topic = cmd.ext_str("topic", required=True)
        order_conf = None
        if self.config.order_message_enable:
            order_conf = self.kv.get(NAMESPACE_ORDER_TOPIC_CONFIG, topic)
        route = self.routes.get_route(topic, order_conf)
        self.stats.recent_route_queries.append((topic, route is not None))
        if route is None:
            return cmd.make_response(
                ResponseCode.TOPIC_NOT_EXIST,
                f"No topic route info in name server for the topic: {topic}",
            )
        return _ok(cmd, body=encode_json(route))

    async def get_cluster_info(self, ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        return _ok(cmd, body=encode_json(self.routes.cluster_info()))

    async def get_all_topics(self, ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        return _ok(cmd, body=encode_json({"topicList": self.routes.all_topics(), "brokerAddr": None}))

    async def get_topics_by_cluster(
        self, ctx: RequestContext, cmd: RemotingCommand
    ) -> RemotingCommand:
        topics = self.routes.topics_by_cluster(cmd.ext_str("cluster", required=True))
        return _ok(cmd, body=encode_json({"topicList": topics, "brokerAddr": None}))

    async def get_system_topics(self, ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        topics, addr = self.routes.system_topics()
        return _ok(cmd, body=encode_json({"topicList": topics, "brokerAddr": addr}))

    async def delete_topic(self, ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        self.routes.delete_topic(
            cmd.ext_str("topic", required=True), cmd.ext_str("clusterName") or None
        )
        return _ok(cmd)

    # -- KV config --------------------------------------------------------------------

    async def put_kv(self, ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        self.kv.put(
            cmd.ext_str("namespace", required=True),
            cmd.ext_str("key", required=True),
            cmd.ext_str("value", required=True),
        )
        return _ok(cmd)

    async def get_kv(self, ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        namespace = cmd.ext_str("namespace", required=True)
        key = cmd.ext_str("key", required=True)
        value = self.kv.get(namespace, key)
        if value is None:
            return cmd.make_response(
                ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace} Key: {key}"
            )
        return _ok(cmd, ext_fields={"value": value})

    async def delete_kv(self, ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        self.kv.delete(cmd.ext_str("namespace", required=True), cmd.ext_str("key", required=True))
        return _ok(cmd)

    async def get_kv_namespace(self, ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        namespace = cmd.ext_str("namespace", required=True)
        table = self.kv.namespace(namespace)
        if table is None:
            return cmd.make_response(
                ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace}"
            )
        return _ok(cmd, body=encode_json({"table": table}))
