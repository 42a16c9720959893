"""Source options of the second slice against a real broker: subscribePattern,
startingTimestamp, includeHeaders, commitGroup (slow tier: real Spark)."""

from __future__ import annotations

import time

import pytest

from tests.spark.conftest import reader, send_to_queues, stream, topic_with_queues

pytestmark = pytest.mark.slow


def test_subscribe_pattern_batch_and_topics_created_while_streaming(spark, lmq_cluster, tmp_path):
    addr = lmq_cluster["addr"]
    for t in ("PatA1", "PatA2", "PatB1", "xPatA3"):
        topic_with_queues(addr, t, 1)
        send_to_queues(addr, t, {0: 2}, prefix=t)
    rows = reader(spark, addr, subscribePattern=r"PatA\d").collect()
    assert sorted(r.value for r in rows) == [b"PatA1-0-0", b"PatA1-0-1", b"PatA2-0-0", b"PatA2-0-1"]

    got: list[bytes] = []
    q = (stream(spark, addr, subscribePattern=r"PatC\d+", startingOffsets="earliest")
         .writeStream.foreachBatch(lambda df, _id: got.extend(r.value for r in df.collect()))
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        q.processAllAvailable()
        assert got == []
        topic_with_queues(addr, "PatC7", 2)              # appears while the query runs
        new = send_to_queues(addr, "PatC7", {0: 2, 1: 1}, prefix="c")
        q.processAllAvailable()
    finally:
        q.stop()
    assert sorted(got) == sorted(new)


def test_starting_timestamp_uses_store_time(spark, lmq_cluster, tmp_path):
    addr = lmq_cluster["addr"]
    topic_with_queues(addr, "SrcTime", 2)
    send_to_queues(addr, "SrcTime", {0: 3, 1: 3}, prefix="old")
    time.sleep(0.05)                                     # store times differ by >= 1 ms
    new = send_to_queues(addr, "SrcTime", {0: 2, 1: 4}, prefix="new")
    stored = reader(spark, addr, subscribe="SrcTime").collect()
    cut = min(r.timestamp for r in stored if r.value.startswith(b"new"))
    cut_ms = int(cut.timestamp() * 1000)
    rows = reader(spark, addr, subscribe="SrcTime", startingTimestamp=str(cut_ms)).collect()
    assert sorted(r.value for r in rows) == sorted(new)
    future = str(int(time.time() * 1000) + 3_600_000)  # after every message: nothing
    assert reader(spark, addr, subscribe="SrcTime", startingTimestamp=future).count() == 0

    got: list[bytes] = []
    q = (stream(spark, addr, subscribe="SrcTime", startingTimestamp=str(cut_ms))
         .writeStream.foreachBatch(lambda df, _id: got.extend(r.value for r in df.collect()))
         .trigger(availableNow=True).option("checkpointLocation", str(tmp_path / "ck")).start())
    q.awaitTermination(120)
    assert sorted(got) == sorted(new)


def test_include_headers_gives_user_properties(spark, lmq_cluster):
    addr = lmq_cluster["addr"]
    topic_with_queues(addr, "SrcHdr", 1)
    send_to_queues(addr, "SrcHdr", {0: 2})
    plain = reader(spark, addr, subscribe="SrcHdr")
    assert "headers" not in plain.columns
    rows = reader(spark, addr, subscribe="SrcHdr", includeHeaders="true").collect()
    by = {r.value: r for r in rows}
    headers = [(h.key, h.value) for h in by[b"v-0-1"].headers]
    assert headers == [("seq", b"1")]     # KEYS, TAGS, UNIQ_KEY... are not user headers
    assert by[b"v-0-1"].key == "k-0-1"


def test_commit_group_shows_the_query_lag(spark, lmq_cluster, tmp_path):
    from core.client.blocking import BlockingClient

    addr = lmq_cluster["addr"]
    topic_with_queues(addr, "SrcGroup", 2)
    send_to_queues(addr, "SrcGroup", {0: 5, 1: 3})

    def run():
        q = (stream(spark, addr, subscribe="SrcGroup", startingOffsets="earliest",
                    commitGroup="CG_SPARK_LAG")
             .writeStream.foreachBatch(lambda df, _id: df.count()).trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "ck")).start())
        q.awaitTermination(120)

    def progress():
        with BlockingClient(addr) as c:
            rows = c.admin().consumer_progress("CG_SPARK_LAG")
        return {r["queueId"]: (r["consumerOffset"], r["lag"]) for r in rows
                if r["topic"] == "SrcGroup"}

    run()
    assert progress() == {0: (5, 0), 1: (3, 0)}
    send_to_queues(addr, "SrcGroup", {0: 4})
    assert progress() == {0: (5, 4), 1: (3, 0)}
    run()
    assert progress() == {0: (9, 0), 1: (3, 0)}
