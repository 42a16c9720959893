"""`MqttGateway`: listeners (TCP, WebSocket, TLS) and the gateway's lifetime.

One trio nursery per gateway (listeners, the broker link's dispatcher, the state flusher,
the session expiry tick, `$SYS` publishing) and one per connection. The gateway reaches
the brokers only through `core.client` (`BrokerLink`), in-process when embedded in
`lmq serve`, over TCP for `lmq mqtt --namesrv-addr ...`.

    async with ClientInstance(namesrv_addr=...) as client:
        gateway = MqttGateway(MqttConfig(port=1883), client)
        await nursery.start(gateway.serve)      # returns once listening
        ...
        gateway.stop()
"""

from __future__ import annotations

import gc
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from functools import partial

import trio

from core.client import ClientInstance
from gateway.mqtt.auth import Authenticator
from gateway.mqtt.broker_link import RETAINED_LMQ, BrokerLink
from gateway.mqtt.cluster_sessions import ClusterSessions
from gateway.mqtt.config import MqttConfig, host_is_loopback
from gateway.mqtt.connection import Connection
from gateway.mqtt.message import MqttMessage
from gateway.mqtt.registry import SessionRegistry
from gateway.mqtt.retained import RetainedFollower, RetainedStore
from gateway.mqtt.session import Inflight
from gateway.mqtt.session_store import SessionStore
from gateway.mqtt.sweep import sweep
from gateway.mqtt.sys_topics import sys_loop
from gateway.mqtt.transport import accept_websocket, server_ssl_context
from gateway.routing.bridge import LOCAL_WRITERS
from gateway.routing.client_log import ClientLog
from gateway.routing.route_log import RouteLog, RouteLogConfig
from gateway.routing.route_table import Route

__all__ = ["MqttGateway", "Stats"]

log = logging.getLogger(__name__)

#: Time a clean shutdown gives connections to receive their DISCONNECT.
SHUTDOWN_GRACE_S = 3.0
#: How often read deadlines are checked: a keep alive or partial-packet timeout fires up
#: to this much late.
READ_SWEEP_S = 0.25
#: How often an embedded gateway (`lmq serve`) looks for other MQTT gateways in the route
#: log's consumer group (GET_CONSUMER_LIST_BY_GROUP, a read).
PEERS_CHECK_S = 2.0
#: Route-log members that write MQTT LMQs too: other MQTT gateways, and writers that are
#: no gateway (the Spark sink's mqttTopic rows join as "writer-…"; they apply no routes,
#: so no SUBSCRIBE waits for them).
FOREIGN_WRITER_PREFIXES = ("mqtt-", "writer-", "amqp-")  # amqp-: the amq.topic bridge


@dataclass
class Stats:
    """Live counters, published under `$SYS/broker/...`."""

    connections: int = 0  # open sockets, counted from accept (max_connections)
    clients: int = 0  # connected MQTT clients
    msgs_in: int = 0
    msgs_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    dropped: int = 0  # expired, too large, or skipped by a lag / retention cut
    dropped_too_large: int = 0  # of `dropped`: over the client's Maximum Packet Size
    dropped_lag: int = 0  # of `dropped`: skipped by a lag / retention cut
    started: float = field(default_factory=time.monotonic)


