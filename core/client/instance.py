"""`ClientInstance`: what all producers and consumers of one process share (seed 000,
Java's MQClientInstance).

One instance per name-server set: it owns the remoting client, the route and broker
address tables, and one nursery in which every client task runs:

* route refresh from the name servers every 30 s (topics of every producer and consumer);
* heartbeats to every master broker every 30 s;
* consumer offsets persisted every 5 s;
* rebalance every 20 s, and at once on NOTIFY_CONSUMER_IDS_CHANGED (docs/protocol.md §5.14).

Leaving ``async with ClientInstance(...)`` shuts every producer and consumer down cleanly
(offsets persisted, queue locks released, UNREGISTER_CLIENT sent) and cancels the rest.
"""

from __future__ import annotations

import json
import logging
import random
from contextlib import AsyncExitStack
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

import trio

from core.acl import credentials_or_none, remoting_client
from core.client.api import MQClientAPI
from core.client.config import ClientConfig
from core.client.model import MASTER_ID, SubscriptionData, TopicRouteData
from core.common.codec import decode_record
from core.common.properties import MessageConst
from core.remoting.client import RemotingClient
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode, ResponseCode
from core.remoting.processor import ProcessorTable, RequestContext
from core.remoting.security import client_ssl_context

if TYPE_CHECKING:
    from core.common.message import MessageExt

log = logging.getLogger(__name__)

#: Time allowed for the clean part of a shutdown (persist offsets, unlock, unregister).
SHUTDOWN_GRACE_S = 5.0


class ProducerInner(Protocol):
    """What the instance needs from a producer."""

    group: str

    def publish_topics(self) -> list[str]: ...
    def on_route(self, topic: str, route: TopicRouteData) -> None: ...
    async def check_transaction_state(self, addr: str, msg: MessageExt, cmd: RemotingCommand) -> None: ...
    async def shutdown(self) -> None: ...


class ConsumerInner(Protocol):
    """What the instance needs from a consumer."""

    group: str

    def subscriptions(self) -> list[SubscriptionData]: ...
    def heartbeat_data(self) -> dict | None: ...
    def on_route(self, topic: str, route: TopicRouteData) -> None: ...
    async def do_rebalance(self) -> None: ...
    async def persist_offsets(self) -> None: ...
    def running_info(self) -> dict: ...
    async def reset_offsets(self, topic: str, offsets: dict) -> None: ...
    async def shutdown(self) -> None: ...


