"""`--metrics-port`: /metrics in Prometheus format, /healthz and /readyz, on real servers.

Each test runs `python -m lmq ...` as a child process with the metrics port 0 (the bound
port is read from the server's log line), drives real MQTT clients, and parses the scrape
with prometheus_client's own parser (the format check).
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.mqtt.e2e_support import BROKER_TEST_CONFIG, free_port, write_toml
from tests.procs import stop_process

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 30.0


def samples(text: str) -> dict[str, float]:
    """A Prometheus exposition as sample name (with sorted labels) -> value, parsed by the
    reference parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


class Proc:
    def __init__(self, argv: list[str], root: Path) -> None:
        self.log = root / "server.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "lmq", *argv], cwd=REPO,
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        self.metrics_port = self._wait_for(r"metrics on http://[\d.]+:(\d+)/metrics")

    def _wait_for(self, pattern: str) -> int:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            match = re.search(pattern, self.log.read_text(errors="replace"))
            if match:
                return int(match.group(1))
            assert self.proc.poll() is None, self.log.read_text(errors="replace")
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} in the log:\n{self.log.read_text()}")

    def get(self, path: str) -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.metrics_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + TIMEOUT
        while self.get("/readyz")[0] != 200:
            assert time.monotonic() < deadline, self.get("/readyz")
            time.sleep(0.05)

    def scrape(self) -> dict[str, float]:
        """Sample name (with sorted labels) -> value, parsed by the reference parser."""
        status, text = self.get("/metrics")
        assert status == 200
        return samples(text)

    def stop(self) -> None:
        stop_process(self.proc, 30)


def serve(tmp_path: Path, *extra: str, mqtt_config: dict | None = None,
          namesrv_port: int | None = None) -> tuple[Proc, int]:
    broker_cfg = tmp_path / "broker.toml"
    write_toml(broker_cfg, {"broker": BROKER_TEST_CONFIG})
    mqtt_port = free_port()
    argv = ["serve", "--no-grpc", "--data-dir", str(tmp_path / "data"), "--config", str(broker_cfg),
            "--namesrv-port", str(namesrv_port or free_port()), "--broker-port", str(free_port()),
            "--mqtt-port", str(mqtt_port), "--amqp-port", str(free_port()),
            "--metrics-port", "0", *extra]
    if mqtt_config:
        write_toml(tmp_path / "mqtt.toml", mqtt_config)
        argv += ["--mqtt-config", str(tmp_path / "mqtt.toml")]
    return Proc(argv, tmp_path), mqtt_port


def mqtt_client(port: int, client_id: str) -> mqtt.Client:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
    _watch_suback(c)
    c.connect("127.0.0.1", port)
    c.loop_start()
    return c


def _watch_suback(client: mqtt.Client) -> None:
    client.subacked = threading.Event()
    client.on_subscribe = lambda *a: client.subacked.set()


def _rocketmq_backlog(namesrv: str, topic: str, group: str, count: int) -> None:
    """Send `count` messages to `topic` and commit offset 0 for `group` on every queue."""
    from core.client.blocking import BlockingClient
    from core.common.message import Message

    with BlockingClient(namesrv) as client:
        with client.producer("PG_METRICS") as producer:
            for i in range(count):
                producer.send(Message(topic, b"m%d" % i))
        with client.pull_consumer(group) as consumer:
            for mq in consumer.fetch_subscribe_message_queues(topic):
                consumer.update_consume_offset(mq, 0)


def test_metrics_move_with_mqtt_traffic(tmp_path):
    ns_port = free_port()
    proc, port = serve(tmp_path, namesrv_port=ns_port)
    try:
        assert proc.get("/healthz") == (200, "ok\n")
        proc.wait_ready()
        before = proc.scrape()
        _rocketmq_backlog(f"127.0.0.1:{ns_port}", "MetricsTopic", "CG_METRICS", 7)
        got = []
        sub = mqtt_client(port, "metrics-sub")
        sub.on_message = lambda c, u, m: got.append(m.payload)
        sub.subscribe("metrics/t", qos=1)
        small = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="metrics-small",
                            protocol=mqtt.MQTTv5)
        _watch_suback(small)
        props = Properties(PacketTypes.CONNECT)
        props.MaximumPacketSize = 200  # every message below is larger: dropped for it
        small.connect("127.0.0.1", port, properties=props)
        small.loop_start()
        small.subscribe("metrics/t", qos=1)
        for client in (sub, small):
            assert client.subacked.wait(TIMEOUT)
        pub = mqtt_client(port, "metrics-pub")
        payload = b"x" * 1000
        for _ in range(5):
            pub.publish("metrics/t", payload, qos=1).wait_for_publish(10)
        deadline = time.monotonic() + TIMEOUT
        while len(got) < 5:
            assert time.monotonic() < deadline, got
            time.sleep(0.02)
        after = proc.scrape()
        deadline = time.monotonic() + TIMEOUT
        while after['lmq_mqtt_dropped_messages_total{reason=too_large}'] < 5:
            assert time.monotonic() < deadline, after
            time.sleep(0.05)
            after = proc.scrape()
        for client in (pub, sub, small):
            client.loop_stop()

        assert after["lmq_mqtt_messages_received_total"] - before[
            "lmq_mqtt_messages_received_total"] >= 5
        assert after["lmq_mqtt_messages_sent_total"] >= 5
        assert after["lmq_mqtt_received_bytes_total"] - before[
            "lmq_mqtt_received_bytes_total"] >= 5 * len(payload)
        assert after["lmq_broker_put_messages_total"] - before[
            "lmq_broker_put_messages_total"] >= 5
        assert after["lmq_broker_put_bytes_total"] - before[
            "lmq_broker_put_bytes_total"] >= 5 * len(payload)
        assert after["lmq_broker_commitlog_size_bytes"] > before[
            "lmq_broker_commitlog_size_bytes"]
        assert after["lmq_mqtt_clients_connected"] == 3
        assert after["lmq_mqtt_sessions"] >= 3
        assert after["lmq_mqtt_dropped_messages_total{reason=lag_cut}"] == 0
        assert after["lmq_mqtt_subscriptions"] >= 1
        assert after["lmq_broker_lmqs"] >= 1
        assert after["lmq_ready"] == 1
        lag = {k: v for k, v in after.items() if k.startswith(
            "lmq_broker_consumer_lag_messages{group=CG_METRICS,")}
        assert sum(lag.values()) == 7, lag
        # Process metrics of the client library's own collectors.
        assert after["process_resident_memory_bytes"] > 0
        assert "lmq_event_loop_lag_seconds" in after
        assert any(k.startswith("python_gc_collections_total") for k in after)
        assert proc.get("/nope")[0] == 404
        # Every series the Grafana dashboard queries exists.
        dashboard = (REPO / "docs" / "grafana" / "lmq-gateway.json").read_text()
        for name in set(re.findall(r"\b((?:lmq|process|python)_[a-z_]+)\{", dashboard)):
            if name.startswith(("lmq_broker_replication_", "lmq_grpc_")):
                # a replicating broker's (tests/ops/test_replication_metrics.py), the
                # gRPC front end's (tests/ops/test_grpc_metrics.py)
                continue
            assert any(k == name or k.startswith(name + "{") for k in after), name
    finally:
        proc.stop()


