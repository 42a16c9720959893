"""`lmq bench mqtt` also times PINGREQs during a phase's window and samples the server's
anonymous memory (lmq/bench/_mqtt_ping.py, lmq/bench/mqtt.py). Tiny loads, real servers; no speed
is judged (the machine is shared)."""

from __future__ import annotations

import time

import pytest

from lmq.bench._mqtt_ping import Pinger
from lmq.bench._mqtt_servers import start_mosquitto
from lmq.bench.mqtt import options, run_phase
from tests.bench.mqtt_support import TINY, lmq_server, tmp_dir

__all__ = ["lmq_server", "tmp_dir"]  # fixtures used below


def test_open_phase_reports_pings_and_anonymous_memory(lmq_server):
    opts = options([*TINY, "--device-rate", "5", "--devices-per-proc", "10"])
    r = run_phase("devices20", opts, lmq_server, "p1")
    assert r["pings"] >= 10  # one every 20 ms over a 1 s window, answered one by one
    assert 0 < r["ping_p50_ms"] <= r["ping_p99_ms"] <= r["ping_max_ms"]
    assert 0 < r["server_anon_mb"] <= r["server_anon_peak_mb"]
    assert r["server_anon_mb"] <= r["server_rss_mb"]  # both at the end of the window


def test_pinger_against_mosquitto(tmp_dir):
    server = start_mosquitto(tmp_dir)
    if server is None:
        pytest.skip("mosquitto is not installed")
    try:
        pinger = Pinger(server.host, server.port)
        pinger.start()
        time.sleep(0.3)
        pinger.stop()
        figures = pinger.figures()
        assert figures["pings"] >= 3 and "ping_failed" not in figures
    finally:
        server.stop()
