"""Server logs: `--log-format json`, `--log-file`, the start-up banner (with what recovery
cut after a crash), and the address `lmq serve` advertises on all interfaces."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from lmq.commands._startup import choose_advertise_host, recovery_summary
from tests.core.remoting.test_exposure import non_loopback_ip
from tests.gateway.mqtt.e2e_support import BROKER_TEST_CONFIG, free_port, write_toml

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 30.0
pytestmark = pytest.mark.timeout(120)


class Server:
    """`python -m lmq serve` logging to `log` (a file given with --log-file, or stdout)."""

    def __init__(self, root: Path, *extra: str, log_file: bool = True) -> None:
        cfg = root / "broker.toml"
        write_toml(cfg, {"broker": BROKER_TEST_CONFIG})
        self.mqtt_port = free_port()
        self.log = root / ("lmq.log" if log_file else "stdout.log")
        argv = [sys.executable, "-m", "lmq", "serve", "--no-grpc", "--data-dir", str(root / "data"),
                "--config", str(cfg), "--namesrv-port", str(free_port()),
                "--broker-port", str(free_port()), "--mqtt-port", str(self.mqtt_port),
                "--no-amqp", "--metrics-port", "0", *extra]
        if log_file:
            argv += ["--log-file", str(self.log)]
        self.out = root / "stdout.log"
        with open(self.out, "ab") as out:
            self.proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=out)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for(self, pattern: str, after: int = 0) -> re.Match:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            match = re.compile(pattern).search(self.text(), after)
            if match:
                return match
            assert self.proc.poll() is None, self.text() + self.out.read_text()
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} in the log:\n{self.text()}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _publish(port: int, count: int) -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="log-pub")
    client.connect("127.0.0.1", port)
    client.loop_start()
    for i in range(count):
        client.publish("logs/t", b"payload %d" % i, qos=1).wait_for_publish(10)
    client.disconnect()
    client.loop_stop()


def _commitlog_end(log_text: str) -> int:
    """The write offset, from the metrics endpoint named in the log."""
    import urllib.request

    port = re.search(r"metrics on http://[\d.]+:(\d+)/metrics", log_text).group(1)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return int(float(re.search(r"^lmq_broker_commitlog_max_offset_bytes (\S+)$", text,
                               re.M).group(1)))


def test_json_log_file_banner_and_recovery_after_a_crash(tmp_path):
    server = Server(tmp_path, "--log-format", "json")
    try:
        server.wait_for(r"store recovery: nothing to re-scan")
        lines = server.text().splitlines()
        records = [json.loads(line) for line in lines]  # every line is one JSON object
        assert {"time", "level", "logger", "message"} <= records[0].keys()
        messages = [r["message"] for r in records]
        banner = next(m for m in messages if m.startswith("lmq-gateway "))
        assert f"data dir {tmp_path / 'data'}" in banner and "flush async" in banner
        listening = next(m for m in messages if m.startswith("listening: "))
        assert f"MQTT tcp 127.0.0.1:{server.mqtt_port}" in listening
        assert re.search(r"broker 127\.0\.0\.1:\d+ \(advertised 127\.0\.0\.1:\d+\)", listening)
        assert server.out.read_text() == ""  # nothing on stdout / stderr

        _publish(server.mqtt_port, 5)
        end = _commitlog_end(server.text())
        server.stop(signal.SIGKILL)
        # A torn write at the end of the CommitLog, as a crash mid-append leaves it.
        files = sorted((tmp_path / "data" / "commitlog").iterdir())
        current = [f for f in files if int(f.name) <= end][-1]
        with open(current, "r+b") as fh:
            fh.seek(end - int(current.name))
            fh.write(b"\xab" * 64)
        size = len(server.text())
        server = Server(tmp_path, "--log-format", "json")
        line = server.wait_for(r'"message": "store recovery: [^"]*"', size).group(0)
        assert f"cut a torn tail at offset {end}" in line, line
    finally:
        server.stop()


def test_text_log_to_stderr_by_default(tmp_path):
    server = Server(tmp_path, log_file=False)
    try:
        server.wait_for(r"INFO lmq: listening: name server 127\.0\.0\.1:\d+")
    finally:
        server.stop()


def test_unwritable_log_file_is_one_line(tmp_path):
    missing = tmp_path / "no-such-dir" / "lmq.log"
    r = subprocess.run([sys.executable, "-m", "lmq", "namesrv", "--port", "0",
                        "--log-file", str(missing)], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"lmq namesrv: cannot write the log file {missing}: No such file or directory "
        "(choose another --log-file)"]


def test_log_options_on_every_server_command():
    for command in ("serve", "namesrv", "broker", "mqtt", "amqp"):
        r = subprocess.run([sys.executable, "-m", "lmq", command, "--help"], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
        assert "--log-format" in r.stdout and "--log-file" in r.stdout, command


def _config(**kw) -> SimpleNamespace:
    return SimpleNamespace(**{"host": "127.0.0.1", "advertise_host": None, **kw})


def test_advertise_choice():
    assert choose_advertise_host(_config(), lambda: "10.1.2.3") is None  # loopback bind
    assert choose_advertise_host(_config(host="0.0.0.0", advertise_host="h"),
                                 lambda: "10.1.2.3") is None  # the operator chose
    cfg = _config(host="0.0.0.0")
    line = choose_advertise_host(cfg, lambda: "10.1.2.3")
    assert cfg.advertise_host == "10.1.2.3" and "advertising 10.1.2.3" in line
    cfg = _config(host="0.0.0.0")
    line = choose_advertise_host(cfg, lambda: None)
    assert cfg.advertise_host is None
    assert "advertising 127.0.0.1" in line and "--advertise-host" in line


def test_serve_on_all_interfaces_advertises_a_reachable_address(tmp_path):
    ip = non_loopback_ip()
    server = Server(tmp_path, "--host", "0.0.0.0", "--allow-unauthenticated", log_file=False)
    try:
        listening = server.wait_for(r"listening: .*").group(0)
        if ip is None:
            assert "advertising 127.0.0.1" in server.text()
        else:
            assert re.search(rf"broker 0\.0\.0\.0:\d+ \(advertised {re.escape(ip)}:\d+\)",
                             listening), listening
            assert f"advertising {ip}" in server.text()
    finally:
        server.stop()


def test_recovery_summary_wording():
    report = SimpleNamespace(records_scanned=3, bytes_scanned=300, scan_start=0, end=300,
                             bytes_zeroed=4096, files_removed=0, lmq_units_dropped=2,
                             seconds=0.01)
    text = recovery_summary(report)
    assert "re-scanned 3 records (300 bytes)" in text
    assert "cut a torn tail at offset 300" in text and "dropped 2 LMQ" in text
    assert os.linesep not in text


def test_acl_refusals_are_logged_one_line_per_interval(caplog):
    """A refused request is one log line with its reason; a client refused in a loop gets
    one line per interval, which counts the ones left out (MockClock: no real waiting)."""
    import trio
    import trio.testing

    from core.acl import validator
    from core.acl.config import AclConfig
    from core.remoting.codec import RemotingCommand
    from core.remoting.processor import RequestContext

    guard = validator.PlainAclGuard(AclConfig())
    ctx = RequestContext(object(), "10.9.8.7:5555", "127.0.0.1:10911")

    async def main() -> None:
        for _ in range(5):
            answer = await guard(ctx, RemotingCommand.request(10, {"topic": "T"}))
            assert answer.code == 1
        await trio.sleep(validator.REFUSAL_LOG_INTERVAL_S)
        await guard(ctx, RemotingCommand.request(10, {"topic": "T", "AccessKey": "nobody"}))

    with caplog.at_level("INFO", logger="core.acl.validator"):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    lines = [r.getMessage() for r in caplog.records if "ACL refused" in r.getMessage()]
    assert lines == [
        "ACL refused request code 10 from 10.9.8.7:5555: No accessKey is configured",
        "ACL refused request code 10 from 10.9.8.7:5555: No acl config for nobody "
        "(4 more refused since the last line)"]
