"""`df.write/writeStream.format("lmq")` with a real Spark session (slow tier)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyspark.sql.utils import StreamingQueryException

from tests.spark.conftest import REPO, send_to_queues, topic_with_queues, visible
from tests.spark.faulty import FaultyLmqDataSource, marker_for

pytestmark = pytest.mark.slow


def test_batch_write_all_columns(spark, lmq_cluster):
    addr = lmq_cluster["addr"]
    topic_with_queues(addr, "SinkBatchA", 2)
    topic_with_queues(addr, "SinkBatchB", 2)
    df = spark.createDataFrame(
        [(f"v{i}", f"k{i}", "SinkBatchB" if i % 3 == 0 else None, "tg", {"n": str(i)})
         for i in range(12)],
        "value string, key string, topic string, tags string, properties map<string,string>")
    df.repartition(2).write.format("lmq").option("lmq.namesrv", addr) \
        .option("topic", "SinkBatchA").mode("append").save()
    back = (spark.read.format("lmq").option("lmq.namesrv", addr)
            .option("subscribe", "SinkBatchA,SinkBatchB").load().collect())
    assert sorted((r.topic, r.value) for r in back) == sorted(
        ("SinkBatchB" if i % 3 == 0 else "SinkBatchA", f"v{i}".encode()) for i in range(12))
    r = next(r for r in back if r.value == b"v4")
    assert (r.key, r.tags, r.properties["n"]) == ("k4", "tg", "4")


def test_batch_write_is_all_or_nothing(spark, lmq_cluster):
    addr = lmq_cluster["addr"]
    topic_with_queues(addr, "SinkBatchFail", 2)
    df = spark.createDataFrame([("a",), ("b",), (None,), ("c",)], "value string")
    with pytest.raises(Exception, match="null 'value'"):
        df.repartition(2).write.format("lmq").option("lmq.namesrv", addr) \
            .option("topic", "SinkBatchFail").mode("append").save()
    assert visible(addr, "SinkBatchFail") == []


def test_stream_restarted_after_failed_commit_writes_each_row_once(spark, lmq_cluster, tmp_path):
    addr = lmq_cluster["addr"]
    topic_with_queues(addr, "SinkIn", 2)
    topic_with_queues(addr, "SinkOut", 2)
    spark.dataSource.register(FaultyLmqDataSource)
    ck = str(tmp_path / "ck")
    marker = Path(marker_for(ck))

    def run():
        src = (spark.readStream.format("lmq").option("lmq.namesrv", addr)
               .option("subscribe", "SinkIn").option("startingOffsets", "earliest")
               .option("maxOffsetsPerTrigger", "6").load())
        q = (src.selectExpr("value", "key").writeStream.format("lmq_faulty")
             .option("lmq.namesrv", addr).option("topic", "SinkOut")
             .option("checkpointLocation", ck).trigger(availableNow=True).start())
        q.awaitTermination(120)

    sent = send_to_queues(addr, "SinkIn", {0: 5, 1: 5})
    marker.touch()
    with pytest.raises(StreamingQueryException, match="injected failure"):
        run()   # batch 0's tasks wrote their halves; the commit never happened
    assert not marker.exists() and visible(addr, "SinkOut") == []
    run()       # restart from the checkpoint: batch 0 again, then the rest
    assert visible(addr, "SinkOut") == sorted(sent)
    sent += send_to_queues(addr, "SinkIn", {0: 2, 1: 1}, prefix="w")
    run()
    assert visible(addr, "SinkOut") == sorted(sent)


def _driver(addr, ck, per_trigger="4"):
    return subprocess.Popen(
        [sys.executable, "-m", "tests.spark.driver_job", addr, "SinkKillIn", "SinkKillOut", ck,
         per_trigger], cwd=REPO, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _kill_when_reached(proc, marker: Path, timeout: float = 150.0) -> None:
    reached = Path(str(marker) + ".reached")
    deadline = time.monotonic() + timeout
    while not reached.exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "the driver never reached the commit"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)   # the driver, its JVM and its Python workers
    proc.wait(30)
    reached.unlink()


def test_driver_killed_around_the_commit_writes_each_row_once(lmq_cluster, tmp_path):
    """kill -9 of a driver process after the commit record was stored but before the
    transactions ended, then again after the whole commit but before Spark wrote its commit
    log (the crash before the commit is covered in-process above); each restart resumes
    from the checkpoint, and every row arrives exactly once."""
    addr = lmq_cluster["addr"]
    topic_with_queues(addr, "SinkKillIn", 2)
    topic_with_queues(addr, "SinkKillOut", 2)
    sent = send_to_queues(addr, "SinkKillIn", {0: 6, 1: 6})
    ck = str(tmp_path / "ck")
    marker = Path(marker_for(ck))
    for mode in ("hang-after-record", "hang-after-commit"):
        marker.write_text(mode)
        proc = _driver(addr, ck)
        _kill_when_reached(proc, marker)
    proc = _driver(addr, ck)
    _, err = proc.communicate(timeout=200)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert visible(addr, "SinkKillOut") == sorted(sent)
