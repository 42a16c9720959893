"""The connector on a Spark cluster of separate executor processes (`local-cluster`), the
project shipped to them as a zip (slow tier)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.spark.conftest import REPO, send_to_queues, topic_with_queues

pytestmark = pytest.mark.slow


def test_local_cluster_with_the_package_shipped_as_a_zip(lmq_cluster, tmp_path):
    from spark_sinks.package import build_zip

    addr = lmq_cluster["addr"]
    topic_with_queues(addr, "ClusterIn", 2)
    topic_with_queues(addr, "ClusterOut", 2)
    sent = send_to_queues(addr, "ClusterIn", {0: 7, 1: 5})
    zip_path = build_zip(tmp_path / "lmq-spark.zip")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing on the path
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "spark" / "cluster_job.py"), addr,
         str(zip_path), "ClusterIn", "ClusterOut"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["written"] == sorted(b.decode() for b in sent)
    # the executors (their own processes) imported the shipped zip
    assert result["executor_files"] and all("lmq-spark.zip" in f
                                            for f in result["executor_files"])
