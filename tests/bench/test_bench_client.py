"""Smoke tests of `lmq bench produce|consume --compare-cpp`: both clients run against the
same broker and every figure is reported.

Keys and shapes only — speed is what the bench prints, never what a test asserts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

needs_wheel = pytest.mark.skipif(importlib.util.find_spec("rocketmq") is None,
                                 reason="the `rocketmq` wheel (C++ client) is not installed")


def _bench(tmp_path: Path, name: str, *options: str, timeout: float = 180) -> subprocess.CompletedProcess:
    # TMPDIR: the broker's data dir and the C++ child's HOME (its logs) go under tmp_path,
    # so a leak would show.
    env = dict(os.environ, TMPDIR=str(tmp_path))
    return subprocess.run([sys.executable, "-m", "lmq", "bench", name, *options],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@needs_wheel
def test_produce_compare_cpp_reports_both_clients(tmp_path: Path) -> None:
    proc = _bench(tmp_path, "produce", "--quick", "--compare-cpp", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["runs"] == 1
    for key in ("msgs_per_s", "baseline_msgs_per_s", "ratio", "cpp_msgs_per_s", "cpp_errors",
                "cpp_latency", "ratio_vs_cpp", "latency"):
        assert key in report, key
    assert "cpp_error" not in report
    assert report["cpp_msgs_per_s"] > 0 and report["msgs_per_s"] > 0
    assert report["ratio_vs_cpp"] == pytest.approx(report["msgs_per_s"] / report["cpp_msgs_per_s"],
                                                   rel=1e-2)
    assert set(report["per_run"]) == {"msgs_per_s", "baseline_msgs_per_s", "cpp_msgs_per_s"}
    assert all(len(v) == 1 for v in report["per_run"].values())
    assert list(tmp_path.iterdir()) == []  # broker data and the C++ client's logs removed


@needs_wheel
def test_consume_compare_cpp_reads_every_message_with_both(tmp_path: Path) -> None:
    proc = _bench(tmp_path, "consume", "--quick", "--compare-cpp", "--messages", "300", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    for key in ("msgs_per_s", "first_msg_s", "cpp_msgs_per_s", "cpp_seconds", "cpp_first_msg_s",
                "ratio_vs_cpp"):
        assert key in report, key
    assert report["messages"] >= 300
    assert report["cpp_messages"] >= 300  # a fresh C++ group starts at offset 0
    assert "cpp_error" not in report
    assert list(tmp_path.iterdir()) == []


@needs_wheel
def test_table_shows_ours_cpp_and_ratio(tmp_path: Path) -> None:
    proc = _bench(tmp_path, "produce", "--quick", "--compare-cpp", "--no-baseline")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "producer" in proc.stdout and "C++ client" in proc.stdout
    assert "x the C++ client via its Python wheel" in proc.stdout  # not a C++ program


@pytest.mark.parametrize("name, option", [("produce", "--mode=async"), ("consume", "--kind=lite")])
def test_compare_cpp_refuses_loads_it_does_not_mirror(tmp_path: Path, name: str, option: str) -> None:
    proc = _bench(tmp_path, name, "--quick", "--compare-cpp", option, timeout=60)
    assert proc.returncode == 2
    assert "--compare-cpp" in proc.stdout