class ClientInstance:
    """Shared client state and background tasks; use as ``async with ClientInstance(...)``.

    Keyword arguments are ClientConfig fields (``namesrv_addr="127.0.0.1:9876"`` ...).
    """

    def __init__(self, config: ClientConfig | None = None, **kwargs: Any) -> None:
        if config is None:
            config = ClientConfig(**kwargs)
        elif kwargs:
            raise TypeError("pass either a ClientConfig or keyword settings, not both")
        self.config = config
        self.client_id = config.client_id
        self.processors = ProcessorTable()
        self.remoting: RemotingClient = remoting_client(
            credentials_or_none(config.access_key, config.secret_key),
            request_timeout=config.request_timeout,
            processors=self.processors,
            ssl_context=client_ssl_context(config.tls_ca_file, config.tls_verify)
            if config.tls else None,
        )
        self.api = MQClientAPI(self.remoting, config)
        self.routes: dict[str, TopicRouteData] = {}
        #: broker name -> {broker id: address}
        self.broker_addrs: dict[str, dict[int, str]] = {}
        #: brokers learnt from cluster info (LMQ consumers), kept by the offline-broker sweep
        self.pinned_brokers: dict[str, dict[int, str]] = {}
        self.producers: dict[str, ProducerInner] = {}
        self.consumers: dict[str, ConsumerInner] = {}
        self.nursery: trio.Nursery | None = None
        self._stack: AsyncExitStack | None = None
        self._rebalance_now = trio.Event()
        self._route_locks: dict[str, trio.Lock] = {}
        self._greeted: set[str] = set()
        self._register_processors()

    # -- lifetime -------------------------------------------------------------------

    async def __aenter__(self) -> ClientInstance:
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            await stack.enter_async_context(self.remoting)
            self.nursery = await stack.enter_async_context(trio.open_nursery())
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        self.nursery.start_soon(self._every, self.config.poll_namesrv_interval, self.refresh_routes)
        self.nursery.start_soon(self._every, self.config.heartbeat_interval, self.send_heartbeats)
        self.nursery.start_soon(self._every, self.config.persist_offset_interval, self.persist_offsets)
        self.nursery.start_soon(self._rebalance_loop)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        with trio.CancelScope(shield=True):
            with trio.move_on_after(SHUTDOWN_GRACE_S):
                await self.shutdown_members()
        if self.nursery is not None:
            self.nursery.cancel_scope.cancel()
        stack, self._stack = self._stack, None
        try:
            return await stack.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            # The nurseries wrap the body's own exception; hand it on unwrapped so callers
            # can `except MQClientError` around the whole block.
            if exc is not None and all(e is exc for e in _leaves(group)):
                return False
            raise

    async def shutdown_members(self) -> None:
        """Shut down every consumer (offsets persisted, locks released) and producer."""
        await _each(self.consumers, "shutdown", "shutdown of consumer %s failed")
        await _each(self.producers, "shutdown", "shutdown of producer %s failed")

    def _need_nursery(self) -> trio.Nursery:
        if self.nursery is None:
            raise RuntimeError("ClientInstance is not running (use 'async with')")
        return self.nursery

    # -- membership -----------------------------------------------------------------

    def register_producer(self, producer: ProducerInner) -> None:
        self._need_nursery()
        if producer.group in self.producers:
            raise ValueError(f"producer group {producer.group!r} already runs in this client instance")
        self.producers[producer.group] = producer

    def register_consumer(self, consumer: ConsumerInner) -> None:
        self._need_nursery()
        if consumer.group in self.consumers:
            raise ValueError(f"consumer group {consumer.group!r} already runs in this client instance")
        self.consumers[consumer.group] = consumer

    async def unregister(self, producer_group: str = "", consumer_group: str = "") -> None:
        """Forget a group locally and send UNREGISTER_CLIENT to every master (docs/protocol.md §5.6)."""
        if producer_group:
            self.producers.pop(producer_group, None)
        if consumer_group:
            self.consumers.pop(consumer_group, None)
        for addr in self.master_addrs():
            try:
                await self.api.unregister_client(addr, self.client_id, producer_group, consumer_group)
            except Exception as exc:
                log.debug("unregister %s/%s at %s failed: %r", producer_group, consumer_group, addr, exc)

    # -- routes and brokers -----------------------------------------------------------

    def master_addrs(self) -> list[str]:
        out = []
        for addrs in self.broker_addrs.values():
            addr = addrs.get(MASTER_ID)
            if addr and addr not in out:
                out.append(addr)
        return out

    def find_broker_addr(self, broker_name: str) -> str | None:
        """Master address of `broker_name` (pulls, sends and offsets go to the master)."""
        addrs = self.broker_addrs.get(broker_name) or self.pinned_brokers.get(broker_name)
        return addrs.get(MASTER_ID) if addrs else None

    def find_subscribe_addr(self, broker_name: str) -> str | None:
        """Where reads of `broker_name` go: its master, or when the route no longer lists
        one (master down), the slave with the lowest id (RocketMQ's
        findBrokerAddressInSubscribe; docs/ha.md)."""
        addrs = self.broker_addrs.get(broker_name) or self.pinned_brokers.get(broker_name)
        if not addrs:
            return None
        return addrs.get(MASTER_ID) or addrs[min(addrs)]

    def find_broker_addr_by_topic(self, topic: str) -> str | None:
        """A master holding `topic` (Java picks one at random, for GET_CONSUMER_LIST...)."""
        route = self.routes.get(topic)
        if not route or not route.broker_datas:
            return None
        candidates = [b.master_addr() for b in route.broker_datas if b.master_addr()]
        return random.choice(candidates) if candidates else None

    def pin_brokers(self, brokers: dict[str, dict[int, str]]) -> None:
        """Brokers known from cluster info rather than a route (LMQs have no route, docs/protocol.md §10.2)."""
        self.pinned_brokers = dict(brokers)
        for name, addrs in brokers.items():
            self.broker_addrs.setdefault(name, dict(addrs))
        self._greet_new_brokers()

    def _greet_new_brokers(self) -> None:
        """Heartbeat a broker as soon as it becomes known, not up to 30 s later: it needs
        our producer groups for transaction checks and our consumers for rebalancing."""
        if self.nursery is None:
            return
        for addr in self.master_addrs():
            if addr not in self._greeted:
                self._greeted.add(addr)
                self.nursery.start_soon(self._heartbeat_one, addr)

    async def update_route(self, topic: str) -> TopicRouteData | None:
        """Fetch `topic`'s route; on a change, tell every producer and consumer. Returns the
        route now known (None when the name servers have none)."""
        lock = self._route_locks.setdefault(topic, trio.Lock())
        async with lock:
            route = await self.api.get_route(topic)
            if route is None:
                return None
            old = self.routes.get(topic)
            if old is None or old.signature() != route.signature():
                self.routes[topic] = route
                for bd in route.broker_datas:
                    self.broker_addrs[bd.broker_name] = dict(bd.broker_addrs)
                self._greet_new_brokers()
                for producer in list(self.producers.values()):
                    producer.on_route(topic, route)
                for consumer in list(self.consumers.values()):
                    consumer.on_route(topic, route)
            return route

    def _topics_of_interest(self) -> set[str]:
        topics: set[str] = set()
        for producer in self.producers.values():
            topics.update(producer.publish_topics())
        for consumer in self.consumers.values():
            topics.update(s.topic for s in consumer.subscriptions())
        return topics

    async def refresh_routes(self) -> None:
        """The 30 s route poll, then drop brokers no route mentions (cleanOfflineBroker)."""
        for topic in sorted(self._topics_of_interest()):
            try:
                await self.update_route(topic)
            except Exception as exc:
                log.debug("route refresh of %s failed: %r", topic, exc)
        live: set[str] = set(self.pinned_brokers)
        for route in self.routes.values():
            live.update(b.broker_name for b in route.broker_datas)
        for name in list(self.broker_addrs):
            if name not in live:
                del self.broker_addrs[name]
        self._greeted &= set(self.master_addrs())

    # -- heartbeats -----------------------------------------------------------------

    def heartbeat_data(self) -> dict:
        """HeartbeatData in Java's form (enum names, sets always present, docs/protocol.md §6.2)."""
        consumers = []
        for consumer in self.consumers.values():
            data = consumer.heartbeat_data()
            if data is not None:
                consumers.append(data)
        return {
            "clientID": self.client_id,
            "producerDataSet": [{"groupName": g} for g in self.producers],
            "consumerDataSet": consumers,
        }

    async def send_heartbeats(self) -> None:
        """HEART_BEAT to every master broker (docs/protocol.md §5.5); failures only logged."""
        data = self.heartbeat_data()
        if not data["producerDataSet"] and not data["consumerDataSet"]:
            return

        async with trio.open_nursery() as nursery:
            for addr in self.master_addrs():
                self._greeted.add(addr)
                nursery.start_soon(self._heartbeat_one, addr, data)

    async def _heartbeat_one(self, addr: str, data: dict | None = None) -> None:
        if data is None:
            data = self.heartbeat_data()
            if not data["producerDataSet"] and not data["consumerDataSet"]:
                return
        try:
            await self.api.heartbeat(addr, data)
        except Exception as exc:
            # Try again with the next route change instead of waiting for the 30 s round.
            self._greeted.discard(addr)
            log.debug("heartbeat to %s failed: %r", addr, exc)

    # -- consumers' periodic work -------------------------------------------------------

    async def persist_offsets(self) -> None:
        for consumer in list(self.consumers.values()):
            try:
                await consumer.persist_offsets()
            except Exception as exc:
                log.debug("offset persist of %s failed: %r", consumer.group, exc)

    def rebalance_immediately(self) -> None:
        """Wake the rebalance task (NOTIFY_CONSUMER_IDS_CHANGED, a consumer started)."""
        self._rebalance_now.set()

    async def rebalance(self) -> None:
        await _each(self.consumers, "do_rebalance", "rebalance of %s failed")

    async def _rebalance_loop(self) -> None:
        while True:
            with trio.move_on_after(self.config.rebalance_interval):
                await self._rebalance_now.wait()
            self._rebalance_now = trio.Event()
            await self.rebalance()

    async def _every(self, interval: float, fn) -> None:
        while True:
            await trio.sleep(interval)
            try:
                await fn()
            except Exception:
                log.exception("periodic task %s failed", getattr(fn, "__name__", fn))

    # -- requests from brokers (docs/protocol.md §1.5) -------------------------------------------------

    def _register_processors(self) -> None:
        p = self.processors
        p.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_notify_ids_changed)
        p.register(RequestCode.CHECK_TRANSACTION_STATE, self._on_check_transaction, inline=False)
        p.register(RequestCode.GET_CONSUMER_RUNNING_INFO, self._on_running_info)
        p.register(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, self._on_reset_offset, inline=False)

    async def _on_notify_ids_changed(self, ctx: RequestContext, cmd: RemotingCommand):
        group = cmd.ext_str("consumerGroup", "")
        if not group or group in self.consumers:
            self.rebalance_immediately()
        return None

    async def _on_check_transaction(self, ctx: RequestContext, cmd: RemotingCommand):
        # The body is the half message with its real topic restored (docs/protocol.md §5.13).
        try:
            msg = decode_record(cmd.body_bytes(), decompress=True)
        except Exception as exc:
            log.warning("undecodable CHECK_TRANSACTION_STATE from %s: %r", ctx.remote_addr, exc)
            return None
        group = msg.properties.get(MessageConst.PRODUCER_GROUP, "")
        producer = self.producers.get(group)
        if producer is None:
            log.debug("transaction check for unknown producer group %r", group)
            return None
        await producer.check_transaction_state(ctx.remote_addr, msg, cmd)
        return None

    async def _on_running_info(self, ctx: RequestContext, cmd: RemotingCommand):
        consumer = self.consumers.get(cmd.ext_str("consumerGroup", "") or "")
        if consumer is None:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR,
                                     "The Consumer Group not exist in this consumer")
        info = consumer.running_info()
        info.setdefault("properties", {})["clientId"] = self.client_id
        return cmd.make_response(ResponseCode.SUCCESS, body=json.dumps(info).encode())

    async def _on_reset_offset(self, ctx: RequestContext, cmd: RemotingCommand):
        # Body: {"offsetTable": [{topic, brokerName, queueId, offset}]} or Java's map form.
        consumer = self.consumers.get(cmd.ext_str("group", "") or "")
        if consumer is None or not cmd.body:
            return None
        from core.client.model import MessageQueue, loads_lenient

        try:
            obj = loads_lenient(cmd.body_bytes())
            table = obj.get("offsetTable") or []
            offsets = {}
            if isinstance(table, dict):
                table = [dict(json.loads(k), offset=v) for k, v in table.items()]
            for item in table:
                offsets[MessageQueue.from_json(item)] = int(item["offset"])
        except Exception as exc:
            log.warning("bad RESET_CONSUMER_CLIENT_OFFSET body: %r", exc)
            return None
        await consumer.reset_offsets(cmd.ext_str("topic", "") or "", offsets)
        return None


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for e in group.exceptions:
        if isinstance(e, BaseExceptionGroup):
            out.extend(_leaves(e))
        else:
            out.append(e)
    return out


async def _each(members: dict, method: str, failed: str) -> None:
    """Await `method` of every member (of a snapshot: it may change meanwhile); a failure
    is logged with its traceback (`failed` % the member's group) and the others go on."""
    for member in list(members.values()):
        try:
            await getattr(member, method)()
        except Exception:
            log.exception(failed, member.group)
