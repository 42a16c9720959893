"""`spark.read/readStream.format("lmq")` against a real broker (slow tier: real Spark)."""

from __future__ import annotations

import json
import os

import pytest

from tests.spark.conftest import reader, send_to_queues, topic_with_queues

pytestmark = pytest.mark.slow


def test_batch_read_rows_and_columns(spark, lmq_cluster):
    addr = lmq_cluster["addr"]
    topic_with_queues(addr, "SrcBatch", 2)
    sent = send_to_queues(addr, "SrcBatch", {0: 3, 1: 2})
    rows = reader(spark, addr, subscribe="SrcBatch").collect()
    assert sorted(r.value for r in rows) == sorted(sent)
    by_value = {r.value: r for r in rows}
    r = by_value[b"v-0-2"]
    assert (r.topic, r.queueId, r.queueOffset, r.brokerName) == ("SrcBatch", 0, 2, "broker-a")
    assert (r.key, r.tags, r.properties["seq"]) == ("k-0-2", "t0", "2")
    assert r.msgId and r.timestamp is not None and r.bornTimestamp is not None
    assert "MAX_OFFSET" not in r.properties  # added by pulls, not part of the message
    assert r.mqttTopic is None and r.qos is None and r.retain is None


def test_batch_offset_ranges_per_queue(spark, lmq_cluster):
    addr = lmq_cluster["addr"]
    topic_with_queues(addr, "SrcRange", 2)
    send_to_queues(addr, "SrcRange", {0: 4, 1: 4})
    rows = reader(spark, addr, subscribe="SrcRange",
                  startingOffsets=json.dumps({"SrcRange": {"broker-a/0": 1, "1": 3}}),
                  endingOffsets=json.dumps({"SrcRange": {"0": 3}})).collect()
    got = sorted((r.queueId, r.queueOffset) for r in rows)
    assert got == [(0, 1), (0, 2), (1, 3)]


