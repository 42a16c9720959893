"""The AMQP servers `lmq bench amqp` measures: `lmq serve --amqp-port` and, with
`--compare-rabbitmq`, a RabbitMQ node (Debian's `rabbitmq-server`) as child processes on
free loopback ports, each pinned to the server CPUs, its data in the bench's temporary
directory.

RabbitMQ runs as a private node: its own epmd on a free port (a child of the bench, so
nothing outlives it), its own node name, cookie (HOME), database, logs and a config
file that only sets the loopback listener; its default limits are kept.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time

import psutil

from lmq.bench._mqtt_servers import MqttServer, _popen, free_port

__all__ = ["AmqpServer", "start_lmq_amqp", "start_rabbitmq", "server_rss"]

_START_TIMEOUT_S = 90.0
AmqpServer = MqttServer  # name, host, port, pid, proc, log, argv, cpus: the same record

_BROKER_TOML = """\
[broker]
commitlog_file_size = 134217728
consume_queue_units_per_file = 100000
preallocate_files = false
"""
_RABBITMQ_SCRIPT = "/usr/lib/rabbitmq/bin/rabbitmq-server"


def wait_amqp(server: MqttServer, timeout: float = _START_TIMEOUT_S) -> None:
    """Until the server answers the protocol header with Connection.Start."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc is not None and server.proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited: {server.log_tail()}")
        try:
            with socket.create_connection((server.host, server.port), timeout=2) as s:
                s.sendall(b"AMQP\x00\x00\x09\x01")
                if s.recv(1) == b"\x01":
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{server.name} not answering after {timeout} s: {server.log_tail()}")


def start_lmq_amqp(tmp: str, cpus: tuple[int, ...] = ()) -> MqttServer:
    """`lmq serve` with the AMQP gateway only (no MQTT), on free loopback ports."""
    cfg = os.path.join(tmp, "broker.toml")
    with open(cfg, "w") as fh:
        fh.write(_BROKER_TOML)
    port = free_port()
    argv = [sys.executable, "-m", "lmq", "serve", "--no-grpc", "--host", "127.0.0.1",
            "--data-dir", os.path.join(tmp, "lmq-data"), "--config", cfg,
            "--namesrv-port", str(free_port()), "--broker-port", str(free_port()),
            "--no-mqtt", "--amqp-port", str(port), "--log-level", "WARNING"]
    log_path = os.path.join(tmp, "lmq.log")
    proc = _popen(argv, log_path, cpus)
    server = MqttServer("lmq", "127.0.0.1", port, proc.pid, proc, log_path, argv, cpus)
    try:
        wait_amqp(server)
    except RuntimeError:
        server.stop()
        raise
    return server


def rabbitmq_installed(script: str | None = None) -> str | None:
    path = script or _RABBITMQ_SCRIPT
    return path if os.path.exists(path) and shutil.which("epmd") else None


def start_rabbitmq(tmp: str, cpus: tuple[int, ...] = (),
                   script: str | None = None) -> tuple[MqttServer, MqttServer] | None:
    """(RabbitMQ, its epmd) as children, or None when RabbitMQ is not installed."""
    exe = rabbitmq_installed(script)
    if exe is None:
        return None
    base = os.path.join(tmp, "rabbitmq")
    os.makedirs(base, exist_ok=True)
    port, dist, epmd_port = free_port(), free_port(), free_port()
    conf = os.path.join(base, "rabbitmq.conf")
    with open(conf, "w") as fh:
        fh.write(f"listeners.tcp.default = 127.0.0.1:{port}\nloopback_users.guest = true\n")
    with open(os.path.join(base, "enabled_plugins"), "w") as fh:
        fh.write("[].\n")
    env = {
        "HOME": base, "RABBITMQ_BASE": base, "RABBITMQ_CONFIG_FILE": conf,
        "RABBITMQ_MNESIA_BASE": os.path.join(base, "mnesia"),
        "RABBITMQ_LOG_BASE": os.path.join(base, "log"),
        "RABBITMQ_NODENAME": f"lmqbench{port}@localhost",
        "RABBITMQ_DIST_PORT": str(dist), "ERL_EPMD_PORT": str(epmd_port),
        "RABBITMQ_ENABLED_PLUGINS_FILE": os.path.join(base, "enabled_plugins"),
        "RABBITMQ_PID_FILE": os.path.join(base, "pid"),
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the children inherit it (Popen without env= copies os.environ)
    try:
        epmd_argv = [shutil.which("epmd") or "epmd", "-port", str(epmd_port)]
        epmd_log = os.path.join(base, "epmd.log")
        eproc = _popen(epmd_argv, epmd_log, cpus)
        epmd = MqttServer("epmd", "127.0.0.1", epmd_port, eproc.pid, eproc, epmd_log,
                          epmd_argv, cpus)
        log_path = os.path.join(base, "server.log")
        proc = _popen([exe], log_path, cpus)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    server = MqttServer("rabbitmq", "127.0.0.1", port, proc.pid, proc, log_path, None, cpus)
    try:
        wait_amqp(server)
    except RuntimeError:
        stop_tree(server)
        epmd.stop()
        raise
    return server, epmd


def _tree(pid: int | None) -> list[psutil.Process]:
    if pid is None:
        return []
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.Error:
        return []


def server_rss(server: MqttServer) -> int:
    """Resident bytes of the server process and its children (RabbitMQ's VM is a child
    of its start script)."""
    total = 0
    for p in _tree(server.pid):
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def server_cpu_s(server: MqttServer) -> float:
    total = 0.0
    for p in _tree(server.pid):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def stop_tree(server: MqttServer) -> None:
    """Stop a server and every process it started (SIGTERM, then SIGKILL)."""
    procs = _tree(server.pid)
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=30)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    if server.proc is not None:
        try:
            server.proc.wait(10)
        except Exception:  # noqa: BLE001 - best effort
            pass
