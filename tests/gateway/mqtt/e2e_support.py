"""Black-box harness for the MQTT acceptance tests (tests/gateway/mqtt/test_e2e_*.py).

The server under test is a child process, exactly as an operator runs it:
``python -m lmq serve --data-dir D --namesrv-port P --broker-port P --mqtt-port P``; the
tests reach it only over TCP, with real clients:

* `Client` — paho-mqtt 2.x (v3.1, v3.1.1, v5.0), driven from a thread of its own; every
  call blocks until the server has answered (CONNACK, SUBACK, PUBACK / PUBCOMP ...);
* `RawClient` — a plain socket and our sans-IO codec in the client role, for what no
  well-behaved client sends (malformed packets, too many QoS 2 in flight, an ack held back,
  a topic alias out of range) and to read the exact bytes a server sends (DUP, aliases);
* amqtt (asyncio) is run by the tests themselves with `asyncio.run`.

`LMQ_E2E_BROKER=mosquitto` runs the same tests against a Mosquitto child process instead
(tests marked `gateway_only` are skipped there): a check that the tests encode the MQTT
specification and not the quirks of our server.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.subscribeoptions import SubscribeOptions

from gateway.mqtt.codec import MqttCodec
from gateway.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Packet,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
)
from tests.ports import free_port
from tests.procs import stop_process

REPO = Path(__file__).resolve().parents[3]
PAHO_VERSION = {3: mqtt.MQTTv31, 4: mqtt.MQTTv311, 5: mqtt.MQTTv5}
#: Upper bound for anything the server should do "now" (a loaded 2-core CI box is slow).
TIMEOUT = 10.0
#: How long we watch for something that must NOT happen (a message, a will, a close).
QUIET = 0.6
#: Keepalive-driven tests: seconds of keepalive the client asks for.
SHORT_KEEPALIVE = 1
BROKER_KIND = os.environ.get("LMQ_E2E_BROKER", "lmq")

gateway_only = pytest.mark.skipif(
    BROKER_KIND != "lmq", reason="feature of lmq-gateway itself (not checked on Mosquitto)"
)


def uid() -> str:
    """A short unique token for client ids and topics (tests share a server)."""
    return uuid.uuid4().hex[:10]


def eventually(predicate: Callable[[], Any], timeout: float = TIMEOUT, what: str = "condition") -> Any:
    """Poll `predicate` until it returns something truthy; return it."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s")
        time.sleep(0.02)


def write_toml(path: Path, table: dict[str, Any]) -> None:
    """A TOML file of scalars (sub-tables one level deep); JSON literals are valid TOML."""
    lines = [f"{k} = {json.dumps(v)}" for k, v in table.items() if not isinstance(v, dict)]
    for name, sub in table.items():
        if isinstance(sub, dict):
            lines += [f"[{name}]"] + [f"{k} = {json.dumps(v)}" for k, v in sub.items()]
    path.write_text("\n".join(lines) + "\n")


# ------------------------------------------------------------------------------ servers
class Gateway:
    """`python -m lmq serve` with the MQTT gateway, as a child process.

    Ports and the data directory are chosen once, so `restart()` brings back the same
    server (sessions, retained messages and the store must survive it). `mqtt_config` is
    written to a TOML file given as `--mqtt-config`.
    """

    def __init__(self, root: Path, mqtt_config: dict[str, Any] | None = None) -> None:
        self.root = root
        self.data_dir = root / "data"
        self.mqtt_config = dict(mqtt_config or {})
        self.namesrv_port = free_port()
        self.broker_port = free_port()
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = root / "server.log"
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    def argv(self) -> list[str]:
        argv = [
            sys.executable, "-m", "lmq", "serve", "--no-grpc", "--host", "127.0.0.1", "--no-amqp",
            "--data-dir", str(self.data_dir),
            "--namesrv-port", str(self.namesrv_port),
            "--broker-port", str(self.broker_port),
            "--mqtt-port", str(self.port),
            "--log-level", "INFO",
        ]
        # Small, sparse store files: many servers run in one session on a small disk.
        broker_cfg = self.root / "broker.toml"
        write_toml(broker_cfg, {"broker": BROKER_TEST_CONFIG})
        argv += ["--config", str(broker_cfg)]
        if self.mqtt_config:
            cfg = self.root / "mqtt.toml"
            write_toml(cfg, self.mqtt_config)
            argv += ["--mqtt-config", str(cfg)]
        return argv

    def start(self, timeout: float = 60.0) -> Gateway:
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start {time.strftime('%X')}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv(), cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        """Until a CONNECT on the MQTT port is answered (any CONNACK: it may be refused)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                probe = RawClient(self.port, version=4, timeout=2.0)
            except OSError:
                time.sleep(0.05)
                continue
            try:
                probe.connect("e2e-probe-" + uid(), clean_start=True)
                probe.disconnect()
                return
            except (OSError, ConnectionError, AssertionError):
                pass
            finally:
                probe.close()
            time.sleep(0.1)
        raise RuntimeError(f"server not ready after {timeout} s:\n{self.log_tail()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill9(self) -> None:
        """SIGKILL: no shutdown code runs (what a power cut looks like to the process)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        stop_process(self.proc)

    def restart(self, *, hard: bool = True) -> None:
        """kill -9 (hard) or SIGTERM, then start again on the same ports and data."""
        if hard:
            self.kill9()
        else:
            self.stop()
        self.start()

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""


