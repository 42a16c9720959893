"""Prometheus metrics, `/healthz` and `/readyz` on one HTTP port (`--metrics-port`).

The endpoint is a small trio HTTP/1.0 server in the server's own event loop, so the
collectors read the broker's and the gateway's state without locks. Every collector only
reads counters the servers already keep (no per-message work is added for metrics); the
only per-scrape cost that grows with the data is the consumer-group lag, capped at
`max_lag_series` series. Formatting uses the official `prometheus-client` library
(`generate_latest`), which also supplies the process (RSS, CPU, fds) and GC collectors.

Paths: `GET /metrics` (text format 0.0.4), `GET /healthz` (200 while the process runs),
`GET /readyz` (200 "ready", or 503 with a one-line reason); `/dashboard/` and `/api/...`
go to the web dashboard (`lmq.dashboard`, off with --no-dashboard). Anything else: 404.
The port binds loopback unless `--metrics-host` says otherwise. Limits (docs/operations.md):
request head `MAX_REQUEST_BYTES`, `REQUEST_TIMEOUT_S` to send it (and a POST body of at most
`MAX_BODY_BYTES`), `MAX_CONNECTIONS` at once, a lingering close of `LINGER_S` / `LINGER_BYTES`.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator

import trio
from prometheus_client import CollectorRegistry, GCCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger("lmq.metrics")

__all__ = ["Exporter", "DEFAULT_MAX_LAG_SERIES", "add_metrics_options", "exporter_from_args",
           "seconds_arg"]

MAX_REQUEST_BYTES = 8192  # request line + headers; larger: 431 and close
REQUEST_TIMEOUT_S = 5.0  # to send the request head
MAX_CONNECTIONS = 16  # concurrent scrapes; more are closed at once
MAX_BODY_BYTES = 16384  # a dashboard action's JSON body; larger: 413
DEFAULT_MAX_LAG_SERIES = 1000  # consumer-group lag series per scrape
LINGER_S = 1.0  # after answering, how long unread request bytes are drained
LINGER_BYTES = 65536  # and how many at most
LOOP_LAG_INTERVAL_S = 0.5  # how often the event-loop lag probe sleeps


def add_metrics_options(parser, *, gateway_only: bool = False) -> None:
    """`--metrics-port` / `--metrics-host` (shared by serve, broker, namesrv and mqtt; the
    stand-alone AMQP gateway and gRPC proxy, `gateway_only`, hold no broker data: no lag
    series and no dashboard)."""
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve /metrics, /healthz and /readyz on this HTTP port "
                        "(default: off; 0 = a free port)")
    parser.add_argument("--metrics-host", default="127.0.0.1",
                        help="bind address of the metrics port (default %(default)s)")
    if gateway_only:
        return
    parser.add_argument("--metrics-max-lag-series", type=_count, default=DEFAULT_MAX_LAG_SERIES,
                        metavar="N", help="at most N consumer-lag series per scrape "
                        "(default %(default)s)")
    parser.add_argument("--no-dashboard", action="store_true",
                        help="do not serve the web dashboard (/dashboard/) on the metrics port")
    parser.add_argument("--dashboard-interval", type=seconds_arg, default=5.0, metavar="SECONDS",
                        help="how often the dashboard samples its rate charts; it keeps 120 "
                        "samples (default %(default)s: the last 10 minutes)")


def seconds_arg(text: str) -> float:
    """An argparse type: seconds in 0.1..3600."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"expected seconds in 0.1..3600, got {text!r}")
    return value