class MqttGateway:
    """The MQTT server of one process (see the module doc)."""

    def __init__(self, config: MqttConfig, client: ClientInstance, *,
                 route_config: RouteLogConfig | None = None, shared_lmqs: bool = False,
                 gateway_id: str | None = None) -> None:
        self.config = config
        self.client = client
        #: the shared routing table (set in serve(): it lives on the first master broker)
        self.routes: RouteLog | None = None
        #: the cluster's client-id registry (takeover across gateways), set in serve()
        self.clients: ClientLog | None = None
        #: persistent sessions kept in the cluster (used while other gateways may exist)
        self.cluster_sessions: ClusterSessions | None = None
        #: the gateway's nursery while serving (background work of the registry)
        self.nursery: trio.Nursery | None = None
        self.route_config = route_config or RouteLogConfig(
            orphan_timeout_s=config.gateway_orphan_timeout_s,
            sweep_interval_s=config.gateway_sweep_interval_s)
        #: stable across restarts (kept in the data dir): the owner of this gateway's
        #: clean-session routes and session records stays the same
        self.gateway_id = gateway_id or _stable_gateway_id(config.data_dir)
        #: other gateways may write our LMQs from the start (`lmq mqtt`); else (`lmq
        #: serve`) from when another MQTT gateway reports in the route log
        self.shared_lmqs = shared_lmqs
        self.stats = Stats()
        self.auth = Authenticator(config.anonymous_allowed(), config.password_file,
                                  config.acl_file,
                                  password_check_threads=config.password_check_threads)
        self.store: SessionStore | None = None
        self.retained: RetainedStore | None = None
        self.registry = SessionRegistry(self)
        self.link = BrokerLink(client, config, self.registry.route, self._on_stored)
        self.link.on_brokers_added = self._brokers_added
        self.retained_follower: RetainedFollower | None = None
        self.connections: set[Connection] = set()
        #: bound ports by listener kind ("tcp", "ws", "tls"), known once serving
        self.ports: dict[str, int] = {}
        self.stopping = False
        self._stop = trio.Event()
        #: bytes of incomplete packets buffered by all connections (max_partial_packet_bytes)
        self.partial_bytes = 0
        self._partial_freed: trio.Event | None = None

    @property
    def groups(self):
        return self.registry.groups

    # -- lifetime ---------------------------------------------------------------------------

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.config
        os.makedirs(cfg.data_dir, exist_ok=True)
        self.store = SessionStore(cfg.data_dir)
        try:
            self.retained = RetainedStore(self.store, cfg.max_retained)
            self.retained.load()
            await self.link.start()
            self.retained_follower = RetainedFollower(self.link, self.retained, RETAINED_LMQ)
            # Every gateway (MQTT and AMQP) keeps the route log on the first master by name.
            name, addr = sorted(self.link.brokers.items())[0]
            self.routes = RouteLog(self.client, addr, name, self.gateway_id, self.route_config)
            self.clients = ClientLog(self.client, addr, name, self.gateway_id,
                                     self.registry.taken_elsewhere)
            self.cluster_sessions = ClusterSessions(self.link, addr, name, self.gateway_id)
            if self.shared_lmqs:
                self.link.share_lmqs()
            loaded = self.registry.load()
            bound = await self._open_listeners()  # a taken port: plain OSError, nothing runs
            if cfg.gc_freeze_at_start:
                # Start-up objects otherwise make the first young-generation collections
                # under load take ~25 ms (measured; 1 ms with the freeze).
                gc.collect()
                gc.freeze()
            self._warn_insecure()
            async with trio.open_nursery() as nursery:
                await nursery.start(self.routes.run)
                await nursery.start(self.clients.run)
                await nursery.start(self.retained_follower.run)
                await nursery.start(self.cluster_sessions.run)
                self.nursery = nursery
                self.link.router = self.routes.table.mqtt_publish_lmqs  # amq.topic too
                self.registry.restore_routes()
                nursery.start_soon(self._peers_loop)
                if self.shared_lmqs:
                    await self._hello()
                await nursery.start(self.link.run)
                nursery.start_soon(self.link.refresh_loop)
                nursery.start_soon(self._flush_loop)
                nursery.start_soon(self._tick_loop)
                nursery.start_soon(self._read_deadline_loop)
                if cfg.sys_interval_s > 0:
                    nursery.start_soon(sys_loop, self)
                async with trio.open_nursery() as listeners:
                    for kind, group in bound:
                        listeners.start_soon(trio.serve_listeners, partial(self._accept, kind),
                                             group)
                    log.info("MQTT gateway listening on %s (%d sessions, %d retained restored)",
                             ", ".join(f"{k} {v}" for k, v in self.ports.items()),
                             loaded, len(self.retained))
                    task_status.started(self)
                    await self._stop.wait()
                    self.stopping = True  # CONNECTs from now on: 0x8B
                    with trio.move_on_after(SHUTDOWN_GRACE_S):
                        async with trio.open_nursery() as kicks:
                            for conn in list(self.connections):
                                kicks.start_soon(partial(conn.kick, 0x8B, will=False))
                    listeners.cancel_scope.cancel()
                with trio.move_on_after(SHUTDOWN_GRACE_S):
                    await self.link.drain()  # what clients published gets stored
                self.registry.flush()
                with trio.move_on_after(SHUTDOWN_GRACE_S):
                    await self.cluster_sessions.settled()  # positions and records
                nursery.cancel_scope.cancel()
        finally:
            self.registry.flush()
            self.store.close()

    def _warn_insecure(self) -> None:
        cfg = self.config
        if host_is_loopback(cfg.host):
            return
        if cfg.allow_anonymous:
            log.warning("MQTT: anonymous clients are allowed on %s, a non-loopback address "
                        "(allow_anonymous = true); set a password_file and allow_anonymous "
                        "= false unless this network is trusted", cfg.host or "all addresses")
        elif cfg.allow_anonymous is None:
            log.info("MQTT: listening on %s, a non-loopback address: anonymous clients "
                        "are refused (set allow_anonymous = true to allow them)",
                        cfg.host or "all addresses")

    def stop(self) -> None:
        """Stop listening, disconnect clients (v5: 0x8B), persist, return from serve()."""
        self._stop.set()

    async def _open_listeners(self) -> list[tuple[str, list]]:
        cfg = self.config
        bound: list[tuple[str, list]] = []
        try:
            if cfg.port is not None:
                group = await trio.open_tcp_listeners(cfg.port, host=cfg.host)
                bound.append(("tcp", group))
                self.ports["tcp"] = group[0].socket.getsockname()[1]
            if cfg.ws_port is not None:
                group = await trio.open_tcp_listeners(cfg.ws_port, host=cfg.host)
                bound.append(("ws", group))
                self.ports["ws"] = group[0].socket.getsockname()[1]
            if cfg.tls_port is not None:
                ctx = server_ssl_context(cfg.certfile, cfg.keyfile)
                group = await trio.open_ssl_over_tcp_listeners(cfg.tls_port, ctx, host=cfg.host)
                bound.append(("tls", group))
                self.ports["tls"] = group[0].transport_listener.socket.getsockname()[1]
        except BaseException:
            for _, group in bound:
                for listener in group:
                    await listener.aclose()
            raise
        return bound

    async def _accept(self, kind: str, stream) -> None:
        remote = _peer(stream)
        stats = self.stats
        if stats.connections >= self.config.max_connections:
            # Counted from accept: a socket that has not sent CONNECT yet holds buffers too
            # (up to max_packet_size for connect_timeout_s). Mosquitto's max_connections
            # also closes the new socket at accept; MQTT has no refusal before CONNECT.
            log.info("connection from %s refused: max_connections (%d) reached", remote,
                     self.config.max_connections)
            await trio.aclose_forcefully(stream)
            return
        stats.connections += 1
        try:
            if kind == "ws":
                ws = await accept_websocket(stream, self.config.ws_path,
                                            self.config.max_packet_size + 16)
                if ws is None:
                    return
                stream = ws
            conn = Connection(self, stream, remote, kind)
            self.connections.add(conn)
            try:
                await conn.handle()
            finally:
                self.connections.discard(conn)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        except Exception:
            log.exception("connection from %s failed", remote)
        finally:
            stats.connections -= 1

    async def _flush_loop(self) -> None:
        while True:
            await trio.sleep(self.config.state_flush_interval_s)
            try:
                await self.registry.flush_sliced()
            except Exception:
                log.exception("writing the MQTT session state failed")

    async def _tick_loop(self) -> None:
        while True:
            await trio.sleep(self.config.expiry_check_interval_s)
            try:
                await self.registry.tick()
            except Exception:
                log.exception("session expiry check failed")

    async def _hello(self) -> None:
        """Before listening: one (no-op) entry in the route log, waited for, so that an
        embedded gateway that believed itself alone stops predicting LMQ tails before
        this gateway's first publish (its peers check wakes on every applied entry)."""
        route = Route("mqtt", "$lmq/gateway/hello", "%LMQ%mqtt_none",
                      owner=f"c:{self.gateway_id}:hello")
        try:
            await self.routes.remove_route(route, wait_for="mqtt-")
        except Exception as exc:
            log.warning("route log greeting failed: %r", exc)

    def _brokers_added(self, brokers: list[str]) -> None:
        self.registry.add_brokers(brokers)
        if self.retained_follower is not None:
            self.retained_follower.follow_new()

    async def _peers_loop(self) -> None:
        """Until another MQTT gateway shows up in the route log (then LMQs have several
        writers: BrokerLink.share_lmqs)."""
        routes = self.routes
        while not self.link.foreign_writers:
            if any(g != self.gateway_id and g.startswith(FOREIGN_WRITER_PREFIXES)
                   and g not in LOCAL_WRITERS for g in routes.live_gateways()):
                self.link.share_lmqs()
                return
            with trio.move_on_after(PEERS_CHECK_S):
                await routes.changed()
            await routes.refresh_members()  # a read: nothing is stored

    async def _read_deadline_loop(self) -> None:
        """End the reads that ran past their deadline (keep alive, partial packet): one
        sweep every READ_SWEEP_S instead of a cancel scope per read (connection.py)."""
        while True:
            await trio.sleep(READ_SWEEP_S)
            # a slice of the connections per step of the loop (sweep.py)
            await sweep(self.connections, partial(_end_read_if_due, trio.current_time()))

    # -- incomplete packets ------------------------------------------------------------------

    def partial_bytes_changed(self, delta: int) -> None:
        self.partial_bytes += delta
        if delta < 0 and self._partial_freed is not None:
            self._partial_freed.set()
            self._partial_freed = None

    async def partial_bytes_freed(self) -> None:
        """Wait until some connection's incomplete packet completed or went away."""
        if self._partial_freed is None:
            self._partial_freed = trio.Event()
        await self._partial_freed.wait()

    # -- messages -------------------------------------------------------------------------

    def publish_internal(self, msg: MqttMessage, origin: str | None = None) -> None:
        """Publish a message the server produces (wills, $SYS) through the normal path."""
        self.link.submit(msg)

    def _on_stored(self, msg: MqttMessage) -> None:
        if msg.retain:
            self.retained.set(msg)

    async def load_inflight_message(self, entry: Inflight) -> MqttMessage | None:
        """The message of an in-flight entry restored after a restart (None if gone)."""
        if entry.retained_topic is not None:
            return self.retained.get(entry.retained_topic)
        if entry.where is None:
            return None
        broker, clog = entry.where
        try:
            return await self.link.view(broker, clog)
        except Exception as exc:
            log.info("in-flight message %s@%d is gone: %r", broker, clog, exc)
            return None


def _stable_gateway_id(data_dir: str) -> str:
    """`mqtt-<12 hex>`, read from DATA_DIR/gateway-id or created there."""
    path = os.path.join(data_dir, "gateway-id")
    try:
        with open(path, encoding="ascii") as fh:
            known = fh.read().strip()
        if known.startswith("mqtt-") and 5 < len(known) <= 64 and known.isascii():
            return known
    except (OSError, UnicodeDecodeError):
        pass
    new = "mqtt-" + secrets.token_hex(6)
    try:
        os.makedirs(data_dir, exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="ascii") as fh:
            fh.write(new + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("gateway id not kept in %s: %s", data_dir, exc)
    return new


def _peer(stream) -> str:
    try:
        sock = getattr(stream, "socket", None)
        if sock is None:
            sock = stream.transport_stream.socket
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except Exception:
        return "?"


def _end_read_if_due(now: float, conn: Connection) -> None:
    if conn._reading and now >= conn._deadline:
        conn._read_scope.cancel()
