"""`lmq bench store --quick --json` runs and reports every figure; each throughput is the
median of its rounds (it used to be the best of them while README said "median"), and
the text output says what its labels mean."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

from lmq.bench import store as bench_store

KEYS = {
    "put_msgs_per_s_1cq", "put_msgs_per_s_4lmq", "put_mb_per_s_4k", "get_msgs_per_s",
    "put_msgs_per_s_4lmq_100k", "put_msgs_per_s_4lmq_1m",
    "recovery_s_1gib", "rss_mb_1m_lmq", "raw_pack_msgs_per_s", "put_1cq_ratio",
    "put_4lmq_ratio", "put_4lmq_100k_ratio", "put_4lmq_1m_ratio", "put_4k_ratio", "get_ratio",
}
ROUNDED = ("put_msgs_per_s_1cq", "put_batch_msgs_per_s_1cq", "put_msgs_per_s_4lmq",
           "put_batch_msgs_per_s_4lmq", "put_msgs_per_s_4lmq_100k", "put_msgs_per_s_4lmq_1m",
           "get_msgs_per_s", "put_mb_per_s_4k")


def test_bench_store_quick_json(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "lmq", "bench", "store", "--quick", "--json",
         "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=240, check=True,
    ).stdout
    res = json.loads(out.strip().splitlines()[-1])
    assert KEYS <= res.keys()
    assert all(isinstance(res[k], (int, float)) and res[k] > 0 for k in KEYS)
    assert res["statistic"] == "median"
    for key in ROUNDED:
        rounds = res[key + "_rounds"]
        assert len(rounds) == res["rounds"] >= 3
        assert res[key] == statistics.median(rounds), key
    # the LMQ cases are over populations larger than the 1k one, and the 1M case larger
    # than the 100k one
    assert 1000 < res["lmq_100k_population"] < res["lmq_1m_population"]


def test_bench_store_table_says_median_and_explains_labels():
    res = {
        "quick": False, "rounds": 3, "raw_pack_msgs_per_s": 500_000.0,
        "raw_pack_mb_per_s_4k": 600.0, "put_latency_us": {"p50": 2.0, "p99": 9.0, "p999": 90.0},
        "recovery_s_1gib": 0.5, "recovery_written_bytes": 1 << 30,
        "recovery_rescanned_bytes": 1 << 20, "rss_lmq_count": 1_000_000,
        "rss_mb_1m_lmq": 61.0, "rss_total_mb_1m_lmq": 70.0,
        "lmq_100k_population": 100_000, "lmq_1m_population": 1_000_000,
    }
    for key in ROUNDED:
        res[key], res[key + "_rounds"] = 200.0, [100.0, 200.0, 900.0]
    for key in ("put_1cq", "put_batch_1cq", "put_4lmq", "put_batch_4lmq", "put_4lmq_100k",
                "put_4lmq_1m", "get", "put_4k"):
        res[key + "_ratio"] = 0.5
    text = bench_store._table(res)
    assert "median of 3 timed rounds" in text
    assert "200 msg/s (100-900)" in text  # the median, then the slowest and fastest round
    assert "4 of 100k LMQs" in text and "4 of 1M LMQs" in text
    assert "always in the" in text and "cache" in text