def _count(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def exporter_from_args(args, **sources) -> Exporter | None:
    if getattr(args, "metrics_port", None) is None:
        return None
    return Exporter(args.metrics_host, args.metrics_port,
                    max_lag_series=getattr(args, "metrics_max_lag_series",
                                           DEFAULT_MAX_LAG_SERIES),
                    dashboard=hasattr(args, "no_dashboard") and not args.no_dashboard,
                    dashboard_interval_s=getattr(args, "dashboard_interval", 5.0), **sources)


class Exporter:
    """The HTTP endpoint and the collectors of one process.

    Sources are read at scrape time and may be set after construction (a gateway that
    only exists once started): `server` (core.cluster.EmbeddedServer), `broker`
    (BrokerController), `namesrv` (NameServer), `mqtt` (MqttGateway, or a callable
    returning it), `amqp` (AmqpServer of a stand-alone gateway), `grpc` (GrpcServer of
    `lmq proxy`; `lmq serve`'s is found among the server's services). `ready`: a callable
    returning None or the reason the process is not ready (stand-alone gateways, whose
    listeners are up once their start-up returned).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, server=None, broker=None,
                 namesrv=None, mqtt=None, amqp=None, grpc=None, ready=None,
                 max_lag_series: int = DEFAULT_MAX_LAG_SERIES,
                 dashboard: bool = False, dashboard_interval_s: float = 5.0) -> None:
        self.host = host
        self.port = port
        self.server = server
        self.broker = broker
        self.namesrv = namesrv
        self.mqtt = mqtt
        self.amqp = amqp
        self.grpc = grpc
        self.ready = ready
        self.max_lag_series = max_lag_series
        self.loop_lag_s = 0.0  # last measured scheduling delay
        self.loop_lag_max_s = 0.0
        self.loop_lag_total_s = 0.0
        self._connections = 0
        self._cancel: trio.CancelScope | None = None
        self._stopped = False
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.registry.register(_Collector(self))
        self.dashboard = None
        if dashboard:
            from lmq.dashboard import Dashboard

            self.dashboard = Dashboard(self, host, dashboard_interval_s)

    # -- sources ------------------------------------------------------------------------
    def current_broker(self):
        if self.broker is not None:
            return self.broker
        return getattr(self.server, "broker", None)

    def current_namesrv(self):
        if self.namesrv is not None:
            return self.namesrv
        return getattr(self.server, "namesrv", None)

    def current_mqtt(self):
        mqtt = self.mqtt
        if callable(mqtt) and not hasattr(mqtt, "stats"):
            return mqtt()
        if mqtt is not None:
            return mqtt
        for service in getattr(self.server, "services", ()):
            gw = getattr(service, "gateway", None)
            if gw is not None:
                return gw
        return None

    def current_amqp(self):
        """The AMQP gateway's AmqpServer (stand-alone, or `lmq serve`'s service)."""
        if self.amqp is not None:
            return self.amqp
        for service in getattr(self.server, "services", ()):
            if hasattr(service, "broker_config") and getattr(service, "server", None):
                return service.server
        return None

    def current_grpc(self):
        """The gRPC front end's GrpcServer (`lmq proxy`'s, or `lmq serve`'s service)."""
        if self.grpc is not None:
            return self.grpc
        for service in getattr(self.server, "services", ()):
            server = getattr(service, "server", None)
            if hasattr(server, "servicer") and hasattr(server, "stats"):
                return server
        return None

    def expects_mqtt(self) -> bool:
        if self.mqtt is not None:
            return True
        return any(hasattr(s, "gateway") for s in getattr(self.server, "services", ()))

    # -- readiness ----------------------------------------------------------------------
    def not_ready_reason(self) -> str | None:
        """None when ready, else one line saying what is missing."""
        if self.ready is not None:
            reason = self.ready()
            if reason:
                return reason
        broker = self.current_broker()
        if self.server is not None or self.broker is not None:
            if broker is None or not broker.started:
                return "broker not started (store recovering or listener not up)"
            if broker.closing:
                return "broker shutting down"
            addrs = broker.config.namesrv_addrs
            failing = getattr(broker, "_register_failing", set())
            if addrs and all(a in failing for a in addrs):
                return "broker not registered with any name server"
        if (self.server is not None and self.server.namesrv_config is not None) or self.namesrv:
            ns = self.current_namesrv()
            if ns is None or getattr(ns, "_closing", False) or not ns.port:
                return "name server not listening"
        if self.expects_mqtt():
            gw = self.current_mqtt()
            if gw is None or not gw.ports:
                return "MQTT gateway not started (listeners not up)"
            if gw.stopping:
                return "MQTT gateway shutting down"
        return None

    # -- serving ------------------------------------------------------------------------
    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Bind (a taken port raises OSError here), report the port, serve until cancelled."""
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        self.port = listeners[0].socket.getsockname()[1]
        log.info("metrics on http://%s:%d/metrics (/healthz, /readyz)", self.host, self.port)
        async with trio.open_nursery() as nursery:
            self._cancel = nursery.cancel_scope
            if self._stopped:
                nursery.cancel_scope.cancel()
            nursery.start_soon(self._loop_lag_probe)
            if self.dashboard is not None:
                nursery.start_soon(self.dashboard.run_sampler)
                log.info("dashboard on http://%s:%d/dashboard/", self.host, self.port)
            task_status.started(self.port)
            await trio.serve_listeners(self._handle, listeners)

    def stop(self) -> None:
        """Make `serve` return (closing the port)."""
        self._stopped = True
        if self._cancel is not None:
            self._cancel.cancel()

    async def _loop_lag_probe(self) -> None:
        """How late a sleeping task is woken: the event loop's scheduling delay."""
        while True:
            start = trio.current_time()
            await trio.sleep(LOOP_LAG_INTERVAL_S)
            lag = max(0.0, trio.current_time() - start - LOOP_LAG_INTERVAL_S)
            self.loop_lag_s = lag
            self.loop_lag_total_s += lag
            if lag > self.loop_lag_max_s:
                self.loop_lag_max_s = lag

    async def _handle(self, stream: trio.SocketStream) -> None:
        if self._connections >= MAX_CONNECTIONS:
            await stream.aclose()
            return
        self._connections += 1
        try:
            with trio.move_on_after(REQUEST_TIMEOUT_S) as scope:
                head = await _read_head(stream)
                request = _parse_head(head) if head is not None else None
                if request is not None and request.method == "POST":
                    request.body = await _read_body(stream, head, request)
            if scope.cancelled_caught or head is None:
                return
            if request is None or len(head) > MAX_REQUEST_BYTES:
                await _send(stream, 431, b"request header too large\n")
                return
            if request.body is None:
                await _send(stream, 413, b"request body too large\n")
                return
            await self._answer(stream, request)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            self._connections -= 1
            await _linger_close(stream)

    async def _answer(self, stream: trio.SocketStream, request) -> None:
        method, path = request.method, request.path
        head_only = method == "HEAD"
        if self.dashboard is not None and (path == "/" or path.startswith(("/dashboard",
                                                                           "/api/"))):
            answer = await self.dashboard.handle(request)
            await _send(stream, answer.status, answer.body, answer.ctype,
                        head_only=head_only, headers=answer.headers)
        elif method not in ("GET", "HEAD"):
            await _send(stream, 405, b"method not allowed\n")
        elif path == "/metrics":
            body = generate_latest(self.registry)
            await _send(stream, 200, body, CONTENT_TYPE_LATEST, head_only=head_only)
        elif path == "/healthz":
            await _send(stream, 200, b"ok\n", head_only=head_only)
        elif path == "/readyz":
            reason = self.not_ready_reason()
            if reason is None:
                await _send(stream, 200, b"ready\n", head_only=head_only)
            else:
                await _send(stream, 503, reason.encode() + b"\n", head_only=head_only)
        else:
            await _send(stream, 404, b"not found: try /metrics, /healthz, /readyz"
                        + (b", /dashboard/" if self.dashboard is not None else b"") + b"\n")