def test_readyz_503_until_registered(tmp_path):
    """A broker whose name server is down is alive but not ready, with the reason."""
    broker_cfg = tmp_path / "broker.toml"
    write_toml(broker_cfg, {"broker": BROKER_TEST_CONFIG})
    proc = Proc(["broker", "--data-dir", str(tmp_path / "data"), "--config", str(broker_cfg),
                 "--broker-port", str(free_port()), "--namesrv-addr",
                 f"127.0.0.1:{free_port()}", "--metrics-port", "0"], tmp_path)
    try:
        assert proc.get("/healthz")[0] == 200
        deadline = time.monotonic() + TIMEOUT
        while True:  # recovering first, then started but unregistered
            status, text = proc.get("/readyz")
            if "name server" in text or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert status == 503
        assert text == "broker not registered with any name server\n"
        assert proc.scrape()["lmq_ready"] == 0
    finally:
        proc.stop()


def test_metrics_port_binds_loopback(tmp_path):
    proc, _ = serve(tmp_path, "--no-mqtt")
    try:
        assert re.search(r"metrics on http://127\.0\.0\.1:\d+/", proc.log.read_text())
        proc.wait_ready()
    finally:
        proc.stop()


@pytest.mark.slow
def test_idle_server_stores_no_sys_messages(tmp_path):
    """`$SYS` goes out only when a value changed, and the MQTT and AMQP gateways' route logs
    write nothing while no route changes: an idle CommitLog stops growing."""
    proc, mqtt_port = serve(tmp_path, mqtt_config={"sys_interval_s": 0.1})
    sub = None
    try:
        proc.wait_ready()
        sub = mqtt_client(mqtt_port, "idle-sub")  # a route added, then nothing changes
        sub.subscribe("idle/#", qos=1)
        assert sub.subacked.wait(TIMEOUT)

        def offset() -> float:
            return proc.scrape()["lmq_broker_commitlog_max_offset_bytes"]

        deadline = time.monotonic() + TIMEOUT
        last = offset()
        while True:  # the first rounds publish every value once
            time.sleep(0.6)
            now = offset()
            if now == last and now > 0:
                break
            assert time.monotonic() < deadline, "CommitLog never settled"
            last = now
        time.sleep(2.5)  # > 2 uptime seconds and 20 $SYS rounds
        assert offset() == last
    finally:
        if sub is not None:
            sub.loop_stop()
        proc.stop()


def test_separate_processes_ready_and_stop_on_sigterm(tmp_path):
    """namesrv, broker and mqtt alone, each with its metrics port: ready, then a SIGTERM
    ends each one (the metrics task must not keep a process alive)."""
    ns_port = free_port()
    procs = []
    try:
        procs.append(Proc(["namesrv", "--port", str(ns_port), "--metrics-port", "0"],
                          _dir(tmp_path / "ns")))
        broker_cfg = tmp_path / "broker.toml"
        write_toml(broker_cfg, {"broker": BROKER_TEST_CONFIG})
        procs.append(Proc(["broker", "--data-dir", str(tmp_path / "b"), "--config",
                           str(broker_cfg), "--broker-port", str(free_port()),
                           "--namesrv-addr", f"127.0.0.1:{ns_port}", "--metrics-port", "0"],
                          _dir(tmp_path / "b")))
        procs.append(Proc(["mqtt", "--namesrv-addr", f"127.0.0.1:{ns_port}", "--data-dir",
                           str(tmp_path / "m"), "--port", str(free_port()),
                           "--metrics-port", "0"], _dir(tmp_path / "m")))
        for proc in procs:
            proc.wait_ready()
        ns, broker, gw = (p.scrape() for p in procs)
        assert ns["lmq_namesrv_brokers"] == 1
        assert broker["lmq_broker_topics"] >= 1
        assert gw["lmq_mqtt_sessions"] == 0
        for proc in reversed(procs):
            proc.proc.terminate()
            assert proc.proc.wait(TIMEOUT) == 0
    finally:
        for proc in procs:
            proc.stop()


def _dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def until(predicate, what: str):
    """Polls `predicate` until it returns a true value (which is returned), TIMEOUT at most."""
    deadline = time.monotonic() + TIMEOUT
    while not (got := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return got
