"""`BrokerController`: one broker — store, metadata managers, processors, timers, and
registration with the name servers (docs/protocol.md §4.2, §5; docs/architecture.md §3).

Lifetime (trio style, everything owned by `serve`'s nursery):

    start:    load metadata -> open the store (recovery, in a worker thread) -> services
              load -> listen -> timers -> register with every name server
    stop():   stop accepting and drop connections -> release held pulls ->
              UNREGISTER_BROKER -> persist offsets/groups/topics/services ->
              flush and close the store

`serve` also runs the shutdown half when it is cancelled from outside (shielded, bounded).
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import time
import zlib
from collections.abc import Callable

import trio

from core.acl import credentials_or_none, guard_from_file, remoting_client
from core.broker.arrival import ArrivalNotifier, LmqListener
from core.broker.clients import ConsumerManager, ProducerManager
from core.broker.config import BrokerConfig
from core.broker.flush import GroupCommitService, async_flush_loop
from core.broker.ha import ControllerLink, HAMaster, HASlave, SyncStatus
from core.broker.lock_manager import RebalanceLockManager
from core.broker.long_polling import PullRequestHoldService
from core.broker.offsets import ConsumerOffsetManager
from core.broker.processors.common import json_body
from core.broker.schedule import ScheduleMessageService, parse_delay_levels
from core.broker.subscription_group import SubscriptionGroupManager
from core.broker.topic_config import TopicConfigManager
from core.broker.transaction import TransactionalMessageService
from core.common.codec import encode_host
from core.common.message import InnerMessage
from core.common.properties import MessageConst
from core.common.sysflag import PermName
from core.remoting.client import RemotingClient
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode
from core.remoting.errors import RemotingError
from core.remoting.processor import ProcessorTable
from core.remoting.security import client_ssl_context
from core.remoting.server import RemotingServer
from core.store import MessageStore, PutResult, PutStatus, StoreConfig

log = logging.getLogger(__name__)

# Processor modules; each has register(table, broker).
PROCESSOR_MODULES = (
    "send",
    "pull",
    "client",
    "offsets",
    "query",
    "admin",
    "send_back",
    "end_transaction",
    "lock",
    "pop",  # RocketMQ 5 POP (docs/pop.md); sets broker.pop_service
    "recall",  # RECALL_MESSAGE of delayed messages; sets schedule_service.recalls
)

# Upper bound of each shutdown step (a dead name server must not hang the exit).
UNREGISTER_TIMEOUT_S = 3.0

_WATCHED = "lmq.broker.watched"


def pick_free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for port=0 configs and tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host if host not in ("", "0.0.0.0") else "0.0.0.0", 0))
        return s.getsockname()[1]


class BrokerController:
    """A master broker: the store, the managers (topics, groups, offsets, clients), the
    services (delay levels, transactions, queue locks) and the processor table. The
    services and processors reach everything through the attributes set in __init__;
    every writer goes through `put_message(s)` so the flush mode holds."""

    def __init__(self, config: BrokerConfig) -> None:
        if config.port == 0:
            # STOREHOST is written into every record, so the port must be known before
            # the store opens.
            config.port = pick_free_port(config.host)
        self.config = config
        self.config_dir = os.path.join(config.data_dir, "config")
        self.broker_addr: str = config.broker_addr
        self.store_host: bytes = encode_host(self.broker_addr)
        self.sync_flush = config.flush == "sync"
        self.boot_timestamp = int(time.time() * 1000)
        self.closing = False

        self.store = MessageStore(
            StoreConfig(
                store_dir=config.data_dir,
                commitlog_file_size=config.commitlog_file_size,
                consume_queue_units_per_file=config.consume_queue_units_per_file,
                preallocate_files=config.preallocate_files,
                flush_mode=config.flush,
                flush_interval_ms=config.flush_interval_ms,
                max_message_size=config.max_message_size,
                enable_lmq=config.enable_lmq,
                enable_multi_dispatch=config.enable_lmq,
                file_reserved_hours=config.file_reserved_hours,
                max_transfer_bytes=config.max_pull_bytes,
                max_transfer_count=config.max_pull_msg_nums,
            ),
            store_host=self.store_host,
        )
        self.topic_config_manager = TopicConfigManager(
            self.config_dir,
            broker_name=config.broker_name,
            cluster_name=config.cluster_name,
            default_topic_queue_nums=config.default_topic_queue_nums,
            auto_create_topic=config.topic_auto_creation,
            max_auto_created_topics=config.max_auto_created_topics,
            cluster_topic_enable=config.cluster_topic_enable,
            broker_topic_enable=config.broker_topic_enable,
            enable_lmq=config.enable_lmq,
            schedule_queue_nums=len(parse_delay_levels(config.message_delay_level)),
        )
        self.topic_config_manager.on_change = self.request_register
        self.subscription_group_manager = SubscriptionGroupManager(
            self.config_dir,
            auto_create=config.auto_create_subscription_group,
            retry_max_times=config.retry_max_times,
            max_auto_created=config.max_auto_created_groups,
        )
        self.offset_manager = ConsumerOffsetManager(self.config_dir)
        self.consumer_manager = ConsumerManager(
            expiry_s=config.client_channel_expiry_s, on_change=self._on_consumer_change
        )
        self.producer_manager = ProducerManager(expiry_s=config.client_channel_expiry_s)
        self.pull_hold_service = PullRequestHoldService()
        self.arrivals = ArrivalNotifier(self.pull_hold_service)  # held pulls + listeners
        self.store.dispatch_listener = self.arrivals.on_dispatch
        self.store.lmq_dispatch_listener = self.arrivals.on_dispatch_lmqs
        self._group_commit = (
            GroupCommitService(self.store, config.sync_flush_timeout_ms / 1000.0)
            if self.sync_flush else None
        )

        # Services: delay levels, transactions, orderly-consumption queue locks.
        self.schedule_service = ScheduleMessageService(self)
        self.transaction_service = TransactionalMessageService(self)
        self.lock_manager = RebalanceLockManager(self)

        # Replication (docs/ha.md): a master streams to slaves when ha_secret is set.
        # With a controller (controller_addr) the role changes at run time: every broker
        # has both sides, and writes need the controller's lease (ha_link.can_write).
        self.ha_link = ControllerLink(self) if config.controller_addr else None
        self.ha_master = HAMaster(self) if config.broker_role != "SLAVE" and config.ha_secret else None
        self.ha_slave = (HASlave(self) if config.broker_role == "SLAVE" or self.ha_link is not None
                         else None)
        self.sync_master = config.broker_role == "SYNC_MASTER"
        self.restart_hook: Callable[[], None] | None = None  # `lmq broker`: re-exec
        self._write_services_started = False

        self.table = self.build_processor_table()
        if config.acl_enable:
            self.table.guard = guard_from_file(config.acl_file)
        self.namesrv_credentials = credentials_or_none(
            config.namesrv_access_key, config.namesrv_secret_key
        )
        self.server: RemotingServer | None = None
        self.client: RemotingClient | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._stop_requested = False
        self._register_event: trio.Event | None = None
        self._register_failing: set[str] = set()
        self.started = False

    # ------------------------------------------------------------------ wiring
    def build_processor_table(self) -> ProcessorTable:
        """A ProcessorTable with every broker processor registered."""
        table = ProcessorTable()
        for name in PROCESSOR_MODULES:
            module = importlib.import_module(f"core.broker.processors.{name}")
            module.register(table, self)
        if self.config.apache_strict:
            from core.broker.strict_mode import restrict

            restrict(table)
        return table

    @property
    def services(self) -> list:
        return [s for s in (self.schedule_service, self.transaction_service, self.lock_manager,
                            getattr(self, "pop_service", None))  # set by processors/pop.py
                if s is not None]

    def add_lmq_dispatch_listener(self, fn: LmqListener, other_queues=None) -> None:
        """ArrivalNotifier.add_lmq: `fn(names, max_offsets)` once per multi-dispatching
        put, `other_queues` for every other dispatch (core/broker/arrival.py)."""
        self.arrivals.add_lmq(fn, other_queues)

    def remove_dispatch_listener(self, fn: Callable[..., None]) -> None:
        self.arrivals.remove(fn)

    def encode_client_host(self, remote_addr: str) -> bytes:
        """BORNHOST of a client connection (IPv4 + port; docs/protocol.md §7.1)."""
        return encode_host(remote_addr)

    # ------------------------------------------------------------------ writes
    async def put_message(self, inner: InnerMessage) -> PutResult:
        """Append one message; under SYNC_FLUSH wait for the group commit covering it
        (FLUSH_DISK_TIMEOUT when it does not come within `sync_flush_timeout_ms`)."""
        if self.closing or not self._may_write():
            return self._refused()
        result = self.store.put(inner)
        if result.status is not PutStatus.OK or (
            self.ha_link is None and self.ha_master is None and self._group_commit is None
            and not self.sync_master and not self.topic_config_manager.persister.dirty
        ):
            return result  # _after_put would find nothing to wait for (the usual put)
        return await self._after_put(
            result, (inner.topic, inner.properties.get(MessageConst.REAL_TOPIC))
        )

    async def put_messages(self, inners: list[InnerMessage]) -> PutResult:
        """Append a batch (same topic and queue, consecutive offsets)."""
        if self.closing or not self._may_write():
            return self._refused()
        result = self.store.put_batch(inners)
        first = inners[0] if isinstance(inners, list) and inners else inners
        return await self._after_put(result, (getattr(first, "topic", None),))

    def _may_write(self) -> bool:
        if self.ha_link is not None:
            return self.ha_link.can_write()
        return self.ha_slave is None

    def _refused(self) -> PutResult:
        if self.closing:
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, "broker is shutting down")
        if self.ha_link is not None and self.ha_link.role == "MASTER":
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, "no write lease from the controller")
        # RocketMQ's slave store answers SERVICE_NOT_AVAILABLE to a put.
        return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, "the broker is a slave")

    async def _after_put(self, result: PutResult, topics: tuple[str | None, ...]) -> PutResult:
        if result.status is not PutStatus.OK:
            return result
        link = self.ha_link
        if link is not None and not link.can_write():
            # The lease ran out while the record was appended (a pause between the check
            # and the write): it is not acknowledged, and the next master does not have
            # it; this broker cuts it when it rejoins as a slave (docs/ha.md).
            result.status = PutStatus.SERVICE_NOT_AVAILABLE
            result.remark = "write lease lapsed"
            return result
        if self.topic_config_manager.persister.dirty:
            # A topic created for this write reaches the disk (in a thread, persister.py)
            # before the write is acknowledged: a killed process must not leave
            # acknowledged records of a topic it forgot. Other writes do not wait.
            try:
                for topic in topics:
                    if topic:
                        await self.topic_config_manager.wait_created_durable(topic)
            except OSError:
                result.status = PutStatus.FLUSH_DISK_TIMEOUT
        ha = self.ha_master
        if ha is not None:
            ha.notify_append()
        if self._group_commit is not None:
            if not await self._group_commit.wait_flushed(result.end_offset):
                result.status = PutStatus.FLUSH_DISK_TIMEOUT
        if self.sync_master and result.status is PutStatus.OK:
            st = await ha.wait_replicated(result.end_offset, self.config.sync_slave_timeout_s)
            if st != SyncStatus.OK:
                result.status = PutStatus[st]
        return result

    # ------------------------------------------------------------------ clients
    def watch_connection(self, conn) -> None:
        """Drop the connection's producer/consumer channels when it closes (docs/protocol.md §5.5)."""
        attributes = getattr(conn, "attributes", None)
        if attributes is None or attributes.get(_WATCHED):
            return
        attributes[_WATCHED] = True
        conn.add_close_callback(lambda: self._on_connection_closed(conn))

    def _on_connection_closed(self, conn) -> None:
        self.consumer_manager.connection_closed(conn)
        self.producer_manager.connection_closed(conn)

    def _on_consumer_change(self, group: str, connections: list) -> None:
        nursery = self._nursery
        if nursery is None or self.closing:
            return
        for conn in connections:
            try:
                nursery.start_soon(self._notify_ids_changed, conn, group)
            except RuntimeError:  # nursery closing
                return

    async def _notify_ids_changed(self, conn, group: str) -> None:
        """NOTIFY_CONSUMER_IDS_CHANGED, one-way (docs/protocol.md §5.14); a slow peer never blocks us."""
        cmd = RemotingCommand.request(
            RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group}
        )
        with trio.move_on_after(self.config.notify_timeout_s):
            try:
                await conn.invoke_oneway(cmd)
            except (RemotingError, OSError):
                pass

    # ------------------------------------------------------------------ name servers
    def request_register(self) -> None:
        """Register again soon (a topic changed)."""
        if self._register_event is not None:
            self._register_event.set()

    def _register_command(self) -> RemotingCommand:
        cfg = self.config
        wrapper = self.topic_config_manager.wrapper_json()
        if not (PermName.is_writeable(cfg.broker_permission)
                and PermName.is_readable(cfg.broker_permission)):
            for tc in wrapper["topicConfigTable"].values():
                tc["perm"] &= cfg.broker_permission
        body = json_body({"topicConfigSerializeWrapper": wrapper, "filterServerList": []})
        ip = cfg.advertised_ip
        ext = {
            "brokerName": cfg.broker_name,
            "brokerAddr": self.broker_addr,
            "clusterName": cfg.cluster_name,
            "haServerAddr": f"{ip}:{self.ha_port}",
            "brokerId": str(self.registered_id),
            "compressed": "false",
            "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF),
        }
        return RemotingCommand.request(RequestCode.REGISTER_BROKER, ext, body)

    @property
    def registered_id(self) -> int:
        """The id in the routes: 0 while this broker holds the write lease."""
        link = self.ha_link
        if link is not None:
            return 0 if link.can_write() else self.config.broker_id
        return self.config.broker_id

    # -- role changes under a controller (core/broker/ha/controller_link.py)
    def on_promoted(self) -> None:
        """Start what only a master runs (delay levels, transaction checks, POP)."""
        self._start_write_services()
        self.request_register()

    def _start_write_services(self) -> None:
        nursery = self._nursery
        if self._write_services_started or nursery is None:
            return
        self._write_services_started = True
        for service in self.services:
            run = getattr(service, "run", None)
            if run is not None and service is not self.lock_manager:
                nursery.start_soon(run)

    def restart(self) -> None:
        """Deposed: stop; `lmq broker` then starts again as a slave (re-exec)."""
        from core.broker.ha import controller_link

        hook = self.restart_hook or controller_link.PROCESS_RESTART_HOOK
        if hook is not None:
            hook()
        else:
            self.stop()

    @property
    def ha_port(self) -> int:
        if self.ha_master is not None and self.ha_master.port is not None:
            return self.ha_master.port
        port = self.config.ha_listen_port
        return self.config.port + 1 if port is None else port

    async def register_all(self) -> None:
        """REGISTER_BROKER to every configured name server, concurrently."""
        if self.client is None or not self.config.namesrv_addrs:
            return
        async with trio.open_nursery() as nursery:
            for addr in self.config.namesrv_addrs:
                nursery.start_soon(self._register_one, addr)

    async def _register_one(self, addr: str) -> None:
        cmd = self._register_command()
        try:
            resp = await self.client.invoke(addr, cmd, self.config.register_timeout_s)
            failure = None if resp.code == 0 else f"code {resp.code} {resp.remark}"
        except (RemotingError, OSError) as exc:
            failure = repr(exc)
        if failure is None:
            if addr in self._register_failing:
                self._register_failing.discard(addr)
                log.info("registered with name server %s again", addr)
        elif addr not in self._register_failing:
            # Logged once per outage, not every 30 s.
            self._register_failing.add(addr)
            log.warning("register to name server %s failed: %s", addr, failure)

    async def _register_loop(self) -> None:
        # serve() registered once before reporting itself started (and made the event).
        while True:
            with trio.move_on_after(self.config.register_interval_s):
                await self._register_event.wait()
            # A new event before registering: a request made meanwhile is not lost.
            self._register_event = trio.Event()
            await self.register_all()

    async def _unregister_all(self) -> None:
        cfg = self.config
        if not cfg.namesrv_addrs:
            return
        ext = {
            "brokerName": cfg.broker_name,
            "brokerAddr": self.broker_addr,
            "clusterName": cfg.cluster_name,
            "brokerId": str(self.registered_id),
        }
        # A fresh client: this runs after the serving nursery (and its client) is gone.
        with trio.move_on_after(UNREGISTER_TIMEOUT_S):
            async with remoting_client(
                self.namesrv_credentials, request_timeout=UNREGISTER_TIMEOUT_S,
                ssl_context=self._namesrv_ssl()
            ) as client:
                async def one(addr: str) -> None:
                    try:
                        await client.invoke(
                            addr, RemotingCommand.request(RequestCode.UNREGISTER_BROKER, dict(ext))
                        )
                    except (RemotingError, OSError) as exc:
                        log.info("unregister from %s failed: %r", addr, exc)

                async with trio.open_nursery() as nursery:
                    for addr in cfg.namesrv_addrs:
                        nursery.start_soon(one, addr)

    # ------------------------------------------------------------------ timers
    async def _every(self, interval_s: float, fn: Callable[[], object], name: str) -> None:
        while True:
            await trio.sleep(interval_s)
            try:
                fn()
            except Exception:
                log.exception("periodic task %s failed", name)

    def _scan_clients(self) -> None:
        expired = self.consumer_manager.scan_expired() + self.producer_manager.scan_expired()
        for group, client_id, conn in expired:
            log.info("client %s of group %s expired (no heartbeat)", client_id, group)
            # Java's housekeeping closes a silent client's channel: a peer that stopped
            # heartbeating is gone, or will reconnect and register again.
            conn.close()

    async def _persist_offsets_loop(self) -> None:
        """Java's flushConsumerOffsetInterval: encode on the loop, fsync in a thread."""
        while True:
            await trio.sleep(self.config.flush_consumer_offset_interval_s)
            try:
                payload = self.offset_manager.snapshot()
                if payload is not None:
                    await trio.to_thread.run_sync(self.offset_manager.write, payload)
            except Exception:
                log.exception("persisting consumer offsets failed")

    async def _retention_loop(self) -> None:
        """Retention every clean_interval_s; the fsyncs a deletion needs first run in a
        worker thread so a pass never stalls the event loop."""
        store = self.store
        while True:
            await trio.sleep(self.config.clean_interval_s)
            try:
                now_ms = time.time_ns() // 1_000_000
                if not store.retention_due(now_ms):
                    continue
                await trio.to_thread.run_sync(store.prepare_retention)
                store.clean_expired(now_ms)
            except Exception:
                log.exception("periodic task retention failed")

    # ------------------------------------------------------------------ lifetime
    def load(self) -> None:
        """Read persisted metadata (sync; before the store opens)."""
        os.makedirs(self.config_dir, exist_ok=True)
        self.topic_config_manager.load()
        self.subscription_group_manager.load()
        self.offset_manager.load()

    def _namesrv_ssl(self):
        """TLS context towards the name servers (None: plain TCP)."""
        if not getattr(self.config, "namesrv_tls", False):
            return None
        return client_ssl_context(self.config.tls_ca_file, self.config.tls_verify)

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run the broker until `stop()` or cancellation; reports itself when listening."""
        self._stop = trio.Event()
        if self._stop_requested:
            self._stop.set()
        self._register_event = trio.Event()
        self.load()
        if self.ha_link is not None:
            # Learn the role first: a deposed master cuts what no later master has.
            async with remoting_client(
                self.namesrv_credentials, request_timeout=self.config.register_timeout_s,
                ssl_context=self._namesrv_ssl()
            ) as client:
                await self.ha_link.bootstrap(client)
        await trio.to_thread.run_sync(self.store.start)
        try:
            for service in self.services:
                service.load()
            async with remoting_client(
                self.namesrv_credentials, request_timeout=self.config.register_timeout_s,
                ssl_context=self._namesrv_ssl()
            ) as client:
                self.client = client
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    self.server = RemotingServer.from_config(self.table, self.config, "broker")
                    await nursery.start(self.server.serve)
                    if self._group_commit is not None:
                        await nursery.start(self._group_commit.run)
                    else:
                        nursery.start_soon(
                            async_flush_loop, self.store, self.config.flush_interval_ms
                        )
                    for service in self.services:
                        run = getattr(service, "run", None)
                        # A slave writes nothing: delay levels, transaction checks and
                        # POP revives run on the master only (docs/ha.md).
                        if run is not None and (self.ha_slave is None
                                                or service is self.lock_manager):
                            await nursery.start(run)
                    self._write_services_started = self.ha_slave is None
                    if self.ha_master is not None:
                        await nursery.start(self.ha_master.serve)
                    if self.ha_slave is not None:
                        await nursery.start(self.ha_slave.run)
                    if self.ha_link is not None:
                        await self.ha_link.beat()  # role (and lease) before registering
                        await nursery.start(self.ha_link.run)
                    nursery.start_soon(self._persist_offsets_loop)
                    # Topics and groups: written off the loop as they change (persister.py).
                    await nursery.start(self.topic_config_manager.persister.run)
                    await nursery.start(self.subscription_group_manager.persister.run)
                    nursery.start_soon(
                        self._every, self.config.client_scan_interval_s, self._scan_clients,
                        "client scan",
                    )
                    nursery.start_soon(self._retention_loop)
                    # Register before reporting started, so a client that starts with
                    # us finds our routes at once (bounded by register_timeout_s).
                    await self.register_all()
                    nursery.start_soon(self._register_loop)
                    self.started = True
                    log.info(
                        "broker %s (%s) serving on %s:%d, advertised %s, flush %s",
                        self.config.broker_name, self.config.cluster_name, self.config.host,
                        self.config.port, self.broker_addr, self.config.flush,
                    )
                    task_status.started(self)
                    await self._stop.wait()
                    self._begin_close()
                    nursery.cancel_scope.cancel()
        finally:
            self._begin_close()
            with trio.CancelScope(shield=True):
                await self._shutdown()

    def stop(self) -> None:
        """Ask `serve` to shut down cleanly."""
        self._stop_requested = True
        if self._stop is not None:
            self._stop.set()

    def _begin_close(self) -> None:
        """Stop accepting and answering: no new connections, held pulls released."""
        self.closing = True
        if self.server is not None:
            self.server.close()
        self.pull_hold_service.wake_all()
        if self._group_commit is not None:
            self._group_commit.release_all()

    async def _shutdown(self) -> None:
        self._nursery = None
        self.client = None
        if self.started:
            await self._unregister_all()
        for service in self.services:
            try:
                service.persist()
            except Exception:
                log.exception("persisting %s failed", type(service).__name__)
        try:
            self.offset_manager.persist(force=True)
            self.subscription_group_manager.persist(force=True)
            self.topic_config_manager.persist(force=True)
        except Exception:
            log.exception("persisting broker metadata failed")
        try:
            await trio.to_thread.run_sync(self.store.shutdown)
        except Exception:
            log.exception("closing the store failed")
        self.started = False
        log.info("broker %s stopped", self.config.broker_name)


__all__ = ["BrokerController", "pick_free_port"]