def _parse_head(head: bytes):
    """The request line and headers as a dashboard `Request` (body not read yet), or None
    when the head is cut (over MAX_REQUEST_BYTES)."""
    from urllib.parse import parse_qsl, unquote

    from lmq.dashboard import Request

    end = head.find(b"\r\n\r\n")
    if end < 0:
        end = head.find(b"\n\n")
    if end < 0:
        return None
    lines = head[:end].decode("latin-1").splitlines()
    parts = lines[0].split() if lines else []
    target = parts[1] if len(parts) > 1 else ""
    path, _, query = target.partition("?")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return Request(parts[0] if parts else "", unquote(path),
                   dict(parse_qsl(query, max_num_fields=32)), headers)


async def _read_body(stream: trio.SocketStream, head: bytes, request) -> bytes | None:
    """The POST body (Content-Length bytes, at most MAX_BODY_BYTES), or None when larger."""
    try:
        length = int(request.headers.get("content-length", "0"))
    except ValueError:
        return None
    if not 0 <= length <= MAX_BODY_BYTES:
        return None
    sep = b"\r\n\r\n" if b"\r\n\r\n" in head else b"\n\n"
    buf = bytearray(head.split(sep, 1)[1])
    while len(buf) < length:
        chunk = await stream.receive_some(length - len(buf))
        if not chunk:
            break
        buf += chunk
    return bytes(buf[:length])


