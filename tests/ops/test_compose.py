"""docker-compose.yml and the Dockerfile, checked without a Docker engine (docs/deploy.md).

- The compose file passes a compose implementation's own validation (`docker-compose
  config`, the Python compose v1 from Debian's `docker-compose` package, or the v2 plugin
  `docker compose config`), which needs no engine; a copy with a mistake must fail it.
- What the file promises users: health checks everywhere, user ports published on the
  host's loopback only, data on volumes; the Dockerfile is multi-stage, non-root and
  EXPOSEs every listener the compose file uses.
- (slow) Every service runs as a local process (tests/ops/compose_runner.py) and the demo
  flow goes end to end: devices -> MQTT -> brokers -> Spark -> alerts; a native consumer
  receives the same telemetry; then a master is killed -9 and devices and the consumer
  carry on with no acknowledged reading lost.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgpack
import pytest

from tests.ops.compose_runner import (
    COMPOSE_FILE,
    REPO,
    Stack,
    container_ports,
    load,
    one_shots,
)

DOCKERFILE = REPO / "Dockerfile"


def _compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(
            ["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return None


def _config_check(path) -> subprocess.CompletedProcess:
    cmd = _compose_command()
    if cmd is None:
        pytest.skip("no compose implementation (apt-get install docker-compose: .ci/run does)")
    return subprocess.run(cmd + ["-f", str(path), "config", "-q"], capture_output=True,
                          text=True, cwd=str(REPO), timeout=60)


def test_compose_file_passes_the_compose_config_check(tmp_path):
    ok = _config_check(COMPOSE_FILE)
    assert ok.returncode == 0, ok.stderr
    # The checker really checks: the same file with an unknown key and a dangling
    # dependency is refused.
    text = COMPOSE_FILE.read_text()
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(text.replace("    healthcheck: *ready\n", "    healthcheck: *ready\n"
                                   "    depends_on_typo: [namesrv1]\n", 1))
    assert _config_check(broken).returncode != 0
    dangling = tmp_path / "dangling.yml"
    dangling.write_text(text.replace("mqtt: {condition: service_healthy}",
                                     "mqtt-gw: {condition: service_healthy}"))
    assert _config_check(dangling).returncode != 0


def test_every_service_is_health_checked_and_published_on_loopback_only():
    services = load(COMPOSE_FILE)["services"]
    commands = {name: svc["command"][:2] for name, svc in services.items()}
    # the whole product: 2 name servers, 2 broker groups of master + slave, MQTT and AMQP
    # gateways, the device simulator + Spark job
    assert sorted(c[1] for c in commands.values()) == sorted(
        ["namesrv"] * 2 + ["broker"] * 4 + ["mqtt", "mqtt", "amqp", "demo"])
    once = one_shots(services)
    # two broker names, two replicated brokers each, failover by the controller
    brokers = [s["command"] for s in services.values() if s["command"][1] == "broker"]
    assert sorted(c[c.index("--broker-name") + 1] for c in brokers) == ["broker-a"] * 2 + [
        "broker-b"] * 2
    assert {c[c.index("--broker-role") + 1] for c in brokers} == {"SYNC_MASTER"}
    controllers = [n for n, s in services.items() if "--controller" in s["command"]]
    assert len(controllers) == 1
    assert all(c[c.index("--controller-addr") + 1] == f"{controllers[0]}:9876"
               for c in brokers)
    published = {}
    for name, svc in services.items():
        assert isinstance(svc["command"], list), f"{name}: exec form (the runner needs it)"
        if name in once:
            assert svc["restart"] == "no", name
            continue
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no health check"
        for spec in svc.get("ports", []):
            host_ip, host_port, container = str(spec).split(":")
            assert host_ip == "127.0.0.1", f"{name} publishes {spec} beyond loopback"
            published[int(host_port)] = name
        if svc["command"][1] in ("namesrv", "broker", "mqtt", "amqp"):
            assert svc["command"][svc["command"].index("--host") + 1] == "0.0.0.0", name
        if svc["command"][1] in ("namesrv", "broker"):
            assert "--allow-unauthenticated" in svc["command"], name
        if svc["command"][1] == "broker":
            data = svc["command"][svc["command"].index("--data-dir") + 1]
            assert any(not str(v).startswith(".") and str(v).endswith(":" + data)
                       for v in svc.get("volumes", [])), f"{name}: data not on a volume"
    assert {1883, 1884, 5672, 9876, 9100} <= set(published)
    assert published[1883] == "mqtt" and published[5672] == "amqp"
    ready = [n for n, s in services.items()
             if n not in once and "/readyz" in " ".join(s["healthcheck"]["test"])]
    servers = [n for n, s in services.items()
               if s["command"][1] in ("namesrv", "broker", "mqtt", "amqp")]
    assert sorted(ready) == sorted(servers), ready  # every server probes its /readyz
    for name in servers:
        command = services[name]["command"]
        assert command[command.index("--metrics-port") + 1] == "9100", name


def test_dockerfile_is_multistage_non_root_and_exposes_every_listener():
    lines = [ln.strip() for ln in DOCKERFILE.read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    stages = [ln for ln in lines if ln.upper().startswith("FROM ")]
    assert len(stages) >= 2
    # the runtime stage installs no compiler and runs as a named non-root user
    runtime = lines[lines.index(next(s for s in stages if s.endswith(" AS runtime"))):]
    runtime = runtime[:next((i for i, ln in enumerate(runtime[1:], 1)
                             if ln.upper().startswith("FROM ")), len(runtime))]
    assert not any("gcc" in ln for ln in runtime)
    users = [ln.split()[1] for ln in runtime if ln.upper().startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    exposed = {int(p) for ln in lines if ln.upper().startswith("EXPOSE ")
               for p in ln.split()[1:]}
    used = {p for svc in load(COMPOSE_FILE)["services"].values() for p in container_ports(svc)}
    assert used <= exposed, used - exposed
    targets = {svc["build"]["target"] for svc in load(COMPOSE_FILE)["services"].values()
               if "build" in svc}
    assert targets <= {m.group(1) for s in stages if (m := re.search(r" AS (\w+)$", s))}


def test_runner_maps_every_service_onto_this_machine(tmp_path):
    stack = Stack(tmp_path)
    services = stack.services
    local = [p for ports in stack.ports.values() for p in ports.values()]
    assert len(local) == len(set(local))            # one local port per container port
    for name, svc in stack.svc.items():
        argv = svc.argv(svc.spec["command"])
        text = " ".join(argv)
        assert argv[:3] == [sys.executable, "-m", "lmq"], name
        assert "0.0.0.0" not in text and "/data" not in text and "/etc/lmq" not in text, text
        for other in services:                      # no container host name left
            assert not re.search(rf"(?<![\w-]){re.escape(other)}:\d", text), (name, text)
        for flag in ("--port", "--broker-port", "--ha-port", "--metrics-port", "--mqtt-port",
                     "--amqp-port"):
            if flag in argv:
                assert int(argv[argv.index(flag) + 1]) in local, (name, flag)
        if "--config" in argv:
            assert Path(argv[argv.index("--config") + 1]).is_file(), name
    # a broker's controller address is the controller's local port
    a2 = stack.svc["broker-a2"].argv(services["broker-a2"]["command"])
    assert a2[a2.index("--controller-addr") + 1] == \
        f"127.0.0.1:{stack.svc['namesrv1'].port(9876)}"
    # a service sharing another's network reaches it on 127.0.0.1 at its ports
    assert stack.svc["iot"].port(1883) == stack.svc["mqtt"].port(1883)


# -- the stack as local processes (slow) -----------------------------------------------

def _readings(stack) -> list[dict]:
    path = stack.svc["iot"].map_token("/out") + "/readings.jsonl"
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []


class TelemetryConsumer:
    """A native push consumer of the MQTT gateway's topic, from the first message."""

    def __init__(self, namesrv: str) -> None:
        from core.client import ConsumeStatus
        from core.client.blocking import BlockingClient

        self.seen: set[tuple[str, int]] = set()
        self.lock = threading.Lock()
        self.client = BlockingClient(namesrv)
        self.client.__enter__()

        def on_messages(msgs, ctx):
            with self.lock:
                for m in msgs:  # the topic also carries $SYS and other MQTT traffic
                    try:
                        r = msgpack.unpackb(m.body)
                        self.seen.add((r["device"], r["ts"]))
                    except (ValueError, TypeError, KeyError):
                        pass
            return ConsumeStatus.SUCCESS

        self.consumer = self.client.push_consumer(
            "CG_COMPOSE_TELEMETRY", on_messages, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        self.consumer.subscribe("MQTT_MESSAGES", "*")
        self.consumer.__enter__()

    def missing(self, readings: list[dict]) -> set[tuple[str, int]]:
        with self.lock:
            return {(r["device"], r["ts"]) for r in readings} - self.seen

    def close(self) -> None:
        self.consumer.__exit__(None, None, None)
        self.client.__exit__(None, None, None)


class Subscriber:
    """An MQTT client on a gateway: telemetry (msgpack) and alerts (JSON) it receives, as
    (device, ts) of the reading; `alerts` counts every alert delivery."""

    def __init__(self, port: int) -> None:
        import paho.mqtt.client as mqtt

        self.seen: set[tuple[str, int]] = set()
        self.alerts: list[tuple[str, int]] = []
        self.subscribed = threading.Event()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="compose-sub")
        self.client.on_connect = lambda c, *_: c.subscribe(
            [("devices/+/telemetry", 1), ("alerts/#", 1)])
        self.client.on_subscribe = lambda *_: self.subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert self.subscribed.wait(30)

    def _on_message(self, _client, _userdata, msg) -> None:
        if msg.topic.startswith("alerts/"):
            r = json.loads(msg.payload)
            self.alerts.append((r["device"], r["ts"]))
        else:
            r = msgpack.unpackb(msg.payload)
            self.seen.add((r["device"], r["ts"]))

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


