"""Smoke tests of `lmq bench broker`: it runs end to end and reports every figure.

Keys and shapes only — speed is what the bench prints, never what a test asserts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmq.bench.broker import PHASES

REPO = Path(__file__).resolve().parents[2]


def _bench(tmp_path: Path, *options: str, timeout: float = 240) -> subprocess.CompletedProcess:
    # TMPDIR: the bench's data directory goes under tmp_path, so a leak would show.
    env = dict(os.environ, TMPDIR=str(tmp_path))
    return subprocess.run(
        [sys.executable, "-m", "lmq", "bench", "broker", "--quick", *options],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )


def test_baseline_only_prints_table(tmp_path: Path) -> None:
    proc = _bench(tmp_path, "--only", "gen_ceiling")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "echo_tcp" in out and "BASELINE" in out
    assert "gen_ceiling" in out and "round trips/s" in out
    assert "send " not in out  # phases not asked for are not run
    assert list(tmp_path.iterdir()) == []  # temporary data removed


def test_unknown_phase_is_refused(tmp_path: Path) -> None:
    proc = _bench(tmp_path, "--only", "nonsense", timeout=60)
    assert proc.returncode == 2
    assert "unknown phase" in proc.stderr


@pytest.mark.slow
def test_quick_json_reports_every_phase(tmp_path: Path) -> None:
    proc = _bench(tmp_path, "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["bench"] == "broker"
    assert report["baseline"] == "echo_tcp"
    assert report["config"]["runs"] == 1
    assert set(report["phases"]) == set(PHASES)
    for name, phase in report["phases"].items():
        assert "error" not in phase, (name, phase)
        assert phase["errors"] == 0, (name, phase)
        if phase["unit"] == "ms":
            for key in ("p50_ms", "p99_ms", "p999_ms", "max_ms", "write_p99_ms",
                        "p50_ratio", "p99_ratio", "samples"):
                assert key in phase, (name, key)
            assert phase["samples"] > 0
        else:
            assert phase["unit"] in ("msg/s", "round trips/s")
            for key in ("value", "ratio", "requests_per_s", "client_cpu", "runs"):
                assert key in phase, (name, key)
            assert phase["value"] > 0
    assert report["phases"]["echo_tcp"]["ratio"] == pytest.approx(1.0)
    # A child-process server reports its CPU use; in-process phases have none.
    assert report["phases"]["send"]["server_cpu"] is not None
    assert set(report["targets"]) == {"send", "batch", "pull", "latency"}
    assert all(isinstance(t["met"], bool) for t in report["targets"].values())
    assert list(tmp_path.iterdir()) == []
