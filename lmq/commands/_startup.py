"""Logging of the server commands: `--log-format`, `--log-file`, the start-up banner, and
the address `lmq serve` advertises when it binds every interface (docs/operations.md)."""

from __future__ import annotations

import argparse
import json
import logging
import logging.handlers
import socket
import time

import trio

log = logging.getLogger("lmq")

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Where the route lookup aims to find this host's outward address: TEST-NET-1 (RFC 5737),
# never reached; connecting a UDP socket sends nothing, it only picks the source address.
_ROUTE_PROBE = ("192.0.2.1", 9)


def add_log_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                        help="text lines (default) or one JSON object per line "
                        "(time, level, logger, message)")
    parser.add_argument("--log-file", metavar="FILE",
                        help="append the log to FILE instead of standard error (reopened "
                        "when logrotate moves it)")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601 with ms), level, logger, message,
    and `exception` with the formatted traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        t = time.gmtime(record.created)
        out = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(record.msecs):03d}Z",
               "level": record.levelname, "logger": record.name,
               "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure_logging(level: str, fmt: str = "text", path: str | None = None) -> None:
    """Install the root handler once, before the command's own `basicConfig` (which then
    leaves it alone). An unwritable `path` raises OSError."""
    if path:
        handler: logging.Handler = logging.handlers.WatchedFileHandler(path, encoding="utf-8")
    else:
        handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler._lmq_handler = True  # replaced by the next call, others are left alone
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_lmq_handler", False)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(getattr(logging, str(level).upper(), logging.INFO))


# -- the advertised address ---------------------------------------------------------------

def outward_ip() -> str | None:
    """This host's address on its default route, or None (no route, or only loopback)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(_ROUTE_PROBE)
            ip = s.getsockname()[0]
    except OSError:
        return None
    return None if ip.startswith("127.") or ip == "0.0.0.0" else ip


def choose_advertise_host(config, detect=outward_ip) -> str | None:
    """For a broker bound to every interface with no `advertise_host`: advertise this
    host's outward address (set on `config`), so that routes from the name server name an
    address other hosts reach. Returns the line to log (None when nothing was decided)."""
    if config.advertise_host or config.host not in ("", "0.0.0.0", "::"):
        return None
    ip = detect()
    if ip is None:
        return ("bound to all interfaces but advertising 127.0.0.1 (no other address "
                "found): other hosts get routes they cannot reach; set --advertise-host "
                "to an address or name they can")
    config.advertise_host = ip
    return (f"bound to all interfaces: advertising {ip} (this host's address on its "
            f"default route); set --advertise-host to change it")


# -- the banner ---------------------------------------------------------------------------

def _addr(host: str, port) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def recovery_summary(report) -> str:
    if report is None:
        return "store: not recovered"
    if not report.records_scanned and not report.bytes_zeroed and not report.files_removed:
        return "store recovery: nothing to re-scan (the checkpoint covers the CommitLog)"
    parts = [f"re-scanned {report.records_scanned} records ({report.bytes_scanned} bytes) "
             f"from CommitLog offset {report.scan_start} in {report.seconds:.2f} s"]
    if report.bytes_zeroed or report.files_removed:
        parts.append(f"cut a torn tail at offset {report.end}: {report.bytes_zeroed} bytes "
                     f"zeroed, {report.files_removed} files removed")
    if report.lmq_units_dropped:
        parts.append(f"dropped {report.lmq_units_dropped} LMQ index entries beyond the end")
    return "store recovery: " + "; ".join(parts)


def banner_lines(server, exporter=None) -> list[str]:
    """The banner of an `EmbeddedServer` that has started: version, listeners (bound and
    advertised), data dir, flush mode, and what the store's recovery did."""
    from lmq.cli import version

    broker = server.broker
    cfg = server.broker_config
    lines = [f"lmq-gateway {version()}: data dir {cfg.data_dir}, flush {cfg.flush}, "
             f"role {cfg.broker_role}, ACL {'on' if cfg.acl_enable else 'off'}"]
    listeners = []
    if server.namesrv is not None and server.namesrv_config is not None:
        listeners.append(f"name server {_addr(server.namesrv_config.host, server.namesrv.port)}")
    if broker is not None and broker.server is not None:
        listeners.append(f"broker {_addr(cfg.host, broker.server.port)} "
                         f"(advertised {broker.broker_addr})")
    for service in server.services:
        gw = getattr(service, "gateway", None)
        if gw is not None:
            for kind, port in gw.ports.items():
                listeners.append(f"MQTT {kind} {_addr(service.config.host, port)}")
        amqp = getattr(service, "server", None)
        if hasattr(service, "broker_config") and getattr(amqp, "port", None):
            listeners.append(f"AMQP {_addr(service.config.host, amqp.port)}")
    if exporter is not None and exporter.port:
        listeners.append(f"metrics {_addr(exporter.host, exporter.port)}"
                         + (" (+ /dashboard/)" if exporter.dashboard is not None else ""))
    lines.append("listening: " + ", ".join(listeners))
    lines.append(recovery_summary(getattr(broker.store, "recovery_report", None)
                                  if broker is not None else None))
    return lines