class AmqpTelemetry:
    """An AMQP queue bound to `amq.topic` for the devices' telemetry (MQTT topic a/b/c is
    routing key a.b.c, docs/amqp.md): the (device, ts) of every reading it got."""

    def __init__(self, port: int) -> None:
        import pika

        # no heartbeats: the test polls this connection only now and then
        self.conn = pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
        self.ch = self.conn.channel()
        self.ch.queue_declare("compose-telemetry", durable=True)
        self.ch.queue_bind("compose-telemetry", "amq.topic", "devices.*.telemetry")
        self.seen: set[tuple[str, int]] = set()

    def drain(self) -> set[tuple[str, int]]:
        while True:
            method, _props, body = self.ch.basic_get("compose-telemetry", auto_ack=True)
            if method is None:
                return self.seen
            r = msgpack.unpackb(body)
            self.seen.add((r["device"], r["ts"]))

    def close(self) -> None:
        self.conn.close()


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (got := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)
    return got


def _amqp_round_trip(port: int) -> bytes:
    import pika

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        ch = conn.channel()
        ch.queue_declare("compose-check", durable=True)
        ch.basic_publish("", "compose-check", b"through the stack")
        for _ in range(50):
            _method, _props, body = ch.basic_get("compose-check", auto_ack=True)
            if body is not None:
                return body
            time.sleep(0.2)
        return b""
    finally:
        conn.close()


