"""A real gateway (name server + broker + MQTT gateway in one trio run) on free ports,
served from a background thread so that tests can drive blocking paho clients; and a
`lmq serve` subprocess for the restart tests. Data directories are removed afterwards."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import trio
from paho.mqtt.enums import CallbackAPIVersion

from core.broker.config import BrokerConfig
from core.cluster import EmbeddedServer
from core.namesrv import NamesrvConfig
from gateway.mqtt.config import MqttConfig
from gateway.mqtt.embedded import MqttService
from tests.ports import free_port
from tests.trio_thread import TrioThread

REPO = Path(__file__).resolve().parents[3]
SMALL_STORE = dict(commitlog_file_size=8 * 1024 * 1024, consume_queue_units_per_file=20_000,
                   preallocate_files=False)


class GatewayServer(TrioThread):
    """Embedded broker + MQTT gateway in a thread. `port` is the MQTT TCP port."""

    def __init__(self, data_dir: str | None = None, extra_brokers: int = 0,
                 **mqtt_kw: Any) -> None:
        super().__init__()
        self.extra_brokers = extra_brokers
        self.own_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="lmq-mqtt-test-")
        kw = dict(host="127.0.0.1", port=0, sys_interval_s=0, state_flush_interval_s=0.1,
                  expiry_check_interval_s=0.2, gc_freeze_at_start=False)
        kw.update(mqtt_kw)
        self.mqtt_config = MqttConfig(**kw)
        self.service: MqttService | None = None
        self.server: EmbeddedServer | None = None

    @property
    def gateway(self):
        return self.service.gateway

    @property
    def port(self) -> int:
        return self.gateway.ports["tcp"]

    def start(self) -> GatewayServer:
        self.start_thread("gateway")
        return self

    async def _main(self) -> None:
        bc = BrokerConfig(host="127.0.0.1", port=free_port(),
                          data_dir=os.path.join(self.data_dir, "broker"), **SMALL_STORE,
                          apache_strict=os.environ.get("LMQ_TEST_APACHE_STRICT") == "1")
        self.service = MqttService(self.mqtt_config)
        self.server = EmbeddedServer(bc, NamesrvConfig(host="127.0.0.1", port=0),
                                     services=[self.service])
        async with trio.open_nursery() as nursery:
            await nursery.start(self.server.serve)
            self.others = []
            for i in range(self.extra_brokers):
                # Reached over TCP: without broker ACL it must allow multi-dispatch
                # from TCP clients (docs/acl.md §4).
                other = EmbeddedServer(BrokerConfig(
                    host="127.0.0.1", port=free_port(), broker_name=f"broker-x{i}",
                    allow_inner_properties_without_acl=True,
                    namesrv_addrs=[self.server.namesrv_addr],
                    data_dir=os.path.join(self.data_dir, f"broker-x{i}"), **SMALL_STORE), None)
                await nursery.start(other.serve)
                self.others.append(other)
            self._ready.set()

    def stop(self) -> None:
        if self._thread is None:
            return
        try:
            self.call(self.service.stop)
            time.sleep(0.2)
            for other in getattr(self, "others", []):
                self.call(other.stop)
            self.call(self.server.stop)
        except trio.RunFinishedError:
            pass
        self._thread.join(60)
        self._thread = None

    def cleanup(self) -> None:
        self.stop()
        if self.own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> GatewayServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


class Client:
    """A paho client with its network loop in a thread and received messages in a queue."""

    def __init__(self, port: int, client_id: str = "", version: int = 4, *,
                 clean: bool = True, connect: bool = True, properties=None,
                 username: str | None = None, password: str | None = None,
                 will: tuple | None = None, keepalive: int = 60, transport: str = "tcp",
                 ws_path: str = "/mqtt", tls: dict | None = None) -> None:
        proto = {3: mqtt.MQTTv31, 4: mqtt.MQTTv311, 5: mqtt.MQTTv5}[version]
        kw: dict[str, Any] = dict(callback_api_version=CallbackAPIVersion.VERSION2,
                                  client_id=client_id, protocol=proto, transport=transport)
        if version != 5:
            kw["clean_session"] = clean
        self.c = mqtt.Client(**kw)
        if transport == "websockets":
            self.c.ws_set_options(path=ws_path)
        if tls is not None:
            self.c.tls_set(**tls)
        self.version = version
        self.port = port
        self.messages: queue.Queue = queue.Queue()
        self.connack: queue.Queue = queue.Queue()
        self.disconnects: queue.Queue = queue.Queue()
        self.subacks: queue.Queue = queue.Queue()
        self.acks: queue.Queue = queue.Queue()
        self.c.on_message = lambda c, u, m: self.messages.put(m)
        self.c.on_connect = lambda c, u, flags, rc, props: self.connack.put((flags, rc, props))
        self.c.on_disconnect = lambda c, u, flags, rc, props: self.disconnects.put((rc, props))
        self.c.on_subscribe = lambda c, u, mid, rcs, props: self.subacks.put((mid, rcs))
        self.c.on_publish = lambda c, u, mid, rc, props: self.acks.put((mid, rc))
        if username is not None:
            self.c.username_pw_set(username, password)
        if will is not None:
            self.c.will_set(*will)
        self._clean = clean
        self._properties = properties
        self._keepalive = keepalive
        if connect:
            self.connect()

    def connect(self, timeout: float = 10.0):
        kw: dict[str, Any] = dict(keepalive=self._keepalive)
        if self.version == 5:
            kw["clean_start"] = self._clean
            kw["properties"] = self._properties
        self.c.connect("127.0.0.1", self.port, **kw)
        self.c.loop_start()
        flags, rc, props = self.connack.get(timeout=timeout)
        self.flags, self.rc, self.connack_props = flags, rc, props
        return flags, rc, props

    def subscribe(self, topic, qos: int = 0, timeout: float = 10.0, **kw):
        self.c.subscribe(topic, qos, **kw)
        return self.subacks.get(timeout=timeout)

    def publish(self, topic: str, payload=b"", qos: int = 0, retain: bool = False,
                properties=None, wait: bool = True):
        info = self.c.publish(topic, payload, qos, retain, properties)
        if wait and qos:
            info.wait_for_publish(10)
        return info

    def get(self, timeout: float = 10.0):
        return self.messages.get(timeout=timeout)

    def get_all(self, n: int, timeout: float = 10.0) -> list:
        return [self.get(timeout) for _ in range(n)]

    def none(self, wait: float = 0.5) -> bool:
        try:
            self.messages.get(timeout=wait)
        except queue.Empty:
            return True
        return False

    def disconnect(self, properties=None) -> None:
        self.c.disconnect(properties=properties) if self.version == 5 else self.c.disconnect()
        time.sleep(0.05)
        self.c.loop_stop()

    def drop(self) -> None:
        """Abnormal close: the socket goes away without DISCONNECT."""
        self.c.loop_stop()
        sock = self.c.socket()
        if sock is not None:
            sock.close()


class ServeProcess:
    """`python -m lmq serve` as a child process with MQTT on a free port."""

    def __init__(self, data_dir: str, extra: list[str] | None = None) -> None:
        self.data_dir = data_dir
        self.mqtt_port = free_port()
        self.namesrv_port = free_port()
        self.broker_port = free_port()
        self.extra = extra or []
        self.proc: subprocess.Popen | None = None
        self.log_path = os.path.join(data_dir, "serve.log")

    def start(self, timeout: float = 60.0) -> ServeProcess:
        os.makedirs(self.data_dir, exist_ok=True)
        toml = os.path.join(self.data_dir, "lmq.toml")
        with open(toml, "w") as fh:
            # allow_inner_properties_without_acl: a stand-alone gateway may reach it
            # over TCP (docs/acl.md §4).
            fh.write("[broker]\ncommitlog_file_size = 8388608\n"
                     "consume_queue_units_per_file = 20000\npreallocate_files = false\n"
                     "allow_inner_properties_without_acl = true\n")
        cmd = [sys.executable, "-m", "lmq", "serve", "--no-grpc", "--data-dir", self.data_dir, "--config", toml,
               "--host", "127.0.0.1", "--no-amqp", "--namesrv-port", str(self.namesrv_port),
               "--broker-port", str(self.broker_port), "--mqtt-port", str(self.mqtt_port),
               "--log-level", "INFO", *self.extra]
        os.makedirs(self.data_dir, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lmq serve exited: {open(self.log_path).read()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.mqtt_port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("lmq serve did not open its MQTT port")

    @contextmanager
    def restarted(self) -> Iterator[ServeProcess]:
        """Another `lmq serve` on the same data directory, options and ports, started (once
        this one has ended); stopped at the end of the block."""
        other = ServeProcess(self.data_dir, self.extra)
        other.mqtt_port, other.namesrv_port, other.broker_port = (
            self.mqtt_port, self.namesrv_port, self.broker_port)
        try:
            other.start()
            yield other
        finally:
            other.stop()

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill9()


@contextmanager
def serve_process(extra: list[str] | None = None) -> Iterator[ServeProcess]:
    """A started `lmq serve` (ServeProcess) in a fresh temporary directory; killed (-9) and
    its directory removed at the end of the block."""
    d = tempfile.mkdtemp(prefix="lmq-mqtt-test-")
    proc = ServeProcess(d, extra)
    try:
        proc.start()
        yield proc
    finally:
        proc.kill9()
        shutil.rmtree(d, ignore_errors=True)


class RawClient:
    """A socket + client-side MqttCodec, for what paho will not do (misbehave, not ack)."""

    def __init__(self, port: int, version: int = 5, max_packet_size: int = 1 << 20) -> None:
        from gateway.mqtt.codec import MqttCodec

        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.codec = MqttCodec(max(max_packet_size, 1 << 20), role="client")
        self.version = version
        self.pending: list = []

    def send(self, packet) -> None:
        from gateway.mqtt._encoding import encode_packet
        from gateway.mqtt.packets import Connect

        if isinstance(packet, Connect):
            self.sock.sendall(self.codec.encode(packet))
        else:  # no client-side limit checks: tests send what they like
            self.sock.sendall(encode_packet(packet, self.codec.protocol_version))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float = 10.0):
        """The next packet; None when the server closed the connection."""
        deadline = time.monotonic() + timeout
        while not self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no packet from the server")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise TimeoutError("no packet from the server") from None
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.pending += self.codec.feed(data)
        return self.pending.pop(0)

    def recv_type(self, cls, timeout: float = 10.0):
        """Skip other packets until one of type `cls` (None if the connection closed)."""
        while True:
            p = self.recv(timeout)
            if p is None or isinstance(p, cls):
                return p

    def connect(self, client_id: str, *, clean: bool = True, keepalive: int = 60,
                properties=None, will=None, username=None, password=None):
        from gateway.mqtt.packets import NO_PROPERTIES, Connect

        self.send(Connect(client_id, self.version, clean, keepalive, username, password, will,
                          properties or NO_PROPERTIES))
        return self.recv()

    def closed(self, timeout: float = 10.0) -> bool:
        """True once the server closes the connection (other packets are skipped)."""
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.recv(deadline - time.monotonic()) is None:
                    return True
        except TimeoutError:
            pass
        return False

    def close(self) -> None:
        self.sock.close()


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