async def _read_head(stream: trio.SocketStream) -> bytes | None:
    buf = bytearray()
    while b"\r\n\r\n" not in buf and b"\n\n" not in buf:
        if len(buf) > MAX_REQUEST_BYTES:
            break
        chunk = await stream.receive_some(4096)
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


async def _linger_close(stream: trio.SocketStream) -> None:
    """Half-close, then discard what the peer still sends (bounded): closing with unread
    data would reset the connection and could destroy the answer before it is read."""
    try:
        await stream.send_eof()
        with trio.move_on_after(LINGER_S):
            drained = 0
            while drained < LINGER_BYTES:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                drained += len(chunk)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    finally:
        await trio.aclose_forcefully(stream)


_REASONS = {200: "OK", 302: "Found", 400: "Bad Request", 401: "Unauthorized",
            403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 409: "Conflict",
            413: "Content Too Large", 415: "Unsupported Media Type", 429: "Too Many Requests",
            431: "Request Header Fields Too Large", 503: "Service Unavailable"}


async def _send(stream, status: int, body: bytes, ctype: str = "text/plain; charset=utf-8",
                *, head_only: bool = False, headers: dict[str, str] | None = None) -> None:
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (f"HTTP/1.0 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\n"
            f"X-Content-Type-Options: nosniff\r\n{extra}Connection: close\r\n\r\n").encode()
    await stream.send_all(head if head_only else head + body)


class _Collector:
    """Reads the servers' counters at scrape time (runs in the event loop)."""

    def __init__(self, exporter: Exporter) -> None:
        self.exporter = exporter

    def collect(self) -> Iterator:
        ex = self.exporter
        lag = GaugeMetricFamily("lmq_event_loop_lag_seconds",
                                "Last measured scheduling delay of the trio event loop")
        lag.add_metric([], ex.loop_lag_s)
        yield lag
        lag_max = GaugeMetricFamily("lmq_event_loop_lag_max_seconds",
                                    "Largest scheduling delay measured since start")
        lag_max.add_metric([], ex.loop_lag_max_s)
        yield lag_max
        yield _counter("lmq_event_loop_delay_seconds", "Sum of measured scheduling delays",
                       ex.loop_lag_total_s)
        up = GaugeMetricFamily("lmq_ready", "1 when /readyz answers 200")
        up.add_metric([], 0.0 if ex.not_ready_reason() else 1.0)
        yield up
        pop = sys.modules.get("core.client.pop_consumer")  # unloaded: no POP client here
        yield _counter("lmq_pop_unconfirmed_acks", "POP acks and invisibility changes a "
                       "SYNC_MASTER applied without its slave's confirmation",
                       pop.UNCONFIRMED.count if pop is not None else 0)
        broker = ex.current_broker()
        if broker is not None and broker.started:
            yield from broker_metrics(broker, ex.max_lag_series)
        ns = ex.current_namesrv()
        if ns is not None:
            yield from namesrv_metrics(ns)
        gw = ex.current_mqtt()
        if gw is not None:
            yield from mqtt_metrics(gw)
        amqp = ex.current_amqp()
        if amqp is not None:
            yield from amqp_metrics(amqp)
        grpc = ex.current_grpc()
        if grpc is not None:
            from lmq.metrics_grpc import grpc_metrics

            yield from grpc_metrics(grpc)


def _gauge(name: str, doc: str, value: float, labels: dict | None = None):
    m = GaugeMetricFamily(name, doc, labels=list(labels or ()))
    m.add_metric(list((labels or {}).values()), value)
    return m


def _counter(name: str, doc: str, value: float):
    m = CounterMetricFamily(name, doc)
    m.add_metric([], value)
    return m


