"""A real name server and broker(s) on free ports, in-process or as child processes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from trio.testing import wait_all_tasks_blocked

from core.broker.config import BrokerConfig
from core.cluster import EmbeddedServer
from core.namesrv import NamesrvConfig
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[3]


@dataclass
class Cluster:
    namesrv_addr: str
    servers: list[EmbeddedServer] = field(default_factory=list)
    data_dirs: list[str] = field(default_factory=list)

    @property
    def broker_addrs(self) -> list[str]:
        return [s.broker_config.broker_addr for s in self.servers]

    @property
    def brokers(self):
        return [s.broker for s in self.servers]


def broker_config(data_dir: str, name: str, namesrv: list[str] | None = None, **kw: Any) -> BrokerConfig:
    base = dict(host="127.0.0.1", port=free_port(), data_dir=data_dir, broker_name=name,
                namesrv_addrs=namesrv or [], commitlog_file_size=64 * 1024 * 1024)
    base.update(kw)
    return BrokerConfig(**base)


@asynccontextmanager
async def cluster(n_brokers: int = 1, **broker_kw: Any) -> AsyncIterator[Cluster]:
    """Name server + `n_brokers` brokers ("broker-a", "broker-b" ...) in this trio run."""
    root = tempfile.mkdtemp(prefix="lmq-client-test-")
    try:
        async with _serve(root, n_brokers, broker_kw) as c:
            yield c
    finally:
        shutil.rmtree(root, ignore_errors=True)


@asynccontextmanager
async def _serve(root: str, n_brokers: int, broker_kw: dict) -> AsyncIterator[Cluster]:
    async with trio.open_nursery() as nursery:
        first = EmbeddedServer(
            broker_config(os.path.join(root, "a"), "broker-a", **broker_kw),
            NamesrvConfig(host="127.0.0.1", port=free_port()),
        )
        await nursery.start(first.serve)
        c = Cluster(first.namesrv_addr, [first], [os.path.join(root, "a")])
        for i in range(1, n_brokers):
            name = "broker-" + chr(ord("a") + i)
            d = os.path.join(root, name)
            srv = EmbeddedServer(broker_config(d, name, [c.namesrv_addr], **broker_kw))
            await nursery.start(srv.serve)
            c.servers.append(srv)
            c.data_dirs.append(d)
        await wait_registered(c.namesrv_addr, n_brokers)
        try:
            yield c
        finally:
            for srv in reversed(c.servers):
                srv.stop()


def start_cluster(**broker_kw: Any) -> tuple[dict, Any]:
    """A `cluster()` served from a background thread (its own trio run), for tests whose
    body is blocking code: (box, stop), box holding `addr` (name server), `broker` (its
    address) and `cluster`; stop() ends it."""
    ready = threading.Event()
    box: dict = {}

    async def main():
        async with cluster(**broker_kw) as c:
            box.update(addr=c.namesrv_addr, broker=c.broker_addrs[0], cluster=c,
                       token=trio.lowlevel.current_trio_token(), stop=trio.Event())
            ready.set()
            await box["stop"].wait()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    assert ready.wait(30), "cluster did not start"

    def stop():
        trio.from_thread.run_sync(box["stop"].set, trio_token=box["token"])
        thread.join(30)
    return box, stop


async def wait_registered(namesrv_addr: str, n_brokers: int) -> None:
    """Until the name server lists `n_brokers` brokers (registration is asynchronous)."""
    from core.client.instance import ClientInstance

    async with ClientInstance(namesrv_addr=namesrv_addr) as probe:
        async def registered():
            return len((await probe.api.get_cluster_info()).brokers) >= n_brokers
        await wait_for(registered)


class BrokerProcess:
    """`python -m lmq broker` as a child process (to be killed with SIGKILL)."""

    def __init__(self, namesrv_addr: str, name: str) -> None:
        self.root = tempfile.mkdtemp(prefix="lmq-client-test-proc-")
        data_dir = os.path.join(self.root, name)
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lmq", "broker", "--host", "127.0.0.1",
             "--broker-port", str(self.port), "--namesrv-addr", namesrv_addr,
             "--broker-name", name, "--data-dir", data_dir, "--log-level", "WARNING"],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )

    async def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                s = await trio.open_tcp_stream("127.0.0.1", self.port)
                await s.aclose()
                return
            except OSError:
                await trio.sleep(0.1)
        raise TimeoutError("broker did not start")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)


async def wait_for(predicate, timeout: float = 20.0, interval: float = 0.05,
                   what: str = "condition"):
    """Poll `predicate()` (plain or async) until it returns a true value, which is returned;
    fail the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if hasattr(value, "__await__"):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await trio.sleep(interval)


def _consumer_idle(consumer) -> bool:
    """Nothing pulled is waiting for or inside the listener."""
    if any(not pq.is_empty() for pq in getattr(consumer, "pq_table", {}).values()):
        return False
    send_ch = getattr(consumer, "_send_ch", None)
    if send_ch is not None and send_ch.statistics().current_buffer_used:
        return False
    return not getattr(consumer, "_inflight", 0)


async def settle(*consumers, timeout: float = 20.0) -> None:
    """Wait until the consumers are idle and every task of this trio run (brokers and name
    server of an in-process `cluster()` included) is blocked: every message a broker would
    hand out now has been delivered and consumed. Stands in for "sleep a while, then assert
    nothing more arrived". Polls (bounded) because sync listeners run in worker threads,
    which `wait_all_tasks_blocked` does not wait for."""
    with trio.fail_after(timeout):
        while True:
            await wait_all_tasks_blocked()
            if all(_consumer_idle(c) for c in consumers):
                return
            await trio.sleep(0.01)
