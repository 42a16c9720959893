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

import psutil

from lmq.bench._mqtt_servers import (
    MqttServer,
    _popen,
    free_port,
    lmq_serve_argv,
    process_tree,
    start_server,
    tree_cpu_s,
    wait_answer,
)

__all__ = ["AmqpServer", "start_lmq_amqp", "start_rabbitmq", "server_rss"]

_START_TIMEOUT_S = 90.0
AmqpServer = MqttServer  # name, host, port, pid, proc, log, argv, cpus: the same record
_RABBITMQ_SCRIPT = "/usr/lib/rabbitmq/bin/rabbitmq-server"


def wait_amqp(server: MqttServer, timeout: float = _START_TIMEOUT_S) -> None:
    """Until the server answers the protocol header with a method frame (Connection.Start)."""
    wait_answer(server, b"AMQP\x00\x00\x09\x01", b"\x01", "the protocol header",
                timeout=timeout)


def start_lmq_amqp(tmp: str, cpus: tuple[int, ...] = ()) -> MqttServer:
    """`lmq serve` with the AMQP gateway only (no MQTT), on free loopback ports."""
    port = free_port()
    argv = lmq_serve_argv(tmp, "--no-mqtt", "--amqp-port", str(port))
    return start_server("lmq", port, argv, os.path.join(tmp, "lmq.log"), cpus, wait_amqp)


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


def server_rss(server: MqttServer) -> int:
    """Resident bytes of the server process and its children (RabbitMQ's VM is a child
    of its start script)."""
    total = 0
    for p in process_tree(server.pid):
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def server_cpu_s(server: MqttServer) -> float:
    return tree_cpu_s(server.pid)


def stop_tree(server: MqttServer) -> None:
    """Stop a server and every process it started (SIGTERM, then SIGKILL)."""
    procs = process_tree(server.pid)
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