class Mosquitto(Gateway):
    """Mosquitto with an equivalent configuration (reference run of the same tests)."""

    # Our config key -> the mosquitto.conf option with the same meaning.
    _OPTIONS = {
        "max_packet_size": "max_packet_size",
        "receive_maximum": "max_inflight_messages",
        "max_keepalive": "max_keepalive",
    }

    def argv(self) -> list[str]:
        exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lines = [
            f"listener {self.port} 127.0.0.1",
            "allow_anonymous true",
            "persistence true",
            f"persistence_location {self.data_dir}/",
            "autosave_interval 1",
            "max_queued_messages 100000",
            "sys_interval 1",
        ]
        for key, option in self._OPTIONS.items():
            if key in self.mqtt_config:
                lines.append(f"{option} {self.mqtt_config[key]}")
        conf = self.root / "mosquitto.conf"
        conf.write_text("\n".join(lines) + "\n")
        return [exe, "-c", str(conf)]


def make_gateway(root: Path, mqtt_config: dict[str, Any] | None = None) -> Gateway:
    cls = Mosquitto if BROKER_KIND == "mosquitto" else Gateway
    return cls(root, mqtt_config)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One server shared by the tests of a module (they use distinct ids and topics)."""
    gw = make_gateway(tmp_path_factory.mktemp("gw"), DEFAULT_TEST_CONFIG).start()
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture
def new_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Gateway]]:
    """Factory for a server of the test's own (restarts, special configuration)."""
    started: list[Gateway] = []

    def make(mqtt_config: dict[str, Any] | None = None, **kw: Any) -> Gateway:
        config = dict(DEFAULT_TEST_CONFIG)
        config.update(mqtt_config or {}, **kw)
        gw = make_gateway(tmp_path_factory.mktemp("gw"), config)
        started.append(gw)
        return gw.start()

    yield make
    for gw in started:
        gw.stop()


BROKER_TEST_CONFIG: dict[str, Any] = {
    "commitlog_file_size": 16 * 1024 * 1024,
    "consume_queue_units_per_file": 20_000,
    "preallocate_files": False,
}
#: LMQ_TEST_APACHE_STRICT=1: every broker of the MQTT tests in `apache_strict` mode (the
#: multi-gateway tests always are: cluster_support.py).
if os.environ.get("LMQ_TEST_APACHE_STRICT") == "1":
    BROKER_TEST_CONFIG["apache_strict"] = True
#: Short periods so that the tests are fast (names as in gateway/mqtt/config.py).
DEFAULT_TEST_CONFIG: dict[str, Any] = {
    "sys_interval_s": 1.0,
    "expiry_check_interval_s": 0.2,
    "connect_timeout_s": 2.0,
}


# ------------------------------------------------------------------------------ paho client
def props(packet_type: int, **values: Any) -> PahoProperties:
    """paho Properties for `packet_type` (PacketTypes.PUBLISH ...) from keyword values."""
    p = PahoProperties(packet_type)
    for name, value in values.items():
        setattr(p, name, value)
    return p


def _one_writer(loop_write: Callable[[], Any]) -> Callable[[], Any]:
    """`loop_write` of a paho client, one thread at a time.

    paho 2.x writes from the thread that calls publish() (our I/O thread is not its
    `loop_start` thread, so publish() calls loop_write() itself) and from the I/O thread's
    loop(); `_packet_write` takes a packet off the queue and sends it with no lock, so
    the two threads could put two PUBLISHes on the wire in the wrong order (seen as a
    QoS 0 order "failure" of the server, test_e2e_harness.py drives it)."""
    lock = threading.RLock()

    def write() -> Any:
        with lock:
            return loop_write()

    return write


