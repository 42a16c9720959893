"""`lmq serve --grpc-port` and the stand-alone `lmq proxy`, as processes, with the
official 5.x client; a proxy killed with -9 loses nothing: its successor accepts the
receipt handles the first one gave out (docs/grpc.md "Stateless")."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from lmq.cli import build_parser
from tests.core.broker.harness import free_port
from tests.gateway.grpc5.harness import (
    GrpcCluster,
    drive,
    finish_driver,
    start_driver,
    wait_port,
)

ROOT = Path(__file__).resolve().parents[3]


def _lmq(*args: str) -> subprocess.Popen:
    # stderr to a file, not a pipe nobody reads (a full pipe would block the server).
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([sys.executable, "-m", "lmq", *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=log)
    proc.log = log  # type: ignore[attr-defined]
    return proc


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    proc.log.close()


def test_grpc_flags():
    parser = build_parser()
    args = parser.parse_args(["serve"])
    assert (args.grpc_port, args.no_grpc) == (8081, False)
    assert parser.parse_args(["serve", "--no-grpc"]).no_grpc
    proxy = parser.parse_args(["proxy", "--namesrv-addr", "a:1;b:2", "--grpc-port", "9"])
    assert (proxy.namesrv_addr, proxy.grpc_port) == ("a:1;b:2", 9)


def test_proxy_refuses_an_open_port_without_acl():
    r = subprocess.run([sys.executable, "-m", "lmq", "proxy", "--host", "0.0.0.0",
                        "--grpc-port", "0"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2
    assert "--acl-file" in r.stderr and "--allow-unauthenticated" in r.stderr


@pytest.mark.slow  # ~10 s; the fast tier covers a process with lmq proxy
def test_lmq_serve_speaks_grpc(rmq5_python, tmp_path):
    port = free_port()
    proc = _lmq("serve", "--data-dir", str(tmp_path / "data"), "--namesrv-port", "0",
                "--broker-port", "0", "--no-mqtt", "--no-amqp", "--grpc-port", str(port))
    try:
        wait_port(port, proc=proc)
        endpoint = f"127.0.0.1:{port}"
        sent = drive(rmq5_python, endpoint=endpoint, op="produce", topic="S", bodies=["s1"])
        assert len(sent["ids"]) == 1  # the topic was created by this first send
        drive(rmq5_python, endpoint=endpoint, op="simple", topic="S", group="GS", want=0,
              await_s=1, then_empty=True)
        drive(rmq5_python, endpoint=endpoint, op="produce", topic="S", bodies=["s2"])
        got = drive(rmq5_python, endpoint=endpoint, op="simple", topic="S", group="GS",
                    want=1, await_s=2)
        assert [m["body"] for m in got["messages"]] == ["s2"]
    finally:
        _stop(proc)


def test_proxy_killed_with_9_keeps_receipts(rmq5_python, tmp_path):
    with GrpcCluster(tmp_path) as cluster:
        cluster.create_topic("P")
        port = free_port()
        endpoint = f"127.0.0.1:{port}"
        args = ("proxy", "--namesrv-addr", cluster.namesrv_addr, "--grpc-port", str(port))
        proxy = _lmq(*args)
        holder = None
        try:
            wait_port(port, proc=proxy)
            drive(rmq5_python, endpoint=endpoint, op="simple", topic="P", group="GP",
                  want=0, await_s=1, then_empty=True)
            drive(rmq5_python, endpoint=endpoint, op="produce", topic="P",
                  bodies=["p1", "p2", "p3"])
            holder = start_driver(rmq5_python, endpoint=endpoint, op="hold", topic="P",
                                  group="GP", want=3, invisible_s=60)
            assert "held" in holder.stdout.readline()
            proxy.kill()  # kill -9: no goodbye to anyone
            proxy.wait()
            proxy.log.close()
            proxy = _lmq(*args)
            wait_port(port, proc=proxy)
            result = finish_driver(holder, stdin="\n")
            holder = None
            assert sorted(result["held"]) == ["p1", "p2", "p3"]
            # The new proxy accepted every handle the killed one gave out.
            assert sorted(result["acked"]) == ["p1", "p2", "p3"]
            again = drive(rmq5_python, endpoint=endpoint, op="simple", topic="P",
                          group="GP", want=0, await_s=1, then_empty=True)
            assert again["events"] == ["extra:0"]
        finally:
            if holder is not None:
                holder.kill()
            _stop(proxy)
