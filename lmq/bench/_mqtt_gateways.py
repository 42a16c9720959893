"""`lmq bench mqtt --gateways 2`: the same phases against two gateway processes on one
cluster, measured in the same run as the one-gateway server (issue 12).

The server ``lmq_2gw`` is ``lmq serve`` (name server, broker and the first MQTT gateway,
one process) plus a second gateway ``lmq mqtt --namesrv-addr`` on its cluster. Publishers
connect to the first gateway and subscribers to the second, so every delivery crosses
the cluster: stored by one gateway, found by the other through its LMQ watch
(docs/stateless-gateways.md). Both processes are pinned to the server CPUs, like the
one-gateway server.

Server CPU: the second gateway is started as a child of the ``lmq serve`` process (a
small launcher forks it, then becomes ``lmq serve`` by exec), so the bench's CPU figure
of the server (the process and its children) covers both gateways. Memory figures
(``server_rss_mb`` ...) are of the ``lmq serve`` process only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import psutil

from lmq.bench._mqtt_servers import (
    MqttServer,
    _child_setup,
    _popen,
    _wait_connack,
    free_port,
    lmq_serve_argv,
)

__all__ = ["add_arguments", "place_subscribers", "start_two_gateways"]

#: The server name in the report.
NAME = "lmq_2gw"
#: The second gateway multi-dispatches over TCP: the broker accepts INNER_* properties
#: from it (loopback only, ACL off, as in the one-process server).
_EXTRA_BROKER_TOML = "allow_inner_properties_without_acl = true\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gateways", type=int, choices=(1, 2), default=1,
                        help="2: also measure two gateway processes on one cluster "
                             "(`lmq serve` + `lmq mqtt`; publishers on the first, "
                             "subscribers on the second) beside the one-gateway server; "
                             "not with --target (1)")


@dataclass
class TwoGateways(MqttServer):
    """`lmq serve` (publishers' gateway, `port`) with `lmq mqtt` as its child (`sub_port`)."""

    sub_port: int = 0

    def restart(self) -> None:
        old = _children(self.pid)
        super().restart()  # stops lmq serve: its child gets SIGTERM (PDEATHSIG)
        psutil.wait_procs(old, timeout=30)
        _wait_connack(MqttServer(self.name, self.host, self.sub_port, self.pid, self.proc,
                                 self.log_path))

    def stop(self) -> None:
        old = _children(self.pid)
        super().stop()
        for p in psutil.wait_procs(old, timeout=20)[1]:
            p.kill()


def _children(pid: int | None) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children() if pid else []
    except psutil.Error:
        return []


def start_two_gateways(opts: argparse.Namespace, tmp: str,
                       cpus: tuple[int, ...] = ()) -> TwoGateways:
    """Start the two-gateway server in `tmp`/2gw; record its subscribers' port in `opts`."""
    root = os.path.join(tmp, "2gw")
    os.makedirs(root, exist_ok=True)
    port, sub_port, namesrv_port = free_port(), free_port(), free_port()
    serve = lmq_serve_argv(root, "--no-amqp", "--mqtt-port", str(port),
                           namesrv_port=namesrv_port, extra_toml=_EXTRA_BROKER_TOML)
    mqtt = [sys.executable, "-m", "lmq", "mqtt", "--host", "127.0.0.1",
            "--namesrv-addr", f"127.0.0.1:{namesrv_port}",
            "--data-dir", os.path.join(root, "mqtt-data"), "--mqtt-port", str(sub_port),
            "--log-level", "WARNING"]
    argv = [sys.executable, "-m", "lmq.bench._mqtt_gateways", json.dumps(mqtt), *serve]
    log_path = os.path.join(root, "lmq_2gw.log")
    proc = _popen(argv, log_path, cpus)
    server = TwoGateways(NAME, "127.0.0.1", port, proc.pid, proc, log_path, argv, cpus,
                         sub_port=sub_port)
    try:
        _wait_connack(server)
        _wait_connack(MqttServer(NAME, "127.0.0.1", sub_port, proc.pid, proc, log_path))
    except RuntimeError:
        server.stop()
        raise
    if not hasattr(opts, "sub_ports"):
        opts.sub_ports = {}
    opts.sub_ports[port] = sub_port
    return server


def place_subscribers(opts: Any, port: int, jobs_sub: list) -> None:
    """Subscribers of a phase against the two-gateway server go to its second gateway."""
    sub_port = getattr(opts, "sub_ports", {}).get(port)
    if sub_port:
        for job in jobs_sub:
            job.port = sub_port


def _launch(argv: list[str]) -> None:  # pragma: no cover - the launcher process
    """Fork `lmq mqtt` (killed when its parent ends), then become `lmq serve`."""
    subprocess.Popen(json.loads(argv[0]), stdin=subprocess.DEVNULL,
                     preexec_fn=_child_setup(()))
    serve = argv[1:]
    os.execv(serve[0], serve)


if __name__ == "__main__":  # pragma: no cover
    _launch(sys.argv[1:])