def _needs_spark() -> None:
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("Spark needs Java 17")


def _stop_demo(stack) -> list[dict]:
    """Stop the demo as Ctrl-C does (its Spark queries drain what was sent first)."""
    iot = stack.svc["iot"]
    os.kill(iot.proc.pid, signal.SIGINT)
    assert iot.proc.wait(180) == 0, iot.log_tail()
    return _readings(stack)


def _hot(stack, readings: list[dict]) -> set[tuple[str, int]]:
    """(device, ts) of the readings above the demo's --threshold."""
    command = stack.svc["iot"].spec["command"]
    threshold = float(command[command.index("--threshold") + 1])
    return {(r["device"], r["ts"]) for r in readings if r["temperature"] > threshold}


def _check_alerts(stack, subscriber, readings: list[dict], start: int) -> None:
    """Every reading above the threshold alerted exactly once: all of those after the
    subscriber was in place (`start`), none twice, none that is not one."""
    expected = _hot(stack, readings[start:])
    assert expected
    _wait(lambda: expected <= set(subscriber.alerts), 60, "every alert")
    assert len(subscriber.alerts) == len(set(subscriber.alerts))
    assert set(subscriber.alerts) <= _hot(stack, readings)


@contextmanager
def _demo_stack(tmp_path) -> Iterator[tuple[Stack, TelemetryConsumer, Subscriber]]:
    """The whole stack up, with a native consumer of the telemetry and an MQTT subscriber
    on the second gateway (both closed at the end)."""
    _needs_spark()
    with Stack(tmp_path) as stack:
        stack.up(timeout=180)
        namesrv = stack.svc["broker-a1"].map_token("namesrv1:9876;namesrv2:9876")
        consumer = TelemetryConsumer(namesrv)
        subscriber = Subscriber(stack.svc["mqtt2"].port(1883))
        try:
            yield stack, consumer, subscriber
        finally:
            subscriber.close()
            consumer.close()


