"""Acceptance: the other ways in — MQTT over WebSocket (path /mqtt, subprotocol "mqtt")
and over TLS, with paho; and the gateway as a process of its own (`lmq mqtt
--namesrv-addr ...`, the cluster deployment) beside `lmq serve --no-mqtt`.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from tests.gateway.mqtt.e2e_support import (
    DEFAULT_TEST_CONFIG,
    REPO,
    Client,
    PacketTypes,
    RawClient,
    free_port,
    gateway_only,
    make_gateway,
    props,
    uid,
    write_toml,
)
from tests.procs import stop_process
from tests.tls_certs import self_signed

pytestmark = gateway_only


@pytest.fixture(scope="module")
def listeners(tmp_path_factory):
    root = tmp_path_factory.mktemp("gw-listeners")
    cert, key = self_signed(root)
    ws_port, tls_port = free_port(), free_port()
    gw = make_gateway(root / "srv", {**DEFAULT_TEST_CONFIG, "ws_port": ws_port,
                                     "tls_port": tls_port, "certfile": cert, "keyfile": key})
    gw.start()
    gw.ws_port, gw.tls_port, gw.cert = ws_port, tls_port, cert
    yield gw
    gw.stop()


def _round_trip(a: Client, b: Client) -> None:
    """a subscribes, b publishes at QoS 0/1/2: a gets all three."""
    topic = f"e2e/transport/{uid()}"
    try:
        a.connect()
        assert a.subscribe(topic, qos=2) == [2]
        b.connect()
        for qos in (0, 1, 2):
            b.publish(topic, b"q%d" % qos, qos=qos)
        assert [(m.payload, m.qos) for m in a.receive(3)] == [(b"q0", 0), (b"q1", 1), (b"q2", 2)]
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("version", [4, 5], ids=["v3.1.1", "v5"])
def test_websocket_to_tcp(listeners, version):
    ws = Client(listeners.ws_port, version=version, transport="websockets")
    tcp = Client(listeners.port, version=version)
    _round_trip(ws, tcp)
    _round_trip(Client(listeners.port, version=version),
                Client(listeners.ws_port, version=version, transport="websockets"))


@pytest.mark.parametrize("version", [4, 5], ids=["v3.1.1", "v5"])
def test_tls_to_tcp(listeners, version):
    _round_trip(Client(listeners.tls_port, version=version, ca_file=listeners.cert),
                Client(listeners.port, version=version))


def test_tls_port_refuses_plain_mqtt(listeners):
    c = RawClient(listeners.tls_port, version=4, timeout=5)
    try:
        c.send_bytes(bytes.fromhex("101000044d5154540402003c00047072626b"))
        c.sock.settimeout(5)
        try:
            data = c.sock.recv(64)
        except (ConnectionResetError, TimeoutError):
            data = b""
        assert not data.startswith(b"\x20\x02")  # never a CONNACK without TLS
    finally:
        c.close()


def test_websocket_session_resumes_over_tcp(listeners):
    """A session belongs to the client id, not to the transport it came in on."""
    cid = "wsres-" + uid()
    topic = f"e2e/wsres/{uid()}"
    keep = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    ws = Client(listeners.ws_port, cid, transport="websockets")
    pub = Client(listeners.port)
    tcp = Client(listeners.port, cid)
    try:
        ws.connect(clean_start=False, properties=keep)
        ws.subscribe(topic, qos=1)
        ws.disconnect()
        pub.connect()
        pub.publish(topic, b"waiting", qos=1)
        assert tcp.connect(clean_start=False, properties=keep)[:2] == (0, True)
        assert tcp.receive_one().payload == b"waiting"
    finally:
        for c in (ws, pub, tcp):
            c.close()


# ---------------------------------------------------------------- stand-alone gateway
class _Proc:
    def __init__(self, argv: list[str], log) -> None:
        self.log = log
        self.proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL,
                                     stdout=open(log, "ab"), stderr=subprocess.STDOUT)  # noqa: SIM115

    def stop(self) -> None:
        stop_process(self.proc)


def _wait_port(port: int, proc: _Proc, timeout: float = 60.0, mqtt: bool = False) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.proc.poll() is None, open(proc.log, "rb").read()[-2000:].decode()
        try:
            if mqtt:
                c = RawClient(port, version=4, timeout=2)
                try:
                    c.connect("probe-" + uid())
                    return
                finally:
                    c.close()
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except (OSError, AssertionError, ConnectionError):
            time.sleep(0.1)
    raise AssertionError(f"port {port} not ready: " + open(proc.log, "rb").read()[-2000:].decode())


@pytest.mark.slow
def test_standalone_gateway_process(tmp_path):
    from tests.gateway.mqtt.e2e_support import BROKER_TEST_CONFIG

    ns_port, broker_port, mqtt_port = free_port(), free_port(), free_port()
    # Without broker ACL only in-process peers may multi-dispatch (docs/acl.md §4): a
    # gateway in a process of its own needs the broker to allow it over TCP.
    write_toml(tmp_path / "broker.toml", {"broker": {
        **BROKER_TEST_CONFIG, "allow_inner_properties_without_acl": True}})
    write_toml(tmp_path / "mqtt.toml", DEFAULT_TEST_CONFIG)
    brokers = _Proc([sys.executable, "-m", "lmq", "serve", "--no-grpc", "--no-mqtt", "--host", "127.0.0.1",
                     "--data-dir", str(tmp_path / "store"), "--config", str(tmp_path / "broker.toml"),
                     "--namesrv-port", str(ns_port), "--broker-port", str(broker_port)],
                    tmp_path / "serve.log")
    gw_argv = [sys.executable, "-m", "lmq", "mqtt", "--namesrv-addr", f"127.0.0.1:{ns_port}",
               "--host", "127.0.0.1", "--port", str(mqtt_port),
               "--data-dir", str(tmp_path / "mqtt"), "--config", str(tmp_path / "mqtt.toml")]
    gw = None
    sub, pub = Client(mqtt_port, version=5), Client(mqtt_port, version=4)
    try:
        _wait_port(broker_port, brokers)
        time.sleep(0.5)  # the broker registers with its name server
        gw = _Proc(gw_argv, tmp_path / "mqtt.log")
        _wait_port(mqtt_port, gw, mqtt=True)
        keep = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
        sub.connect(clean_start=False, properties=keep)
        sub.subscribe("plant/+/temp", qos=1)
        pub.connect()
        pub.publish("plant/7/temp", b"live", qos=1)
        assert sub.receive_one().payload == b"live"
        sub.disconnect()
        pub.publish("plant/8/temp", b"offline", qos=1)
        pub.close()
        gw.stop()  # only the gateway restarts: sessions live in its data dir,
        gw = _Proc(gw_argv, tmp_path / "mqtt.log")  # messages in the brokers' store
        _wait_port(mqtt_port, gw, mqtt=True)
        assert sub.connect(clean_start=False, properties=keep)[:2] == (0, True)
        msg = sub.receive_one()
        assert (msg.topic, msg.payload) == ("plant/8/temp", b"offline")
    finally:
        sub.close()
        pub.close()
        if gw is not None:
            gw.stop()
        brokers.stop()
