"""Secure defaults: every listener binds to loopback, and a remoting port exposed on
another address with ACL off is refused unless explicitly allowed."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
from trio.testing import trio_test

from core.namesrv import NameServer, NamesrvConfig
from core.remoting.security import InsecureListenerError, is_loopback_host
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[3]


def non_loopback_ip() -> str | None:
    """An address of this machine other than loopback (None when there is none)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.254", 9))  # no packet is sent: this only picks a route
            ip = s.getsockname()[0]
    except OSError:
        return None
    return None if ip.startswith("127.") or ip == "0.0.0.0" else ip


def can_connect(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def test_loopback_host_check() -> None:
    assert is_loopback_host("127.0.0.1") and is_loopback_host("::1")
    assert is_loopback_host("localhost")
    for host in ("0.0.0.0", "", "::", "192.0.2.7"):
        assert not is_loopback_host(host)


@pytest.mark.slow
def test_lmq_serve_defaults_listen_on_loopback_only(tmp_path: Path) -> None:
    ip = non_loopback_ip()
    if ip is None:
        pytest.skip("this machine has no non-loopback address")
    ports = {"namesrv": free_port(), "broker": free_port(), "mqtt": free_port(),
             "amqp": free_port(), "grpc": free_port()}
    (tmp_path / "broker.toml").write_text(
        "[broker]\ncommitlog_file_size = 16777216\npreallocate_files = false\n"
    )
    argv = [
        sys.executable, "-m", "lmq", "serve", "--data-dir", str(tmp_path / "data"),
        "--config", str(tmp_path / "broker.toml"),
        "--namesrv-port", str(ports["namesrv"]), "--broker-port", str(ports["broker"]),
        "--mqtt-port", str(ports["mqtt"]), "--amqp-port", str(ports["amqp"]),
        "--grpc-port", str(ports["grpc"]),
    ]  # no --host: the defaults are under test
    with open(tmp_path / "server.log", "wb") as log:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while not all(can_connect("127.0.0.1", p) for p in ports.values()):
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            time.sleep(0.1)
        for name, port in ports.items():
            assert not can_connect(ip, port), f"{name} port reachable on {ip}"
    finally:
        proc.terminate()
        proc.wait(30)


def test_exposed_remoting_port_without_acl_is_refused_by_the_cli(tmp_path: Path) -> None:
    for argv in (
        ["serve", "--data-dir", str(tmp_path / "d"), "--host", "0.0.0.0"],
        ["namesrv", "--host", "0.0.0.0", "--port", "0"],
        ["broker", "--data-dir", str(tmp_path / "d"), "--host", "0.0.0.0",
         "--namesrv-addr", "127.0.0.1:1"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "lmq", *argv], cwd=REPO, capture_output=True, timeout=60
        )
        assert done.returncode == 2, done.stderr
        assert b"--allow-unauthenticated" in done.stderr
        assert not (tmp_path / "d").exists()  # refused before anything started


@trio_test
async def test_exposed_port_needs_acl_or_explicit_allowance(caplog) -> None:
    with pytest.raises(InsecureListenerError):
        NameServer(NamesrvConfig(host="0.0.0.0", port=0))
    config = NamesrvConfig(host="0.0.0.0", port=0)
    config.acl_enable = True  # the ACL field (another module adds it to the dataclass)
    NameServer(config)
    with caplog.at_level(logging.WARNING):
        nameserver = NameServer(
            NamesrvConfig(host="0.0.0.0", port=0, allow_unauthenticated_remote=True)
        )
    assert any("without authentication" in r.getMessage() for r in caplog.records)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(nameserver.serve)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.aclose()
        nameserver.close()
