"""The live line while a server's store recovers after a crash: on a terminal only, with
files / bytes / records / ConsumeQueues, erased before the banner's summary; nothing
when the output is piped. A real `lmq serve` writes the store and is killed -9."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.gateway.mqtt.e2e_support import BROKER_TEST_CONFIG, free_port, write_toml
from tests.ops.pty_run import run_in_pty

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(180)
PAYLOAD = 60 * 1024
MESSAGES = 600  # ~36 MiB: more than two 16 MiB CommitLog files


def _serve(root: Path, data: Path) -> list[str]:
    cfg = root / "broker.toml"
    # The checkpoint is written at start and then only after this long: the restart after
    # the kill re-scans everything written in between.
    write_toml(cfg, {"broker": {**BROKER_TEST_CONFIG, "flush_interval_ms": 600_000}})
    return [sys.executable, "-m", "lmq", "serve", "--no-grpc", "--no-amqp",
            "--data-dir", str(data), "--config", str(cfg),
            "--namesrv-port", str(free_port()), "--broker-port", str(free_port()),
            "--mqtt-port", str(free_port())]


def _fill_and_kill(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    argv = _serve(tmp_path, data)
    port = int(argv[argv.index("--mqtt-port") + 1])
    log = open(tmp_path / "first.log", "wb")
    proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="fill")
        for _ in range(300):
            try:
                client.connect("127.0.0.1", port)
                break
            except OSError:
                assert proc.poll() is None, (tmp_path / "first.log").read_text()
                import time
                time.sleep(0.1)
        client.loop_start()
        infos = [client.publish(f"fill/{i % 4}", b"x" * PAYLOAD, qos=1)
                 for i in range(MESSAGES)]
        for info in infos:
            info.wait_for_publish(60)
        client.disconnect()
        client.loop_stop()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        log.close()
    return data


def test_recovery_shows_a_live_line_on_a_terminal_only(tmp_path):
    data = _fill_and_kill(tmp_path)
    shutil.copytree(data, tmp_path / "copy")

    # On a terminal: the live line, then the banner on a clean line.
    code, text, proc = run_in_pty(_serve(tmp_path, data), REPO, 120,
                                  until=b"store recovery: re-scanned")
    try:
        assert code is None, text[-3000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    live = re.findall(r"\r\x1b\[Kstore recovery: ([^\r\n\x1b]*?) \(\d+ s\)", text)
    assert live and re.fullmatch(r"checking the CommitLog, file 1/3, 0/48 MiB, 0 records",
                                 live[0]), live
    # a redraw per phase and at most every RECOVERY_REDRAW_S, never per record
    rebuilding = [line for line in live if line.startswith("re-dispatching ")]
    assert rebuilding and len(live) < 20, live
    assert re.fullmatch(r"re-dispatching \d+/35 MiB, [\d,]+ records, \d+ ConsumeQueues",
                        rebuilding[-1]), rebuilding
    # erased before the first log line that follows, so the log starts on a clean line
    after = text[text.index("\r\x1b[Kstore recovery: "):]
    assert re.search(r"\r\x1b\[K\d{4}-\d\d-\d\d ", after), after[:500]
    summary = re.search(r"store recovery: re-scanned (\d+) records", text)
    assert int(summary.group(1)) >= MESSAGES

    # Piped: the same recovery writes no live line, only the log.
    argv = _serve(tmp_path, tmp_path / "copy")
    piped = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = b""
    try:
        while b"store recovery: re-scanned" not in out:
            line = piped.stdout.readline()
            assert line, out.decode(errors="replace")
            out += line
    finally:
        piped.send_signal(signal.SIGTERM)
        out += piped.communicate(timeout=30)[0]
    assert b"\x1b" not in out and b"\r" not in out, out[-2000:]
    assert b"checking the CommitLog" not in out


def test_recovery_progress_hook_is_called_per_16_mib_not_per_record(tmp_path):
    """A real store re-scans ~20 MiB in 1,300 records after an unclean close: the hook
    sees each phase start, a call per PROGRESS_EVERY_BYTES, and the end."""
    from core.common.message import InnerMessage
    from core.store import MessageStore, StoreConfig, recovery

    cfg = StoreConfig(str(tmp_path / "store"), commitlog_file_size=8 << 20,
                      disk_max_used_ratio=1.0, disk_full_ratio=1.0)
    store = MessageStore(cfg)
    store.start()
    for j in range(1300):
        assert store.put(InnerMessage(f"T{j % 3}", b"b" * 16000, queue_id=j % 2)).status.name \
            == "OK"
    store._close_all()                       # no shutdown: the checkpoint stays at 0

    calls = []
    recovery.set_progress_hook(lambda p: calls.append((p.phase, p.bytes_done, p.records,
                                                       p.files_done, p.consume_queues)))
    try:
        again = MessageStore(cfg)
        again.start()
        again.shutdown()
    finally:
        recovery.set_progress_hook(None)
    every = recovery.PROGRESS_EVERY_BYTES
    scanned = again.recovery_report.bytes_scanned
    assert again.recovery_report.records_scanned == 1300
    checking = [c for c in calls if c[0] == "checking"]
    redispatch = [c for c in calls if c[0] == "re-dispatching"]
    assert calls[-1][0] == "done" and calls[-1][2] == 1300
    assert len(checking) == len(redispatch) == 1 + scanned // every
    assert checking[0][1] == 0 and checking[1][1] >= every and checking[1][3] >= 2
    assert redispatch[-1][4] == 6            # 3 topics x 2 queues rebuilt
