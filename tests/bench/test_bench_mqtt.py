"""Smoke test of `lmq bench mqtt --quick --json` against our server: it runs to the end and
reports every phase with its keys (no figure is judged: speed is not a test matter)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

THROUGHPUT_KEYS = {"published_per_s", "delivered_per_s", "server_cpu_pct", "generator_cpu_pct",
                   "missing"}


def _has_mqtt() -> bool:
    out = subprocess.run([sys.executable, "-m", "lmq", "serve", "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    return "--mqtt-port" in out.stdout


@pytest.mark.slow
def test_bench_mqtt_quick_json_keys():
    if not _has_mqtt():
        pytest.skip("`lmq serve` has no MQTT gateway yet")
    from bench.mqtt import PHASES

    out = subprocess.run(
        [sys.executable, "-m", "lmq", "bench", "mqtt", "--quick", "--json",
         "--idle-connections", "100"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["bench"] == "mqtt"
    assert report["phases"] == list(PHASES)
    assert set(report["config"]) >= {"duration", "runs", "size", "window", "rate"}
    assert set(report["generator"]) == {"gen_ceiling_pub", "gen_ceiling_sub"}
    for r in report["generator"].values():
        assert set(r) == {"msgs_per_s", "generator_cpu_pct"}
    assert set(report["results"]) == {"lmq"}
    ours = report["results"]["lmq"]
    assert set(ours) == set(PHASES) - {"gen_ceiling_pub", "gen_ceiling_sub"}
    for phase in ("fanin_qos0", "fanin_qos1", "fanout10_qos0", "fanout10_qos1",
                  "fanout100_qos0", "fanout100_qos1"):
        assert set(ours[phase]) >= THROUGHPUT_KEYS, phase
    assert set(ours["latency"]) >= THROUGHPUT_KEYS | {"samples", "p50_ms", "p99_ms", "max_ms",
                                                      "rate", "qos"}
    assert set(ours["idle"]) >= {"connections", "connect_per_s", "rss_before_mb",
                                 "rss_after_mb", "kb_per_connection"}
    assert set(report["runs"]["lmq"]) == set(ours)
    assert "ratios" not in report  # no --compare-mosquitto
