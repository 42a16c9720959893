"""`lmq bench store --quick --json` runs and reports every figure (values not checked)."""

from __future__ import annotations

import json
import subprocess
import sys

KEYS = {
    "put_msgs_per_s_1cq", "put_msgs_per_s_4lmq", "put_mb_per_s_4k", "get_msgs_per_s",
    "recovery_s_1gib", "rss_mb_1m_lmq", "raw_pack_msgs_per_s", "put_1cq_ratio",
    "put_4lmq_ratio", "put_4k_ratio", "get_ratio",
}


def test_bench_store_quick_json(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "lmq", "bench", "store", "--quick", "--json",
         "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=240, check=True,
    ).stdout
    res = json.loads(out.strip().splitlines()[-1])
    assert KEYS <= res.keys()
    assert all(isinstance(res[k], (int, float)) for k in KEYS)
