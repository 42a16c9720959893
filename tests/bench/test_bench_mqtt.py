"""`lmq bench mqtt` measures what it claims: tiny loads against a real `lmq serve` (and
Mosquitto when installed) must come out whole — every QoS 1 message of a closed-loop
phase delivered, every message due in an open-loop window received — and the pieces
the figures are computed with (the schedule, the window count, medians) are exact.
No speed is judged here: the machine is shared."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmq.bench._mqtt_open import pin_cpus
from lmq.bench._mqtt_paced import DELIVERY_DEADLINE_S, Schedule, window_stats
from lmq.bench._mqtt_report import median_of, notes_for, print_table, ratios
from lmq.bench._mqtt_servers import start_mosquitto
from lmq.bench.mqtt import options, run_phase
from tests.bench.mqtt_support import TINY, lmq_server, tmp_dir

REPO = Path(__file__).resolve().parents[2]


__all__ = ["lmq_server", "tmp_dir"]  # fixtures used below


@pytest.fixture(scope="module")
def mosquitto_server(tmp_dir):
    server = start_mosquitto(tmp_dir)
    if server is None:
        pytest.skip("mosquitto is not installed")
    yield server
    server.stop()


# ------------------------------------------------------------------------ pure pieces
def test_schedule_counts_exactly_the_messages_due_in_a_window():
    s = Schedule(t0=100.0, rate=10.0)  # due at 100.0, 100.1, 100.2, ...
    assert s.due_by(99.99) == 0
    assert s.due_by(100.0) == 1
    assert s.due_by(100.25) == 3
    s.sent = 20  # 100.0 .. 101.9 went out
    assert s.in_window(100.0, 100.95) == 10
    assert s.in_window(100.05, 100.3) == 3  # 100.1, 100.2, 100.3
    assert s.in_window(101.5, 200.0) == 5  # only what was sent counts
    assert s.in_window(50.0, 60.0) == 0


def test_window_stats_judges_by_due_time_and_deadline():
    dues = [1.0, 2.0, 3.0, 4.0, 9.0]
    lats = [0.01, DELIVERY_DEADLINE_S + 0.5, 0.2, DELIVERY_DEADLINE_S, 0.01]
    count, in_time, picked = window_stats(dues, lats, 1.5, 4.0)
    assert count == 3  # due 2, 3 and 4
    assert in_time == 2  # due 2 arrived too late
    assert sorted(picked) == sorted(lats[1:4])


def test_median_of_rounds_is_a_median_and_nested():
    runs = [{"x": 1.0, "ok": True, "steps": {"1000": {"d": 5}}},
            {"x": 9.0, "ok": False, "steps": {"1000": {"d": 7}, "2000": {"d": 1}}},
            {"x": 3.0, "ok": True, "steps": {"1000": {"d": 6}}}]
    m = median_of(runs)
    assert m["x"] == 3.0
    assert m["ok"] is True
    assert m["steps"]["1000"]["d"] == 6
    assert m["steps"]["2000"]["d"] == 1  # reached in one round only
    assert m["rounds"] == 3
    assert set(m["steps"]) == {"1000", "2000"}  # only the top level counts rounds


def test_report_of_rounds_with_steps_renders(capsys):
    """Two rounds of every kind of phase, both servers: medians, ratios, notes, table."""
    def step(d):
        return {"delivered_per_s": d, "in_time_pct": 100.0, "p99_ms": 2.0,
                "server_cpu_pct": 50.0, "sustained": True}

    def rounds(scale):
        return {
            "steps": [{"highest_sustained_per_s": 2000.0 * scale,
                       "steps": {"1000": step(1000.0), "2000": step(2000.0)}},
                      {"highest_sustained_per_s": 1000.0 * scale,
                       "steps": {"1000": step(1000.0)}}],
            "devices10": [{"delivered_per_s": 100.0 * scale, "in_time_pct": 100.0,
                           "loss_pct": 0.0, "p99_ms": 3.0, "generator_max_proc_cpu_pct": 95.0}] * 2,
            "fanin_qos1": [{"delivered_per_s": 10.0 * scale, "per_server_cpu_s": 20.0}] * 2,
        }
    results = {name: {ph: median_of(rs) for ph, rs in rounds(scale).items()}
               for name, scale in (("lmq", 1.0), ("mosquitto", 2.0))}
    r = ratios(results["lmq"], results["mosquitto"])
    assert r["steps.highest_sustained_per_s"] == 0.5
    assert r["steps@1000/s.delivered_per_s"] == 1.0
    assert r["devices10.delivered_per_s"] == 0.5
    notes = notes_for(results, None)
    assert any("devices10" in n and "80%" in n for n in notes)  # the busy generator
    print_table({"results": results, "ratios": r, "phases": list(results["lmq"]),
                 "generator": {}, "config": {"runs": 2}, "notes": notes,
                 "pinning": {"server": [0], "generator": [1]}})
    out = capsys.readouterr().out
    assert "medians over 2 round(s)" in out
    assert "steps@2000/s" in out


def test_ratios_cover_open_loop_and_steps():
    ours = {"devices10": {"delivered_per_s": 50.0, "p99_ms": 4.0},
            "steps": {"highest_sustained_per_s": 2000.0, "steps": {}}}
    theirs = {"devices10": {"delivered_per_s": 100.0, "p99_ms": 2.0},
              "steps": {"highest_sustained_per_s": 4000.0, "steps": {}}}
    r = ratios(ours, theirs)
    assert r["devices10.delivered_per_s"] == 0.5
    assert r["devices10.p99_ms"] == 2.0
    assert r["steps.highest_sustained_per_s"] == 0.5


def test_auto_pinning_separates_server_and_generator():
    srv, gen = pin_cpus("auto", None, None)
    if len(os.sched_getaffinity(0)) < 2:
        assert (srv, gen) == ((), ())
    else:
        assert srv and gen and not set(srv) & set(gen)
    assert pin_cpus("off", None, None) == ((), ())
    assert pin_cpus("auto", "0", "0") == ((0,), (0,))


# ------------------------------------------------------------------------ real servers
def test_closed_loop_qos1_delivers_every_message(lmq_server):
    opts = options([*TINY, "--publishers", "2", "--window", "200"])
    r = run_phase("fanin_qos1", opts, lmq_server, "t1")
    assert r["published_per_s"] > 0
    assert r["missing"] == 0


def test_open_loop_devices_deliver_what_was_sent(lmq_server):
    opts = options([*TINY, "--device-rate", "5", "--devices-per-proc", "10"])
    r = run_phase("devices20", opts, lmq_server, "t2")
    assert r["devices"] == 20
    assert r["window_sent"] > 0
    assert r["window_received"] == r["window_sent"]
    assert r["missing"] == 0 and r["loss_pct"] == 0
    assert r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]


def test_open_loop_devices_against_mosquitto(mosquitto_server):
    opts = options([*TINY, "--device-rate", "5", "--devices-per-proc", "10"])
    r = run_phase("devices20", opts, mosquitto_server, "t3")
    assert r["window_sent"] > 0
    assert r["window_received"] == r["window_sent"]
    assert r["missing"] == 0


@pytest.mark.slow
def test_bench_mqtt_quick_json_compares_with_mosquitto():
    phases = "fanin_qos1,fanout10_qos1,latency,devices200,steps"
    out = subprocess.run(
        [sys.executable, "-m", "lmq", "bench", "mqtt", "--quick", "--json", "--runs", "2",
         "--compare-mosquitto", "--phases", phases, "--drain", "20"],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["statistic"].startswith("median over 2 round(s)")
    ours = report["results"]["lmq"]
    for phase in ("fanin_qos1", "fanout10_qos1"):
        assert ours[phase]["missing"] == 0, phase  # QoS 1 loses nothing
    assert ours["latency"]["samples"] > 0
    assert ours["devices200"]["window_received"] == ours["devices200"]["window_sent"]
    if "mosquitto" in report["results"]:
        assert "devices200.delivered_per_s" in report["ratios"]
