"""AMQP inside `lmq serve`: a real `python -m lmq serve` process and real pika clients."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pika
import pytest

from tests.core.remoting.test_exposure import can_connect, non_loopback_ip
from tests.gateway.amqp.broker_harness import params
from tests.ports import free_port as _free_port

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.timeout(120)


def _serve(tmp_path: Path, *extra: str) -> subprocess.Popen:
    mqtt = () if "--mqtt-port" in extra else ("--no-mqtt",)
    # Not the default gRPC port 8081: another test's server may hold it.
    grpc = () if any(e.startswith("--grpc") or e == "--no-grpc" for e in extra) else ("--no-grpc",)
    return subprocess.Popen(
        [sys.executable, "-m", "lmq", "serve", "--data-dir", str(tmp_path / "data"),
         "--namesrv-port", "0", "--broker-port", "0", *mqtt, *grpc, *extra],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_line(proc: subprocess.Popen, *needles: str) -> str:
    """The first stderr line holding one of `needles` (fails if the process exits)."""
    deadline = time.monotonic() + 60
    for line in proc.stderr:
        if any(n in line for n in needles):
            return line
        assert time.monotonic() < deadline, "no such line within 60 s"
    raise AssertionError(f"lmq serve exited ({proc.wait()}) without a line with {needles}")


def start_with_pika(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen,
                                                            pika.BlockingConnection]:
    """`lmq serve` with AMQP on a free port (`extra` flags) and a pika connection to it."""
    proc = _serve(tmp_path, "--amqp-port", "0", *extra)
    line = _wait_line(proc, "AMQP gateway listening", "AMQP gateway not started")
    port = int(re.search(r"listening on [\d.]+:(\d+)", line).group(1))
    return proc, pika.BlockingConnection(params(port))


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        proc.stderr.close()


def test_serve_runs_amqp_in_process_for_pika(tmp_path):
    # No allow_inner_properties_without_acl: the embedded gateway is trusted in-process.
    proc = _serve(tmp_path, "--amqp-port", "0")
    try:
        line = _wait_line(proc, "AMQP gateway listening", "AMQP gateway not started")
        host, port = re.search(r"listening on ([\d.]+):(\d+)", line).groups()
        assert host == "127.0.0.1"
        ip = non_loopback_ip()
        if ip is not None:  # loopback only by default, as every listener
            assert not can_connect(ip, int(port))
        conn = pika.BlockingConnection(params(int(port)))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("serve-q")
        ch.queue_bind("serve-q", "amq.topic", "sensors.#")
        # Confirmed: BlockingChannel raises if the broker nacks the store.
        ch.basic_publish("amq.topic", "sensors.a.temp", b"21.5", mandatory=True)
        got = []

        def on_message(channel, method, _props, body):
            got.append(body)
            channel.basic_ack(method.delivery_tag)
            channel.stop_consuming()

        ch.basic_consume("serve-q", on_message)
        conn.call_later(30, ch.stop_consuming)
        ch.start_consuming()
        assert got == [b"21.5"]
        # Acknowledged: not delivered again.
        assert ch.basic_get("serve-q", auto_ack=True) == (None, None, None)
        conn.close()
    finally:
        code = _stop(proc)
    assert code == 0


def test_no_amqp_leaves_the_port_closed(tmp_path):
    port = _free_port()
    proc = _serve(tmp_path, "--amqp-port", str(port), "--no-amqp", "--mqtt-port", "0")
    try:
        # `lmq serve` starts AMQP before MQTT: MQTT listening means AMQP would be too.
        _wait_line(proc, "MQTT gateway listening")
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        _stop(proc)


def test_taken_amqp_port_is_one_line_and_the_brokers_keep_serving(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _serve(tmp_path, "--amqp-port", str(port))
        try:
            line = _wait_line(proc, "AMQP gateway", "Traceback")
            assert "AMQP gateway not started" in line, line
            assert f"port {port} (AMQP) on 127.0.0.1 is already in use" in line
            assert "--amqp-port" in line
            assert proc.poll() is None  # name server and broker still up
        finally:
            code = _stop(proc)
    assert code == 0


@pytest.mark.parametrize("toml, expected", [
    ('max_queues = "lots"\n', "max_queues = 'lots' must be an integer"),
    ('[amqp]\nheartbeat_s = 1.5\n', "heartbeat_s = 1.5 must be an integer"),
    ('no_such_key = 1\n', "unknown AMQP config keys"),
])
def test_amqp_config_checked_before_start(tmp_path, toml, expected):
    config = tmp_path / "amqp.toml"
    config.write_text(toml)
    r = subprocess.run([sys.executable, "-m", "lmq", "serve", "--data-dir",
                        str(tmp_path / "data"), "--namesrv-port", "0", "--broker-port", "0",
                        "--no-mqtt", "--amqp-config", str(config)],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    errors = [line for line in r.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and expected in errors[0], r.stderr
    assert "Traceback" not in r.stderr
    assert not os.path.exists(tmp_path / "data" / ".lmq.lock")


def test_sigterm_requeues_unacknowledged_deliveries_before_the_broker_stops(tmp_path):
    # The gateway stops before the broker: a delivery never acknowledged is visible again
    # after a restart, not hidden for the POP invisibility time (30 min).
    def start() -> tuple[subprocess.Popen, pika.BlockingConnection]:
        return start_with_pika(tmp_path)

    proc, conn = start()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("kept", durable=True)
        ch.basic_publish("", "kept", b"unacked")
        got = []
        ch.basic_consume("kept", lambda _ch, _m, _p, body: got.append(body))
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            conn.process_data_events(0.2)
        assert got == [b"unacked"]
    finally:
        assert _stop(proc) == 0
    proc, conn = start()
    try:
        ch = conn.channel()
        ch.queue_declare("kept", durable=True)
        deadline = time.monotonic() + 30
        body = None
        while body is None and time.monotonic() < deadline:
            _, _, body = ch.basic_get("kept", auto_ack=True)
            if body is None:
                conn.sleep(0.2)
        assert body == b"unacked"
        conn.close()
    finally:
        assert _stop(proc) == 0
