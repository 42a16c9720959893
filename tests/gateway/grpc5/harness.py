"""A real embedded name server + broker + gRPC front end on free ports, run by trio in a
background thread, and the official 5.x client driven in its own venv by subprocess."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from core.broker.config import BrokerConfig
from core.client import ClientInstance
from core.cluster import EmbeddedServer
from core.namesrv import NamesrvConfig
from gateway.grpc5.config import GrpcConfig
from gateway.grpc5.embedded import GrpcService
from tests.core.broker.harness import SMALL_FILES

DRIVER = Path(__file__).resolve().parent / "rmq5_driver.py"


class GrpcCluster:
    """``with GrpcCluster(tmp_path) as c:`` -> `c.endpoint`, `c.namesrv_addr`, `c.call`."""

    def __init__(self, tmp_path: Path, grpc: GrpcConfig | None = None, **broker_kw) -> None:
        broker_kw.setdefault("host", "127.0.0.1")
        broker_kw.setdefault("port", 0)
        broker_kw.setdefault("data_dir", str(tmp_path / "data"))
        for key, value in SMALL_FILES.items():
            broker_kw.setdefault(key, value)
        self.broker_config = BrokerConfig(**broker_kw)
        self.service = GrpcService(grpc or GrpcConfig(port=0))
        self.server: EmbeddedServer | None = None
        self.port = 0
        self._token: trio.lowlevel.TrioToken | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def namesrv_addr(self) -> str:
        assert self.server is not None
        return self.server.namesrv_addr

    def _run(self) -> None:
        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            self.server = EmbeddedServer(self.broker_config,
                                         NamesrvConfig(host="127.0.0.1", port=0),
                                         services=[self.service])
            async with trio.open_nursery() as nursery:
                await nursery.start(self.server.serve)
                self.port = self.service.server.port
                self._ready.set()  # the nursery now waits for serve (until stop())

        try:
            trio.run(main)
        except BaseException as exc:  # noqa: BLE001
            self._error = exc
            self._ready.set()

    def __enter__(self) -> GrpcCluster:
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise RuntimeError(f"server did not start: {self._error!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None and self.server is not None:
            try:
                trio.from_thread.run_sync(self.server.stop, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        self._thread.join(30)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run an async function on the server's trio loop."""
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def with_client(self, fn: Callable[[ClientInstance], Any]) -> Any:
        """`await fn(client)` with a native 4.x-protocol client over TCP."""
        async def run() -> Any:
            async with ClientInstance(namesrv_addr=self.namesrv_addr) as client:
                return await fn(client)

        return self.call(run)


    def create_topic(self, topic: str, queues: int = 4) -> None:
        """Create `topic` on the broker (through the gateway's in-process client, trusted
        when ACL is on) and wait until the name server routes it."""
        addr = self.server.broker.broker_addr
        client = self.service.server.client

        async def create() -> None:
            await client.api.create_topic(addr, topic, queues, queues)
            with trio.fail_after(10):
                while await client.api.get_route(topic) is None:
                    await trio.sleep(0.05)

        self.call(create)


def wait_port(port: int, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Until something accepts TCP connections on 127.0.0.1:`port`."""
    import socket
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
                raise AssertionError(f"nothing listens on {port}") from None
            time.sleep(0.1)


def drive(python: str, timeout: float = 90, **args: Any) -> dict:
    """Run one driver op in the 5.x client's venv; its final JSON line."""
    proc = subprocess.run([python, str(DRIVER), json.dumps(args)], capture_output=True,
                          text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise AssertionError(f"driver printed nothing (rc {proc.returncode}): "
                             f"{proc.stderr[-3000:]}")
    result = json.loads(lines[-1])
    if "error" in result:
        raise AssertionError(f"driver failed: {result['error']}\n{proc.stderr[-3000:]}")
    return result


def start_driver(python: str, **args: Any) -> subprocess.Popen:
    """Start a long-running driver op (push consumers); read its lines from stdout."""
    return subprocess.Popen([python, str(DRIVER), json.dumps(args)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_driver(proc: subprocess.Popen, timeout: float = 90, stdin: str = "") -> dict:
    out, err = proc.communicate(stdin, timeout=timeout)
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"error": f"no output: {err[-3000:]}"}
    if "error" in result:
        raise AssertionError(f"driver failed: {result['error']}\n{err[-3000:]}")
    return result