class Client:
    """A paho-mqtt client; each call blocks until the server answered it.

    Received PUBLISHes collect in `messages` (a queue of paho `MQTTMessage`); a CONNACK,
    SUBACK, UNSUBACK, PUBACK / PUBCOMP and the end of the connection each have a queue,
    so a test can wait for exactly the answer it expects.
    """

    def __init__(self, port: int, client_id: str | None = None, version: int = 5, *,
                 transport: str = "tcp", ws_path: str = "/mqtt", ca_file: str | None = None,
                 ) -> None:
        self.port = port
        self.version = version
        self.transport, self.ws_path, self.ca_file = transport, ws_path, ca_file
        self.client_id = client_id if client_id is not None else "c-" + uid()
        self.paho: mqtt.Client | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connacks: queue.Queue[tuple[int, bool, Any]] = queue.Queue()
        self.disconnects: queue.Queue[int | None] = queue.Queue()
        self._acks: dict[str, dict[int, Any]] = {"sub": {}, "unsub": {}, "pub": {}}
        self._acks_cv = threading.Condition()

    # -- connection
    def connect(self, *, clean_start: bool = True, keepalive: int = 60,
                properties: PahoProperties | None = None,
                will: tuple[str, bytes, int, bool] | None = None,
                will_properties: PahoProperties | None = None, username: str | None = None,
                password: str | None = None, expect_success: bool = True,
                ) -> tuple[int, bool, Any]:
        """Open a new connection; return (CONNACK reason code, session present, props).

        In v3.x paho reports the CONNACK return code as the v5 reason code it maps to
        (5 "not authorized" -> 0x87 ...).
        """
        self.close()
        kw: dict[str, Any] = {}
        if self.version != 5:
            kw["clean_session"] = clean_start
        c = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=self.client_id,
            protocol=PAHO_VERSION[self.version], reconnect_on_failure=False,
            transport=self.transport, **kw,
        )
        if self.transport == "websockets":
            c.ws_set_options(path=self.ws_path)
        if self.ca_file is not None:
            c.tls_set(ca_certs=self.ca_file)
        c.loop_write = _one_writer(c.loop_write)
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_message = lambda _c, _u, msg: self.messages.put(msg)
        c.on_subscribe = lambda _c, _u, mid, codes, p: self._ack("sub", mid, ([int(x.value) for x in codes], p))
        c.on_unsubscribe = lambda _c, _u, mid, codes, p: self._ack("unsub", mid, ([int(x.value) for x in codes], p))
        c.on_publish = lambda _c, _u, mid, code, p: self._ack("pub", mid, (int(code.value), p))
        if will is not None:
            c.will_set(*will, properties=will_properties)
        if username is not None:
            c.username_pw_set(username, password)
        self.paho = c
        self.connacks = queue.Queue()
        self.disconnects = queue.Queue()
        self._stop = threading.Event()
        ckw: dict[str, Any] = {"keepalive": keepalive}
        if self.version == 5:
            ckw["clean_start"] = clean_start
            ckw["properties"] = properties
        c.connect("127.0.0.1", self.port, **ckw)
        self._thread = threading.Thread(target=self._loop, args=(c, self._stop), daemon=True)
        self._thread.start()
        try:
            ack = self.connacks.get(timeout=TIMEOUT)
        except queue.Empty:
            raise AssertionError("no CONNACK") from None
        if expect_success:
            assert ack[0] == 0, f"CONNACK refused: 0x{ack[0]:02X}"
        return ack

    def _loop(self, c: mqtt.Client, stop: threading.Event) -> None:
        # Our own loop, not loop_start(): loop_stop() may wait a whole second for select.
        while not stop.is_set():
            rc = c.loop(timeout=0.01)
            if rc != mqtt.MQTT_ERR_SUCCESS:
                break

    def _on_connect(self, _c: Any, _u: Any, flags: Any, reason: Any, p: Any) -> None:
        self.connacks.put((int(reason.value), bool(flags.session_present), p))

    def _on_disconnect(self, _c: Any, _u: Any, flags: Any, reason: Any, p: Any) -> None:
        # The reason code of the server's DISCONNECT (v5), else paho's own code.
        self.disconnects.put(int(reason.value) if reason is not None else None)

    def _ack(self, kind: str, mid: int, value: Any) -> None:
        with self._acks_cv:
            self._acks[kind][mid] = value
            self._acks_cv.notify_all()

    def _wait_ack(self, kind: str, mid: int, timeout: float = TIMEOUT) -> Any:
        with self._acks_cv:
            ok = self._acks_cv.wait_for(lambda: mid in self._acks[kind], timeout)
            assert ok, f"no {kind} acknowledgement for mid {mid}"
            return self._acks[kind].pop(mid)

    def disconnect(self, reason: int | None = None, properties: PahoProperties | None = None) -> None:
        """Normal DISCONNECT (v5: with `reason` code), then wait for the socket to close."""
        assert self.paho is not None
        kw: dict[str, Any] = {}
        if self.version == 5 and reason is not None:
            from paho.mqtt.reasoncodes import ReasonCode

            kw["reasoncode"] = ReasonCode(PacketTypes.DISCONNECT, identifier=reason)
        if self.version == 5 and properties is not None:
            kw["properties"] = properties
        self.paho.disconnect(**kw)
        self.wait_closed()
        self.close()

    def drop(self) -> None:
        """Close the TCP connection without DISCONNECT (a device losing power)."""
        if self.paho is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        sock = self.paho.socket()
        if sock is not None:
            try:  # (a WebSocket or TLS wrapper has no shutdown of its own)
                getattr(sock, "_socket", sock).shutdown(socket.SHUT_RDWR)
            except (OSError, AttributeError):
                pass
            sock.close()
        self.paho = None

    def close(self) -> None:
        """Forget the connection (after it ended); drop it if still open."""
        if self.paho is not None and self._thread is not None and self._thread.is_alive():
            self.drop()
        self.paho = None

    def wait_closed(self, timeout: float = TIMEOUT) -> int | None:
        """Wait until the connection ends; the reason code paho reports for it."""
        try:
            return self.disconnects.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("connection still open") from None

    def is_connected(self) -> bool:
        return self.paho is not None and self.paho.is_connected()

    # -- operations
    def subscribe(self, *filters: str | tuple[str, int] | tuple[str, SubscribeOptions],
                  qos: int = 0, properties: PahoProperties | None = None) -> list[int]:
        """Subscribe and wait for the SUBACK; return its reason codes (granted QoS)."""
        assert self.paho is not None
        topics: list[tuple[str, Any]] = []
        for f in filters:
            if isinstance(f, str):
                f = (f, SubscribeOptions(qos=qos) if self.version == 5 else qos)
            elif self.version == 5 and isinstance(f[1], int):
                f = (f[0], SubscribeOptions(qos=f[1]))
            topics.append(f)
        rc, mid = self.paho.subscribe(topics, properties=properties)
        assert rc == mqtt.MQTT_ERR_SUCCESS, rc
        return self._wait_ack("sub", mid)[0]

    def unsubscribe(self, *filters: str) -> list[int]:
        assert self.paho is not None
        rc, mid = self.paho.unsubscribe(list(filters))
        assert rc == mqtt.MQTT_ERR_SUCCESS, rc
        return self._wait_ack("unsub", mid)[0]

    def publish(self, topic: str, payload: bytes | str = b"", qos: int = 0, retain: bool = False,
                properties: PahoProperties | None = None, wait: bool = True) -> int:
        """Publish; for QoS 1/2 wait for PUBACK / PUBCOMP and return its reason code."""
        assert self.paho is not None
        info = self.paho.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        assert info.rc == mqtt.MQTT_ERR_SUCCESS, info.rc
        if not wait:
            return 0
        return self._wait_ack("pub", info.mid)[0]

    # -- receiving
    def receive(self, n: int = 1, timeout: float = TIMEOUT) -> list[mqtt.MQTTMessage]:
        """Exactly the next `n` messages (fails if fewer arrive in time)."""
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            try:
                out.append(self.messages.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                got = [(m.topic, m.payload) for m in out]
                raise AssertionError(f"received {len(out)} of {n} messages: {got}") from None
        return out

    def receive_one(self, timeout: float = TIMEOUT) -> mqtt.MQTTMessage:
        return self.receive(1, timeout)[0]

    def nothing(self, quiet: float = QUIET) -> None:
        """Assert that no message arrives for `quiet` seconds."""
        try:
            msg = self.messages.get(timeout=quiet)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected message {msg.topic!r} {msg.payload!r} retain={msg.retain}")

    def drain(self, quiet: float = QUIET) -> list[mqtt.MQTTMessage]:
        """Everything that arrives until `quiet` seconds pass without a message."""
        out = []
        while True:
            try:
                out.append(self.messages.get(timeout=quiet))
            except queue.Empty:
                return out


def collect(members: list[Client], n: int, quiet: float = QUIET) -> list[list[mqtt.MQTTMessage]]:
    """What each of `members` receives: waits for `n` messages in all, then `quiet` more
    seconds (so that a surplus shows), and returns every member's messages."""
    got: list[list[mqtt.MQTTMessage]] = [[] for _ in members]

    def take() -> int:
        for i, m in enumerate(members):
            while True:
                try:
                    got[i].append(m.messages.get_nowait())
                except queue.Empty:
                    break
        return sum(len(g) for g in got)

    try:
        eventually(lambda: take() >= n, what=f"{n} messages")
    except AssertionError:
        pass  # the caller's assertion says what is missing
    time.sleep(quiet)
    take()
    return got


@pytest.fixture
def clients(gateway: Gateway) -> Iterator[Callable[..., Client]]:
    """Factory of paho clients on the module's server; all closed at the end of the test."""
    made: list[Client] = []

    def make(client_id: str | None = None, version: int = 5, port: int | None = None) -> Client:
        c = Client(port or gateway.port, client_id, version)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


# ------------------------------------------------------------------------------ raw client
class ConnectionClosed(Exception):
    """The server closed the TCP connection."""


class RawClient:
    """A socket plus MqttCodec(role="client"): full control over every byte sent."""

    def __init__(self, port: int, version: int = 5, timeout: float = TIMEOUT) -> None:
        self.version = version
        self.timeout = timeout
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.codec = MqttCodec(role="client")
        self.pending: list[Packet] = []
        self.eof = False

    def send(self, packet: Packet) -> None:
        self.sock.sendall(self.codec.encode(packet))

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def connect(self, client_id: str, **kw: Any) -> Connack:
        """CONNECT (fields as in `Connect`) and return the CONNACK."""
        p = kw.get("properties")
        if p is not None and p.topic_alias_maximum:
            self.codec.topic_alias_maximum = p.topic_alias_maximum  # accept the server's aliases
        self.send(Connect(client_id=client_id, protocol_version=self.version, **kw))
        ack = self.recv()
        assert isinstance(ack, Connack), ack
        return ack

    def recv(self, timeout: float | None = None) -> Packet:
        """The next packet; raises TimeoutError, or ConnectionClosed at EOF."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.pending:
            if self.eof:
                raise ConnectionClosed()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no packet")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise TimeoutError("no packet") from None
            except ConnectionResetError:
                data = b""
            if not data:
                self.eof = True
                continue
            self.pending += self.codec.feed(data)
        return self.pending.pop(0)

    def expect(self, cls: type, timeout: float | None = None) -> Any:
        packet = self.recv(timeout)
        assert isinstance(packet, cls), f"expected {cls.__name__}, got {packet!r}"
        return packet

    def nothing(self, quiet: float = QUIET) -> None:
        try:
            packet = self.recv(quiet)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected packet {packet!r}")

    def until_closed(self, timeout: float = TIMEOUT) -> list[Packet]:
        """Wait for the server to close the connection; the packets it sent before."""
        got: list[Packet] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                got.append(self.recv(max(0.01, deadline - time.monotonic())))
            except ConnectionClosed:
                return got
            except TimeoutError:
                raise AssertionError(f"connection still open; received {got}") from None

    def subscribe(self, *subs: Subscription, packet_id: int = 1, properties: Properties | None = None) -> Suback:
        kw = {"properties": properties} if properties is not None else {}
        self.send(Subscribe(packet_id, tuple(subs), **kw))
        ack = self.expect(Suback)
        assert ack.packet_id == packet_id
        return ack

    def publish_qos1(self, topic: str, payload: bytes, packet_id: int, **kw: Any) -> Puback:
        self.send(Publish(topic, payload, qos=1, packet_id=packet_id, **kw))
        ack = self.expect(Puback)
        assert ack.packet_id == packet_id
        return ack

    def publish_qos2(self, topic: str, payload: bytes, packet_id: int, **kw: Any) -> None:
        self.send(Publish(topic, payload, qos=2, packet_id=packet_id, **kw))
        assert self.expect(Pubrec).packet_id == packet_id
        self.send(Pubrel(packet_id))
        assert self.expect(Pubcomp).packet_id == packet_id

    def disconnect(self, reason: int = 0) -> None:
        try:
            self.send(Disconnect(reason))
        except OSError:
            pass
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


@pytest.fixture
def raw(gateway: Gateway) -> Iterator[Callable[..., RawClient]]:
    """Factory of raw clients on the module's server; all closed at the end of the test."""
    made: list[RawClient] = []

    def make(version: int = 5, port: int | None = None) -> RawClient:
        c = RawClient(port or gateway.port, version)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()