def broker_metrics(broker, max_lag_series: int) -> Iterator:
    store = broker.store
    s = store.stats()
    yield _counter("lmq_broker_put_messages", "Messages stored", s["puts"])
    yield _counter("lmq_broker_put_bytes", "Bytes of messages stored", s["put_bytes"])
    yield _counter("lmq_broker_put_errors", "Failed store calls", s["put_errors"])
    yield _counter("lmq_broker_get_messages", "Messages read by pulls", s["get_msgs"])
    yield _counter("lmq_broker_get_bytes", "Bytes read by pulls", s["get_bytes"])
    yield _counter("lmq_broker_lmq_dispatches", "LMQ index entries written",
                   s["lmq_dispatches"])
    size = s["commitlog_max_offset"] - s["commitlog_min_offset"]
    yield _gauge("lmq_broker_commitlog_size_bytes", "CommitLog bytes retained", size)
    yield _gauge("lmq_broker_commitlog_max_offset_bytes", "CommitLog write offset",
                 s["commitlog_max_offset"])
    yield _gauge("lmq_broker_commitlog_flush_lag_bytes", "CommitLog bytes not yet fsynced",
                 max(0, s["commitlog_max_offset"] - s["commitlog_flushed_offset"]))
    yield _gauge("lmq_broker_commitlog_files", "CommitLog files", s["commitlog_files"])
    yield _gauge("lmq_broker_consume_queues", "ConsumeQueues loaded",
                 s["consume_queues_loaded"])
    yield _gauge("lmq_broker_lmqs", "Light message queues", s["lmq_count"])
    yield _gauge("lmq_broker_topics", "Topic configs", len(broker.topic_config_manager.table))
    yield _gauge("lmq_broker_consumer_groups_online", "Consumer groups with a live client",
                 len(broker.consumer_manager.groups))
    yield _gauge("lmq_broker_long_poll_waiters", "Pull requests held (long polling)",
                 broker.pull_hold_service.held)
    yield from broker_lag_metrics(broker, max_lag_series)
    yield from replication_metrics(broker, s["commitlog_max_offset"])


def replication_metrics(broker, end: int) -> Iterator:
    """Master/slave replication (docs/ha.md), when the broker replicates: on a master, the
    CommitLog bytes each connected slave has not confirmed; on a slave, the bytes it has not
    received of what the master reported at its last heartbeat."""
    master = getattr(broker, "ha_master", None)
    slave = getattr(broker, "ha_slave", None)
    if master is None and slave is None:
        return
    lag = GaugeMetricFamily("lmq_broker_replication_lag_bytes",
                            "CommitLog bytes not yet replicated (master: per slave broker "
                            "id; slave: behind its master)", labels=["peer"])
    connected = 0
    if master is not None and slave is None:
        reported: dict[int, int] = {}
        for cid, offset in list(master.slaves.items()):
            bid = master.slave_ids.get(cid, -1)
            reported[bid] = max(offset, reported.get(bid, -1))
        for bid, offset in sorted(reported.items()):
            lag.add_metric([f"slave {bid}"], max(0, end - max(offset, 0)))
        connected = len(reported)
    elif slave is not None and slave.connected:
        connected = 1
        if slave.master_offset >= 0:
            lag.add_metric(["master"], max(0, slave.master_offset - end))
    yield lag
    yield _gauge("lmq_broker_replication_peers",
                 "Replication peers connected (master: slaves; slave: 1 with its master)",
                 connected)


def broker_lag_metrics(broker, max_series: int) -> Iterator:
    """Lag per (group, topic, queue) of the committed offsets, at most `max_series`."""
    store = broker.store
    lag = GaugeMetricFamily("lmq_broker_consumer_lag_messages",
                            "Messages not yet consumed by a group, per queue",
                            labels=["group", "topic", "queue"])
    count = truncated = 0
    table = broker.offset_manager.table
    for key in list(table):
        topic, _, group = key.rpartition("@")
        for qid, offset in list(table[key].items()):
            if count >= max_series:
                truncated += 1
                continue
            count += 1
            lag.add_metric([group, topic, str(qid)],
                           max(0, store.max_offset(topic, qid) - offset))
    yield lag
    yield _gauge("lmq_broker_consumer_lag_series_dropped",
                 "Lag series left out by the max_lag_series cap", truncated)


def namesrv_metrics(ns) -> Iterator:
    routes = ns.routes
    yield _gauge("lmq_namesrv_brokers", "Broker addresses registered",
                 len(getattr(routes, "broker_live_table", {})))
    yield _gauge("lmq_namesrv_topics", "Topics with routes",
                 len(getattr(routes, "topic_queue_table", {})))