@pytest.mark.parametrize("opts, named", [
    ({"subscribe": "T", "startingOffset": "earliest"}, "startingOffset"),
    ({"subscribe": "T", "startingOffsets": "oldest"}, "startingOffsets"),
    ({"subscribe": "T", "maxOffsetsPerTrigger": "-3"}, "maxOffsetsPerTrigger"),
    ({"startingOffsets": "earliest"}, "subscribe"),
    ({"subscribe": "T", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
    ({"mqttTopic": "a/#/b"}, "mqttTopic"),
])
def test_bad_option_is_a_clear_error(spark, lmq_cluster, opts, named):
    with pytest.raises(Exception, match=f"(?i)option '{named}'"):
        reader(spark, lmq_cluster["addr"], **opts).collect()


def _stream(spark, addr, topic, **opts):
    r = (spark.readStream.format("lmq").option("lmq.namesrv", addr)
         .option("subscribe", topic).option("startingOffsets", "earliest"))
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def test_stream_caps_each_trigger_in_proportion_to_backlog(spark, lmq_cluster, tmp_path):
    addr = lmq_cluster["addr"]
    topic_with_queues(addr, "SrcCap", 4)
    sent = send_to_queues(addr, "SrcCap", {0: 30, 1: 10})
    batches: list[list[tuple[int, int]]] = []

    def collect(df, batch_id):
        batches.append([(r.queueId, r.queueOffset) for r in df.select("queueId", "queueOffset").collect()])

    q = (_stream(spark, addr, "SrcCap", maxOffsetsPerTrigger="8").writeStream
         .foreachBatch(collect).trigger(availableNow=True)
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    q.awaitTermination(120)
    batches = [b for b in batches if b]
    seen = [x for b in batches for x in b]
    assert len(seen) == len(sent) == len(set(seen))        # every message once
    assert all(len(b) <= 8 for b in batches)
    first = batches[0]
    # 30:10 backlog -> 6 from queue 0 and 2 from queue 1 in the first trigger
    assert sorted(first) == [(0, i) for i in range(6)] + [(1, 0), (1, 1)]


def test_stream_restart_from_checkpoint_reads_each_message_once(spark, lmq_cluster, tmp_path):
    addr = lmq_cluster["addr"]
    topic_with_queues(addr, "SrcRestart", 2)
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")

    def run():
        q = (_stream(spark, addr, "SrcRestart").selectExpr("CAST(value AS STRING) AS v")
             .writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", ck).trigger(availableNow=True).start())
        q.awaitTermination(120)

    first = send_to_queues(addr, "SrcRestart", {0: 5, 1: 5}, prefix="a")
    run()
    second = send_to_queues(addr, "SrcRestart", {0: 3, 1: 4}, prefix="b")
    run()
    got = [r.v for r in spark.read.parquet(out).collect()]
    assert sorted(got) == sorted(b.decode() for b in first + second)


def test_stream_starts_at_latest_by_default(spark, lmq_cluster, tmp_path):
    addr = lmq_cluster["addr"]
    topic_with_queues(addr, "SrcLatest", 1)
    send_to_queues(addr, "SrcLatest", {0: 3}, prefix="old")
    got: list[bytes] = []
    q = (spark.readStream.format("lmq").option("lmq.namesrv", addr)
         .option("subscribe", "SrcLatest").load().writeStream
         .foreachBatch(lambda df, _id: got.extend(r.value for r in df.collect()))
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        q.processAllAvailable()
        new = send_to_queues(addr, "SrcLatest", {0: 2}, prefix="new")
        q.processAllAvailable()
    finally:
        q.stop()
    assert sorted(got) == sorted(new)


@pytest.fixture(scope="module")
def mqtt_gateway(tmp_path_factory):
    """`lmq serve` (name server, broker and the MQTT gateway) as a child process."""
    from tests.gateway.mqtt.e2e_support import DEFAULT_TEST_CONFIG, Gateway

    gw = Gateway(tmp_path_factory.mktemp("gw"), DEFAULT_TEST_CONFIG).start()
    try:
        yield gw
    finally:
        gw.stop()


def test_mqtt_topic_filter_reads_matching_mqtt_traffic(spark, mqtt_gateway):
    from tests.gateway.mqtt.e2e_support import Client

    pub = Client(mqtt_gateway.port)
    pub.connect()
    try:
        pub.publish("devices/d1/telemetry", b"t1", qos=1)
        pub.publish("devices/d2/telemetry", b"t2", qos=1, retain=True)
        pub.publish("devices/d1/status", b"s1", qos=1)
        pub.publish("other/d1/telemetry", b"o1", qos=1)
    finally:
        pub.disconnect()
    rows = reader(spark, mqtt_gateway.namesrv_addr, mqttTopic="devices/+/telemetry").collect()
    got = sorted((r.mqttTopic, r.value, r.qos, r.retain, r.topic) for r in rows)
    assert got == [("devices/d1/telemetry", b"t1", 1, False, "MQTT_MESSAGES"),
                   ("devices/d2/telemetry", b"t2", 1, True, "MQTT_MESSAGES")]
    everything = reader(spark, mqtt_gateway.namesrv_addr, mqttTopic="#").collect()
    assert sorted(r.value for r in everything) == [b"o1", b"s1", b"t1", b"t2"]


@pytest.fixture(scope="module")
def small_files_cluster():
    """A broker with 64 KiB CommitLog files and 16-entry ConsumeQueue files, so that a
    retention pass can cut the start of a queue."""
    from tests.spark.conftest import start_cluster

    box, stop = start_cluster(commitlog_file_size=64 * 1024, consume_queue_units_per_file=16)
    yield box
    stop()


def cut_by_retention(box) -> None:
    import time

    import trio

    store = box["cluster"].brokers[0].store
    far_future = int(time.time() * 1000) + 10 * 365 * 86_400_000
    deleted = trio.from_thread.run_sync(store.clean_expired, far_future, trio_token=box["token"])
    assert deleted > 0


def test_fail_on_data_loss_both_ways(spark, small_files_cluster):
    box = small_files_cluster
    addr = box["addr"]
    topic_with_queues(addr, "SrcLoss", 1)
    from core.client import Message
    from core.client.blocking import BlockingClient

    with BlockingClient(addr) as c, c.producer("PG_LOSS") as p:
        for i in range(200):   # ~1 KiB each: several CommitLog files
            p.send(Message("SrcLoss", f"{i:04d}".encode() + b"x" * 1000))
    cut_by_retention(box)
    from_zero = json.dumps({"SrcLoss": {"0": 0}})
    with pytest.raises(Exception, match="failOnDataLoss"):
        reader(spark, addr, subscribe="SrcLoss", startingOffsets=from_zero).collect()
    rows = reader(spark, addr, subscribe="SrcLoss", startingOffsets=from_zero,
                  failOnDataLoss="false").collect()
    offsets = sorted(r.queueOffset for r in rows)
    assert 0 < offsets[0] and offsets == list(range(offsets[0], 200))
    assert all(r.value[:4] == f"{r.queueOffset:04d}".encode() for r in rows)


def test_reads_past_short_pulls_in_order(lmq_cluster):
    """Bodies large enough that a pull returns fewer messages than it asked for (the
    broker's max_pull_bytes): the pulls kept in flight for the following offsets are dropped
    and the range is still read whole, in order, each message once."""
    from core.client import Message, MessageQueue
    from core.client.blocking import BlockingClient
    from spark_sinks.options import parse_source_options
    from spark_sinks.source import QueueRange, read_range

    addr = lmq_cluster["addr"]
    topic_with_queues(addr, "SrcBig", 1)
    bodies = [os.urandom(100_000) for _ in range(40)]   # incompressible: 2 per 256 KiB pull
    with BlockingClient(addr) as c, c.producer("PG_SRC_BIG") as p:
        for body in bodies:
            p.send_to_queue(Message("SrcBig", body), MessageQueue("SrcBig", "broker-a", 0))
    opts = parse_source_options({"lmq.namesrv": addr, "subscribe": "SrcBig"}, streaming=False)
    got = []
    for rb in read_range(opts, QueueRange("SrcBig", "broker-a", 0, 0, 40)):
        got.extend(zip(rb.column("queueOffset").to_pylist(), rb.column("value").to_pylist(),
                       strict=True))
    assert got == list(enumerate(bodies))
