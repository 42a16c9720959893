"""Test harness of the broker-core tests.

* In-process: `run_embedded(fn, tmp_path, **broker_overrides)` runs a real name server and
  broker (TCP on free ports) in `trio.run` and calls ``await fn(server, client)`` with a
  `RemotingClient`.
* Out of process: `ServerProcess` runs `python -m lmq serve` / `lmq broker`; `Driver`
  runs a C++ driver script (tests/core/broker/cpp_drivers) and collects its JSON lines.
* `sync_invoke` speaks the remoting protocol over a plain blocking socket.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from core.broker.config import BrokerConfig
from core.cluster import EmbeddedServer
from core.common.codec import BatchItem, encode_batch
from core.common.properties import encode_properties
from core.namesrv import NamesrvConfig
from core.remoting.client import RemotingClient
from core.remoting.codec import FrameDecoder, RemotingCommand, encode_command_bytes
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[3]
DRIVERS = Path(__file__).resolve().parent / "cpp_drivers"


# Small, sparse store files: a default broker preallocates a 1 GiB CommitLog file.
SMALL_FILES = {
    "commitlog_file_size": 8 * 1024 * 1024,
    "consume_queue_units_per_file": 10_000,
    "preallocate_files": False,
}
SMALL_FILES_TOML = "".join(
    f"{k} = {str(v).lower() if isinstance(v, bool) else v}\n" for k, v in SMALL_FILES.items()
)


# ---------------------------------------------------------------------- in-process
def run_embedded(
    fn: Callable[[EmbeddedServer, RemotingClient], Awaitable[None]],
    tmp_path: Path,
    *,
    namesrv: dict | None = None,
    timeout: float = 60.0,
    processors=None,
    clock=None,
    **broker_kw,
) -> None:
    """Run name server + broker in this process and `await fn(server, client)`.

    `clock` (a `trio.testing.MockClock`) lets a test hold time still and jump it, so
    "still waiting after N seconds" is asserted without sleeping N seconds."""
    broker_kw.setdefault("host", "127.0.0.1")
    broker_kw.setdefault("port", 0)
    broker_kw.setdefault("data_dir", str(tmp_path / "data"))
    for key, value in SMALL_FILES.items():
        broker_kw.setdefault(key, value)
    config = BrokerConfig(**broker_kw)
    ns_config = NamesrvConfig(host="127.0.0.1", port=0, **(namesrv or {}))

    async def main() -> None:
        server = EmbeddedServer(config, ns_config)
        with trio.fail_after(timeout):
            async with trio.open_nursery() as nursery:
                await nursery.start(server.serve)
                async with RemotingClient(request_timeout=10.0, processors=processors) as client:
                    await fn(server, client)
                server.stop()

    trio.run(main, clock=clock)


def send_request(
    topic: str,
    body: bytes = b"hello",
    *,
    code: int = 10,
    queue_id: int = 0,
    properties: dict[str, str] | str | None = None,
    batch: bool | str | None = None,
    sys_flag: int = 0,
    group: str = "PID_TEST",
    reconsume_times: int | None = None,
    default_topic: str = "TBW102",
    drop: tuple[str, ...] = (),
    extra: dict | None = None,
) -> RemotingCommand:
    """A send request the way clients build it (V1 names for 10, letters for 310/320).
    Values are JSON numbers where the C++ client sends numbers (docs/protocol.md §1.4 rule 4)."""
    props = properties if isinstance(properties, str) else encode_properties(properties or {})
    long = {
        "producerGroup": group,
        "topic": topic,
        "defaultTopic": default_topic,
        "defaultTopicQueueNums": 4,
        "queueId": queue_id,
        "sysFlag": sys_flag,
        "bornTimestamp": str(int(time.time() * 1000)),
        "flag": 0,
        "properties": props,
        "reconsumeTimes": str(reconsume_times or 0),
        "unitMode": "0",
    }
    if batch is not None:
        long["batch"] = batch if isinstance(batch, str) else ("1" if batch else "0")
    letters = dict(zip(
        ("producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
         "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode",
         "maxReconsumeTimes", "batch"),
        "abcdefghijklm", strict=True,
    ))
    ext = long if code == 10 else {letters[k]: v for k, v in long.items()}
    for name in drop:
        ext.pop(name, None)
    ext.update(extra or {})
    return RemotingCommand.request(code, ext, body)


def batch_body(items: list[tuple[bytes, dict[str, str]]]) -> bytes:
    return encode_batch([BatchItem(0, b, encode_properties(p)) for b, p in items])


def pull_request(
    group: str, topic: str, queue_id: int = 0, offset: int = 0, *, sys_flag: int = 4,
    subscription: str = "*", expression_type: str | None = None, suspend_ms: int = 0,
    max_nums: int = 32, commit_offset: int = -1,
) -> RemotingCommand:
    ext = {
        "consumerGroup": group,
        "topic": topic,
        "queueId": queue_id,
        "queueOffset": str(offset),
        "maxMsgNums": max_nums,
        "sysFlag": sys_flag,
        "commitOffset": str(commit_offset),
        "suspendTimeoutMillis": str(suspend_ms),
        "subscription": subscription,
        "subVersion": "0",
    }
    if expression_type:
        ext["expressionType"] = expression_type
    return RemotingCommand.request(11, ext)


def heartbeat_request(client_id: str, consumers=(), producers=()) -> RemotingCommand:
    body = {"clientID": client_id}
    if consumers:
        body["consumerDataSet"] = list(consumers)
    if producers:
        body["producerDataSet"] = [{"groupName": g} for g in producers]
    return RemotingCommand.request(34, {}, json.dumps(body).encode())


def cpp_consumer_data(group: str, topic: str, sub: str = "*", model: int = 1) -> dict:
    """A consumer entry as the C++ client writes it (docs/protocol.md §6.2): ordinals, codeSet garbage."""
    return {
        "consumeFromWhere": 0, "consumeType": 1, "groupName": group, "messageModel": model,
        "subscriptionDataSet": [
            {"subString": "*", "subVersion": "1795252577363", "topic": f"%RETRY%{group}"},
            {"codeSet": [0, 0], "subString": sub, "subVersion": "1795252632414",
             "tagsSet": [t.strip() for t in sub.split("||")] if sub != "*" else [],
             "topic": topic},
        ],
    }


# ---------------------------------------------------------------------- plain sockets
def sync_invoke(addr: str, cmd: RemotingCommand, timeout: float = 5.0) -> RemotingCommand:
    """One request over a fresh blocking socket; returns the response."""
    host, _, port = addr.rpartition(":")
    cmd.opaque = 7
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(encode_command_bytes(cmd))
        decoder = FrameDecoder()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("closed before the response")
            for resp in decoder.feed(data):
                if resp.is_response and resp.opaque == 7:
                    return resp
    raise TimeoutError("no response")


def route_of(namesrv_addr: str, topic: str) -> dict | None:
    resp = sync_invoke(namesrv_addr, RemotingCommand.request(105, {"topic": topic}))
    if resp.code != 0:
        return None
    return json.loads(resp.body_bytes())


def create_topic(addr: str, topic: str, queues: int = 4) -> None:
    """UPDATE_AND_CREATE_TOPIC on one broker (read/write queues, perm RW)."""
    resp = sync_invoke(addr, RemotingCommand.request(17, {
        "topic": topic, "defaultTopic": "TBW102", "readQueueNums": str(queues),
        "writeQueueNums": str(queues), "perm": "6", "topicFilterType": "SINGLE_TAG"}))
    assert resp.code == 0, resp.remark


def has_topic(addr: str, topic: str) -> bool:
    """Whether a broker holds `topic` (GET_ALL_TOPIC_CONFIG)."""
    resp = sync_invoke(addr, RemotingCommand.request(21, {}))
    return topic in json.loads(resp.body_bytes())["topicConfigTable"]


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.2,
               what: str = "condition"):
    deadline = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (OSError, ConnectionError, TimeoutError) as exc:
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what} (last error {last_exc!r})")


# ---------------------------------------------------------------------- processes
class ServerProcess:
    """`python -m lmq serve` (or `lmq broker` with `namesrv_addr`) in a subprocess."""

    def __init__(
        self,
        data_dir: Path,
        *,
        namesrv_port: int | None = None,
        broker_port: int | None = None,
        namesrv_addr: str | None = None,
        broker_name: str = "broker-a",
        config_text: str | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.data_dir = Path(data_dir)
        self.standalone_broker = namesrv_addr is not None
        self.namesrv_port = namesrv_port or (None if namesrv_addr else free_port())
        self.broker_port = broker_port or free_port()
        self.namesrv_addr = namesrv_addr or f"127.0.0.1:{self.namesrv_port}"
        self.broker_addr = f"127.0.0.1:{self.broker_port}"
        self.broker_name = broker_name
        self.config_text = config_text
        self.extra_args = extra_args
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-{broker_name}.log"

    def start(self, wait: float = 30.0) -> ServerProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "lmq"]
        if self.standalone_broker:
            args += ["broker", "--namesrv-addr", self.namesrv_addr]
        else:
            args += ["serve", "--no-grpc", "--no-amqp", "--namesrv-port", str(self.namesrv_port)]
        args += [
            "--data-dir", str(self.data_dir), "--host", "127.0.0.1",
            "--broker-port", str(self.broker_port), "--broker-name", self.broker_name,
            *self.extra_args,
        ]
        # Top-level keys must come before any [table] of the test's own config text.
        cfg = self.data_dir.parent / f"{self.data_dir.name}-{self.broker_name}.toml"
        cfg.write_text(SMALL_FILES_TOML + (self.config_text or ""))
        args += ["--config", str(cfg)]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, cwd=str(REPO), stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_until(self._registered, wait, what=f"{self.broker_name} registered")
        return self

    def _registered(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"server exited early, see {self.log_path}:\n{self.log()}")
        route = route_of(self.namesrv_addr, self.broker_name)
        return bool(route and any(
            bd["brokerName"] == self.broker_name for bd in route.get("brokerDatas", [])
        ))

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def kill(self) -> None:
        """kill -9: no shutdown code runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait for a clean exit; returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise AssertionError(f"server did not stop on SIGTERM:\n{self.log()}") from None
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.kill()


class Driver:
    """A C++ driver script in a subprocess; stdout JSON lines collected by a thread."""

    def __init__(self, script: str, *args: str) -> None:
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = subprocess.Popen(
            [sys.executable, str(DRIVERS / script), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            cwd=str(REPO), env=env,
        )
        self.events: list[dict] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()

    def of(self, kind: str) -> list[dict]:
        with self._cond:
            return [e for e in self.events if e.get("event") == kind]

    def wait_for(self, predicate: Callable[[list[dict]], bool], timeout: float, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self.events):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(
                        f"driver: timed out waiting for {what}; got {self.events[-5:]}"
                    )
                self._cond.wait(min(remaining, 0.5))

    def close(self, timeout: float = 60.0) -> list[dict]:
        """Close stdin (the stop signal for consumers) and wait for the process."""
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(5)
        return self.events

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def run_driver(script: str, *args: str, timeout: float = 120.0) -> list[dict]:
    """Run a driver to completion and return its events."""
    driver = Driver(script, *args)
    try:
        driver.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        driver.kill()
        raise AssertionError(f"{script} did not finish: {driver.events[-5:]}") from None
    driver._reader.join(5)
    return driver.events
