"""The source's `amqpQueue` option: an AMQP queue is an LMQ, read like a one-queue topic per
broker (slow tier: a real Spark session and a real broker)."""

from __future__ import annotations

import pytest

from tests.spark.conftest import topic_with_queues

pytestmark = pytest.mark.slow


def publish_to_queue(addr: str, queue: str, bodies: list[bytes], also: str | None = None):
    """Store each body once on a topic, indexed into the queue's LMQ (and `also`'s)."""
    from core.client import Message
    from core.client.blocking import BlockingClient
    from core.common.properties import MessageConst
    from gateway.routing import lmq_names

    lmqs = [lmq_names.encode(lmq_names.AMQP, q).topic for q in (queue, also) if q]
    with BlockingClient(addr) as c, c.producer("PG_AMQP_T") as p:
        for body in bodies:
            m = Message("AmqpStoreT", body)
            m.properties[MessageConst.INNER_MULTI_DISPATCH] = ",".join(lmqs)
            p.send(m)


def test_amqp_queue_batch_and_stream(spark, dispatch_cluster, tmp_path):
    addr = dispatch_cluster["addr"]
    topic_with_queues(addr, "AmqpStoreT", 2)
    publish_to_queue(addr, "other", [b"x0", b"x1"])
    publish_to_queue(addr, "orders", [f"o{i}".encode() for i in range(5)], also="other")
    df = (spark.read.format("lmq").option("lmq.namesrv", addr).option("amqpQueue", "orders")
          .load().select("value", "topic", "queueId", "queueOffset").collect())
    assert sorted((r.value, r.queueOffset) for r in df) == [(f"o{i}".encode(), i)
                                                            for i in range(5)]
    assert {(r.topic, r.queueId) for r in df} == {("%LMQ%a_orders", 0)}
    other = spark.read.format("lmq").option("lmq.namesrv", addr) \
        .option("amqpQueue", "other").option("startingOffsets", '{"%LMQ%a_other": {"0": 2}}') \
        .load().select("value").collect()
    assert sorted(r.value for r in other) == [f"o{i}".encode() for i in range(5)]

    # streaming, availableNow, 2 rows per trigger: every row once
    q = (spark.readStream.format("lmq").option("lmq.namesrv", addr)
         .option("amqpQueue", "orders").option("startingOffsets", "earliest")
         .option("maxOffsetsPerTrigger", "2").load().select("value")
         .writeStream.format("memory").queryName("amqp_orders")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert sorted(r.value for r in spark.sql("select * from amqp_orders").collect()) == \
        [f"o{i}".encode() for i in range(5)]
    assert len(q.recentProgress) >= 3


def test_amqp_queue_option_errors(spark, dispatch_cluster):
    addr = dispatch_cluster["addr"]
    for extra, match in ((("subscribe", "T"), "excludes"), (("mqttTopic", "a/#"), "excludes")):
        with pytest.raises(Exception, match=match):
            spark.read.format("lmq").option("lmq.namesrv", addr).option("amqpQueue", "q") \
                .option(*extra).load().collect()
    with pytest.raises(Exception, match="1..255 bytes"):
        spark.read.format("lmq").option("lmq.namesrv", addr).option("amqpQueue", "q" * 256) \
            .load().collect()