def mqtt_metrics(gw) -> Iterator:
    s = gw.stats
    yield _gauge("lmq_mqtt_connections", "Open MQTT sockets", s.connections)
    yield _gauge("lmq_mqtt_clients_connected", "Connected MQTT clients", s.clients)
    yield _gauge("lmq_mqtt_sessions", "Sessions (connected and persistent offline)",
                 len(gw.registry.sessions))
    yield _gauge("lmq_mqtt_subscriptions", "Subscriptions of all sessions",
                 gw.registry.subscription_count)
    yield _gauge("lmq_mqtt_retained_messages", "Retained messages",
                 len(gw.retained) if gw.retained is not None else 0)
    yield _counter("lmq_mqtt_messages_received", "PUBLISH packets received", s.msgs_in)
    yield _counter("lmq_mqtt_messages_sent", "PUBLISH packets sent", s.msgs_out)
    yield _counter("lmq_mqtt_received_bytes", "Bytes read from clients", s.bytes_in)
    yield _counter("lmq_mqtt_sent_bytes", "Bytes of PUBLISH packets written", s.bytes_out)
    drops = CounterMetricFamily("lmq_mqtt_dropped_messages", "Messages not delivered",
                                labels=["reason"])
    too_large = getattr(s, "dropped_too_large", 0)
    lag_cut = getattr(s, "dropped_lag", 0)
    drops.add_metric(["too_large"], too_large)
    drops.add_metric(["lag_cut"], lag_cut)
    drops.add_metric(["other"], max(0, s.dropped - too_large - lag_cut))
    yield drops
    yield _counter("lmq_mqtt_stored_messages", "MQTT messages stored in the broker",
                   gw.link.stats["stored"])
    yield _counter("lmq_mqtt_store_failures", "MQTT messages the broker refused",
                   gw.link.stats.get("failed", 0))
    inflight = sum(len(sess.inflight) for sess in gw.registry.sessions.values())
    yield _gauge("lmq_mqtt_inflight_messages", "QoS 1/2 messages sent and not acknowledged",
                 inflight)
    yield _gauge("lmq_mqtt_uptime_seconds", "Seconds since the gateway started",
                 time.monotonic() - s.started)


def amqp_metrics(server) -> Iterator:
    """The AMQP gateway: connections, queues and exchanges declared (every vhost), and
    what its publishes became (counters the gateway keeps anyway)."""
    yield _gauge("lmq_amqp_connections", "Open AMQP connections", server.connections)
    yield _counter("lmq_amqp_received_bytes", "Octets read from AMQP connections",
                   getattr(server, "bytes_in", 0))
    yield _counter("lmq_amqp_sent_bytes", "Octets written to AMQP connections",
                   getattr(server, "bytes_out", 0))
    # Bounded by max_connections x channel_max; a scrape walks them once.
    channels = [ch for sess in list(getattr(server, "sessions", ()))
                for ch in list(sess.channels.values())]
    yield _gauge("lmq_amqp_channels", "Open AMQP channels", len(channels))
    yield _gauge("lmq_amqp_consumers", "Basic.Consume consumers on open channels",
                 sum(len(ch.deliveries.consumers) for ch in channels))
    yield _gauge("lmq_amqp_unacked_messages", "Deliveries sent and not yet acknowledged",
                 sum(len(ch.deliveries.unacked) for ch in channels))
    broker = server.broker
    if broker is None:
        return
    hosts = [broker, *getattr(broker, "_vhosts", {}).values()]
    yield _gauge("lmq_amqp_queues", "AMQP queues known to this gateway",
                 sum(len(b.queues) for b in hosts))
    yield _gauge("lmq_amqp_exchanges", "AMQP exchanges known to this gateway",
                 sum(len(b.exchanges) for b in hosts))
    def total(key: str) -> int:
        return sum(b.stats.get(key, 0) for b in hosts)

    yield _counter("lmq_amqp_stored_messages", "Published messages stored in the broker",
                   total("stored"))
    yield _counter("lmq_amqp_unroutable_messages", "Published messages no queue was bound "
                   "to receive", total("unroutable"))
    yield _counter("lmq_amqp_store_failures", "Published messages the broker refused",
                   total("failed"))
