"""The MQTT servers `lmq bench mqtt` measures: `lmq serve --mqtt-port` and Mosquitto as
child processes on free loopback ports, or a broker given by address (`--target`)."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import psutil

__all__ = ["MqttServer", "free_port", "start_lmq", "start_mosquitto", "target_server"]

_START_TIMEOUT_S = 60.0

# The store of the measured `lmq serve`: small sparse files (the bench writes a few
# hundred MB at most, and the temporary directory is removed at the end).
_BROKER_TOML = """\
[broker]
commitlog_file_size = 134217728
consume_queue_units_per_file = 100000
preallocate_files = false
"""

# Mosquitto as a throughput comparison: one loopback listener, anonymous, queues large
# enough that the bench's window (not a queue limit) bounds what is in flight, the same
# outbound in-flight limit as our gateway's default (max_inflight_out = 64).
_MOSQUITTO_CONF = """\
listener {port} 127.0.0.1
allow_anonymous true
persistence false
max_queued_messages 1000000
max_inflight_messages 64
set_tcp_nodelay true
log_dest file {log}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child_setup(cpus: tuple[int, ...]):
    def setup() -> None:  # pragma: no cover - runs in the child after fork
        # PR_SET_PDEATHSIG: a bench killed with SIGKILL must not leave servers behind.
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
        # Pinned before exec: every thread the server starts inherits the CPU set.
        if cpus:
            os.sched_setaffinity(0, cpus)
    return setup


@dataclass
class MqttServer:
    """One server under test: where it listens and (if known) its process id."""

    name: str
    host: str
    port: int
    pid: int | None = None
    proc: subprocess.Popen | None = None
    log_path: str | None = None
    argv: list[str] | None = None
    cpus: tuple[int, ...] = ()  # the CPUs the server process is pinned to (empty: none)

    def restart(self) -> None:
        """Stop and start again on the same port (a fresh process: no heap history)."""
        if self.argv is None:
            return  # not ours (--target): measured as it is
        self.stop()
        self.proc = _popen(self.argv, self.log_path or os.devnull, self.cpus)
        self.pid = self.proc.pid
        _wait_connack(self)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, n: int = 2000) -> str:
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, "rb") as fh:
                return fh.read()[-n:].decode("utf-8", "replace").strip()
        except OSError:
            return ""


def wait_answer(server: MqttServer, hello: bytes, answer: bytes, what: str, bye: bytes = b"",
                timeout: float = _START_TIMEOUT_S) -> None:
    """Until the server answers `hello` with `answer` (then `bye` is sent): a listening
    socket alone does not say the protocol is served yet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc is not None and server.proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited: {server.log_tail()}")
        try:
            with socket.create_connection((server.host, server.port), timeout=2) as s:
                s.sendall(hello)
                if s.recv(len(answer)) == answer:
                    if bye:
                        s.sendall(bye)
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{server.name} not answering {what} after {timeout} s: {server.log_tail()}")


def _wait_connack(server: MqttServer, timeout: float = _START_TIMEOUT_S) -> None:
    """Until a CONNECT is answered with CONNACK 0."""
    connect = bytes.fromhex("101000044d5154540402000000047072626b")  # "prbk", keepalive 0
    wait_answer(server, connect, b"\x20\x02\x00\x00", "CONNECT", b"\xe0\x00", timeout)


def process_tree(pid: int | None) -> list[psutil.Process]:
    """A process and all its descendants (none when it is gone)."""
    if pid is None:
        return []
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.Error:
        return []


def tree_cpu_s(pid: int | None) -> float:
    """CPU seconds of a process and its descendants (a server may fork helpers)."""
    total = 0.0
    for p in process_tree(pid):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def _popen(argv: list[str], log_path: str, cpus: tuple[int, ...] = ()) -> subprocess.Popen:
    log = open(log_path, "ab")  # noqa: SIM115 - the child owns it
    try:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            preexec_fn=_child_setup(cpus) if sys.platform.startswith("linux") else None,
        )
    finally:
        log.close()


def lmq_serve_argv(root: str, *listeners: str, namesrv_port: int | None = None,
                   extra_toml: str = "") -> list[str]:
    """`lmq serve` without gRPC on free loopback ports, its config (_BROKER_TOML +
    `extra_toml`) and data in `root`, with the gateway options `listeners`."""
    cfg = os.path.join(root, "broker.toml")
    with open(cfg, "w") as fh:
        fh.write(_BROKER_TOML + extra_toml)
    return [sys.executable, "-m", "lmq", "serve", "--no-grpc", "--host", "127.0.0.1",
            "--data-dir", os.path.join(root, "lmq-data"), "--config", cfg,
            "--namesrv-port", str(namesrv_port or free_port()),
            "--broker-port", str(free_port()), "--log-level", "WARNING", *listeners]


def start_server(name: str, port: int, argv: list[str], log_path: str,
                 cpus: tuple[int, ...] = (), wait=_wait_connack) -> MqttServer:
    """`argv` as a pinned child logging to `log_path`, once `wait` says it serves `port`
    (stopped again when it does not)."""
    proc = _popen(argv, log_path, cpus)
    server = MqttServer(name, "127.0.0.1", port, proc.pid, proc, log_path, argv, cpus)
    try:
        wait(server)
    except RuntimeError:
        server.stop()
        raise
    return server


def start_lmq(tmp: str, cpus: tuple[int, ...] = ()) -> MqttServer:
    """`lmq serve` with the MQTT gateway, on free loopback ports, data in `tmp`."""
    port = free_port()
    # only MQTT is measured: no AMQP listener (5672 is a fixed default, as 8081)
    argv = lmq_serve_argv(tmp, "--mqtt-port", str(port), "--no-amqp")
    return start_server("lmq", port, argv, os.path.join(tmp, "lmq.log"), cpus)


def start_mosquitto(tmp: str, binary: str | None = None,
                    cpus: tuple[int, ...] = ()) -> MqttServer | None:
    """A mosquitto child process, or None when the executable is not installed."""
    exe = binary or shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if os.path.exists("/usr/sbin/mosquitto") else None)
    if exe is None:
        return None
    port = free_port()
    log_path = os.path.join(tmp, "mosquitto.log")
    conf = os.path.join(tmp, "mosquitto.conf")
    with open(conf, "w") as fh:
        fh.write(_MOSQUITTO_CONF.format(port=port, log=log_path))
    return start_server("mosquitto", port, [exe, "-c", conf], log_path, cpus)


def target_server(addr: str) -> MqttServer:
    """An already running broker; its pid is looked up when it listens on this host."""
    host, _, port_text = addr.rpartition(":")
    port = int(port_text)
    pid = None
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                pid = conn.pid
                break
    except (psutil.Error, OSError):
        pass
    server = MqttServer("target", host or "127.0.0.1", port, pid)
    _wait_connack(server, timeout=10)
    return server