def banner_service(exporter=None):
    """An `EmbeddedServer` service, added last: logs the banner once everything before it
    has started, then ends."""

    async def banner(server, task_status=trio.TASK_STATUS_IGNORED) -> None:
        for line in banner_lines(server, exporter):
            log.info("%s", line)
        task_status.started()

    return banner


# -- the live line while the store recovers ------------------------------------------------

RECOVERY_REDRAW_S = 0.25  # at most this often; progress comes per 16 MiB of CommitLog


class RecoveryLine:
    """The recovery progress hook of a server on a terminal: one line redrawn in place
    (files, bytes, records, ConsumeQueues), erased when recovery ends, so the banner's
    summary follows on a clean line. Log records written meanwhile erase it first."""

    def __init__(self, stream) -> None:
        from lmq.progress import Progress

        self.progress = Progress("store recovery", stream, enabled=True)
        self._drawn_at = 0.0
        self._phase = ""
        self._filter = logging.Filter()
        self._filter.filter = self._before_log  # type: ignore[method-assign]
        self._handlers: list[logging.Handler] = []

    def _before_log(self, record) -> bool:
        self.progress.clear()
        return True

    def __call__(self, p) -> None:
        if p.phase == "done":
            self.progress.clear()
            for h in self._handlers:
                h.removeFilter(self._filter)
            self._handlers, self._phase = [], ""
            return
        if not self._phase:  # the first call: recovery starts now
            self.progress._t0 = time.monotonic()
            self._handlers = [h for h in logging.getLogger().handlers
                              if getattr(h, "stream", None) is self.progress.stream]
            for h in self._handlers:
                h.addFilter(self._filter)
        mib = 1 << 20
        if p.phase == "checking":
            self.progress.text = (f"checking the CommitLog, file {p.files_done}/"
                                  f"{p.files_total}, {p.bytes_done // mib:,}/"
                                  f"{p.bytes_total // mib:,} MiB, {p.records:,} records")
        else:
            self.progress.text = (f"re-dispatching {p.bytes_done // mib:,}/"
                                  f"{p.bytes_total // mib:,} MiB, {p.records:,} records, "
                                  f"{p.consume_queues} ConsumeQueues")
        now = time.monotonic()
        if p.phase != self._phase or now - self._drawn_at >= RECOVERY_REDRAW_S:
            self._phase, self._drawn_at = p.phase, now
            self.progress.draw()


def install_recovery_line(stream=None) -> bool:
    """On a terminal (standard error, TERM not dumb): show the store recovery's progress
    as a live line. Piped or redirected: nothing is installed, recovery runs without a hook."""
    import sys

    from core.store import recovery
    from lmq.progress import _is_terminal

    stream = stream if stream is not None else sys.stderr
    if not _is_terminal(stream):
        return False
    recovery.set_progress_hook(RecoveryLine(stream))
    return True