@pytest.mark.slow
def test_stack_runs_the_demo_end_to_end(tmp_path):
    with _demo_stack(tmp_path) as (stack, consumer, subscriber):
        amqp = AmqpTelemetry(stack.svc["amqp"].port(5672))
        try:
            # devices -> MQTT gateway -> brokers: every reading a device had acknowledged
            # (PUBACK) reaches a native consumer of the gateway's topic
            start = len(_readings(stack))
            _wait(lambda: len(_readings(stack)) >= start + 40, 120, "40 acknowledged readings")
            _wait(lambda: not consumer.missing(_readings(stack)), 60, "the telemetry")
            # ... and an MQTT subscriber on the other gateway, from its subscription on
            later = {(r["device"], r["ts"]) for r in _readings(stack)[start + 10:]}
            _wait(lambda: later <= subscriber.seen, 60, "telemetry on the second gateway")
            # ... and an AMQP queue bound to amq.topic on the AMQP gateway, same stored copy
            _wait(lambda: later <= amqp.drain(), 60, "telemetry in the AMQP queue")
            # -> Spark -> alerts published back over MQTT, received on the other gateway
            _wait(lambda: subscriber.alerts, 180, "Spark's first alerts over MQTT")
            # the AMQP gateway serves clients against the same brokers
            assert _amqp_round_trip(stack.svc["amqp"].port(5672)) == b"through the stack"
            readings = _stop_demo(stack)
            assert not consumer.missing(readings)
            _check_alerts(stack, subscriber, readings, start + 10)
        finally:
            amqp.close()


def _controller_state(stack) -> dict:
    """The HA controller's view (docs/ha.md): broker name -> masterId, syncStateSet, ..."""
    from core.remoting.codec import RemotingCommand
    from core.remoting.codes import RequestCode
    from tests.core.broker.harness import sync_invoke

    controller = next(n for n, s in stack.services.items() if "--controller" in s["command"])
    addr = f"127.0.0.1:{stack.svc[controller].port(9876)}"
    resp = sync_invoke(addr, RemotingCommand.request(RequestCode.CONTROLLER_GET_STATE, {}))
    return json.loads(resp.body_bytes())


def _broker_service(stack, broker_name: str, broker_id: int) -> str:
    for name, spec in stack.services.items():
        c = spec["command"]
        if c[1] == "broker" and c[c.index("--broker-name") + 1] == broker_name \
                and int(c[c.index("--broker-id") + 1]) == broker_id:
            return name
    raise KeyError((broker_name, broker_id))


@pytest.mark.slow
def test_devices_and_consumers_carry_on_after_a_master_is_killed(tmp_path):
    with _demo_stack(tmp_path) as (stack, consumer, subscriber):
        start = len(_readings(stack))
        _wait(lambda: len(_readings(stack)) >= start + 40, 120, "40 acknowledged readings")
        _wait(lambda: subscriber.alerts, 180, "Spark's first alerts over MQTT")
        # both brokers of broker-a in sync, then kill -9 its master
        _wait(lambda: len(_controller_state(stack)["broker-a"].get("syncStateSet", [])) == 2,
              60, "broker-a's slave in sync")
        master = _broker_service(stack, "broker-a",
                                 _controller_state(stack)["broker-a"]["masterId"])
        before = len(_readings(stack))
        stack.svc[master].signal(signal.SIGKILL)
        _wait(lambda: len(_readings(stack)) >= before + 40, 120,
              "40 more acknowledged readings after the kill")
        assert stack.svc["mqtt"].running() and stack.svc["iot"].running()
        _wait(lambda: not consumer.missing(_readings(stack)), 90,
              "every acknowledged reading, after the kill")
        readings = _stop_demo(stack)
        assert not consumer.missing(readings)
        _check_alerts(stack, subscriber, readings, start + 10)
