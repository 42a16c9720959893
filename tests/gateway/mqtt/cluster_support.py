"""A cluster of real processes for the multi-gateway tests (issue 12): `lmq namesrv`, one or
more `lmq broker` (in `apache_strict` mode by default: the gateways must need nothing an
Apache RocketMQ 5 broker lacks) and any number of `lmq mqtt` gateways, each a child
process on free ports, reached by the tests over TCP with paho clients (e2e_support)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.mqtt.e2e_support import (
    BROKER_TEST_CONFIG,
    DEFAULT_TEST_CONFIG,
    REPO,
    Client,
    Gateway,
    free_port,
    write_toml,
)
from tests.procs import stop_process


class _Proc:
    """A child `python -m lmq ...` with its log in `root/<name>.log`."""

    def __init__(self, root: Path, name: str, argv: list[str]) -> None:
        self.root, self.name, self.argv = root, name, argv
        self.log_path = root / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "lmq", *self.argv], cwd=REPO,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log)

    def wait_port(self, port: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.log_tail()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{self.name} not listening after {timeout} s")

    def kill9(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        stop_process(self.proc)

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""


class MqttGatewayProcess(Gateway):
    """`python -m lmq mqtt --namesrv-addr ...`: one gateway of several on one cluster."""

    def __init__(self, root: Path, namesrv_addr: str,
                 mqtt_config: dict[str, Any] | None = None) -> None:
        super().__init__(root, mqtt_config)
        self.cluster_namesrv = namesrv_addr

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "lmq", "mqtt", "--host", "127.0.0.1",
                "--namesrv-addr", self.cluster_namesrv, "--data-dir", str(self.data_dir),
                "--mqtt-port", str(self.port), "--log-level", "INFO"]
        if self.mqtt_config:
            cfg = self.root / "mqtt.toml"
            write_toml(cfg, self.mqtt_config)
            argv += ["--mqtt-config", str(cfg)]
        return argv


class Cluster:
    """Name server + `brokers` brokers (+ gateways added with `gateway()`)."""

    def __init__(self, root: Path, brokers: int = 1, *, strict: bool = True) -> None:
        self.root = root
        self.strict = strict
        self.namesrv_port = free_port()
        self.namesrv_addr = f"127.0.0.1:{self.namesrv_port}"
        self.namesrv = _Proc(root, "namesrv", ["namesrv", "--host", "127.0.0.1", "--port",
                                               str(self.namesrv_port), "--log-level",
                                               "WARNING"])
        self.brokers: list[tuple[_Proc, int]] = []
        for i in range(brokers):
            self.brokers.append(self._broker_proc(f"broker-{chr(ord('a') + i)}"))
        self.gateways: list[MqttGatewayProcess] = []

    def _broker_proc(self, name: str) -> tuple[_Proc, int]:
        port = free_port()
        cfg = self.root / f"{name}.toml"
        table = dict(BROKER_TEST_CONFIG, allow_inner_properties_without_acl=True)
        if self.strict:
            table["apache_strict"] = True
        write_toml(cfg, {"broker": table})
        return _Proc(self.root, name, [
            "broker", "--host", "127.0.0.1", "--broker-port", str(port), "--namesrv-addr",
            self.namesrv_addr, "--broker-name", name, "--data-dir", str(self.root / name),
            "--config", str(cfg), "--log-level", "WARNING"]), port

    def start(self) -> Cluster:
        self.namesrv.start()
        self.namesrv.wait_port(self.namesrv_port)
        for proc, _port in self.brokers:
            proc.start()
        for proc, port in self.brokers:
            proc.wait_port(port)
        return self

    def gateway(self, mqtt_config: dict[str, Any] | None = None) -> MqttGatewayProcess:
        config = dict(DEFAULT_TEST_CONFIG)
        config.update(mqtt_config or {})
        gw = MqttGatewayProcess(self.root / f"gw{len(self.gateways)}", self.namesrv_addr,
                                config)
        self.gateways.append(gw)
        return gw.start()

    def kill9_broker(self, i: int) -> None:
        """kill -9 of broker `i` (its data dir and port stay for `restart_broker`)."""
        self.brokers[i][0].kill9()

    def restart_broker(self, i: int) -> None:
        proc, port = self.brokers[i]
        proc.start()
        proc.wait_port(port)

    def stop(self) -> None:
        for gw in self.gateways:
            gw.stop()
        for proc, _ in self.brokers:
            proc.stop()
        self.namesrv.stop()

    def logs(self) -> str:
        parts = [f"--- {gw.root.name}\n{gw.log_tail()}" for gw in self.gateways]
        return "\n".join(parts)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two brokers and two gateways, shared by the tests of a module."""
    c = Cluster(tmp_path_factory.mktemp("cluster"), brokers=2).start()
    try:
        c.gateway()
        c.gateway()
        yield c
    finally:
        c.stop()


@pytest.fixture
def clients() -> Iterator[list[Client]]:
    """The paho clients a test made (`new_client`), closed at its end."""
    made: list[Client] = []
    yield made
    for c in made:
        c.close()


def new_client(made: list[Client], port: int, **kw: Any) -> Client:
    """A paho client on `port`, kept in `made` (the `clients` fixture) to be closed."""
    c = Client(port, **kw)
    made.append(c)
    return c


def connected(made: list[Client], port: int, **kw: Any) -> Client:
    """new_client(), connected (clean session, no properties)."""
    c = new_client(made, port, **kw)
    c.connect()
    return c


def publish_unacked(pub: Client, receiver: Client, topic: str, n: int = 3) -> list:
    """`pub` publishes u0, u1, ... at QoS 1 and `receiver` (manual acks, none sent) gets
    them, none a DUP: the messages it holds unacknowledged."""
    for i in range(n):
        assert pub.publish(topic, f"u{i}".encode(), qos=1) == 0
    held = receiver.receive(n)
    assert [m.payload for m in held] == [f"u{i}".encode() for i in range(n)]
    assert not any(m.dup for m in held)
    return held


def resumed_with_dups(made: list[Client], port: int, client_id: str, held: list) -> Client:
    """The v3.1.1 session `client_id` resumed on `port`: it gets exactly `held` again, with
    DUP and their packet ids, and nothing more for now."""
    y = new_client(made, port, client_id=client_id, version=4)
    assert y.connect(clean_start=False)[1] is True
    again = y.receive(len(held))
    assert [(m.payload, m.mid, m.dup) for m in again] == [
        (m.payload, m.mid, True) for m in held]
    y.nothing()
    return y
