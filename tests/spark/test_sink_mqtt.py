"""The sink's `mqttTopic` column: rows stored as the MQTT gateway stores a PUBLISH and
multi-dispatched into the LMQs of the matching MQTT routes of the shared routing table
(slow tier: a real Spark session and a real broker)."""

from __future__ import annotations

import pytest

from tests.spark.conftest import topic_with_queues

pytestmark = pytest.mark.slow


def add_mqtt_route(addr: str, broker: str, topic_filter: str) -> str:
    """Append an ``mqtt`` route (filter -> its LMQ) to the route log as a gateway's
    SUBSCRIBE does; the LMQ name."""
    from core.client.blocking import BlockingClient
    from gateway.routing import lmq_names
    from gateway.routing.route_log import RouteLog
    from gateway.routing.route_table import LogEntry, Route

    lmq = lmq_names.encode(lmq_names.MQTT, topic_filter).topic

    async def add(instance):
        log = RouteLog(instance, broker, "broker-a", "gw-test")
        await log.ensure_topics()
        await log._send(log.config.log_topic, LogEntry("add", Route("mqtt", topic_filter, lmq)).encode())

    with BlockingClient(addr) as c:
        c.call(add, c.instance)
    return lmq


def lmq_bodies(addr: str, lmq: str) -> list[bytes]:
    """Bodies indexed into the LMQ `lmq` (queue 0 on broker-a), in order."""
    from core.client.blocking import BlockingClient
    from core.client.model import MessageQueue, PullStatus

    with BlockingClient(addr) as c:
        c.call(c.instance.update_route, "MQTT_MESSAGES")   # learn broker-a's address
        res = c.pull_consumer("CG_T").pull(MessageQueue(lmq, "broker-a", 0), None, 0, 32)
        return [m.body for m in res.messages] if res.status is PullStatus.FOUND else []


def test_mqtt_rows_reach_the_lmqs_of_matching_routes(spark, dispatch_cluster):
    addr, broker = dispatch_cluster["addr"], dispatch_cluster["broker"]
    topic_with_queues(addr, "PlainOut", 1)
    alerts = add_mqtt_route(addr, broker, "alerts/+")
    d1 = add_mqtt_route(addr, broker, "alerts/d1")
    rows = [(b"hot-1", "alerts/d1", 1, False, "k1"), (b"hot-2", "alerts/d2", 0, True, "k2"),
            (b"nobody", "other/x", 2, False, None), (b"plain", None, None, None, None)]
    df = spark.createDataFrame(rows, "value binary, mqttTopic string, qos int, retain boolean, "
                                     "key string")
    df.coalesce(1).write.format("lmq").option("lmq.namesrv", addr) \
        .option("topic", "PlainOut").mode("append").save()

    # subscribers of the matching filters: their LMQs got exactly the matching rows
    assert lmq_bodies(addr, alerts) == [b"hot-1", b"hot-2"]
    assert lmq_bodies(addr, d1) == [b"hot-1"]
    # stored as MQTT traffic: the source's MQTT view (and any native reader) sees it
    back = (spark.read.format("lmq").option("lmq.namesrv", addr)
            .option("mqttTopic", "#").load()
            .select("value", "mqttTopic", "qos", "retain", "key", "topic").collect())
    assert sorted(tuple(r) for r in back) == [
        (b"hot-1", "alerts/d1", 1, False, "k1", "MQTT_MESSAGES"),
        (b"hot-2", "alerts/d2", 0, True, "k2", "MQTT_MESSAGES"),
        (b"nobody", "other/x", 2, False, None, "MQTT_MESSAGES")]
    plain = spark.read.format("lmq").option("lmq.namesrv", addr) \
        .option("subscribe", "PlainOut").load().select("value", "mqttTopic").collect()
    assert [tuple(r) for r in plain] == [(b"plain", None)]


def test_a_route_added_later_is_seen_by_the_next_write(spark, dispatch_cluster):
    addr, broker = dispatch_cluster["addr"], dispatch_cluster["broker"]
    df = spark.createDataFrame([(b"r1", "late/a")], "value binary, mqttTopic string")

    def write():
        df.write.format("lmq").option("lmq.namesrv", addr).mode("append").save()

    write()                                    # no route yet: stored, dispatched nowhere
    lmq = add_mqtt_route(addr, broker, "late/#")
    write()
    assert lmq_bodies(addr, lmq) == [b"r1"]


def test_bad_mqtt_columns_are_refused(spark, dispatch_cluster):
    addr = dispatch_cluster["addr"]
    for ddl, row, match in (
            ("value binary, mqttTopic string", (b"x", "a/+"), "invalid MQTT topic name"),
            ("value binary, mqttTopic string, qos int", (b"x", "a/b", 3), "0, 1 or 2"),
    ):
        df = spark.createDataFrame([row], ddl)
        with pytest.raises(Exception, match=match):
            df.write.format("lmq").option("lmq.namesrv", addr).mode("append").save()
    with pytest.raises(Exception, match="need an 'mqttTopic' column"):
        spark.createDataFrame([(b"x", 1)], "value binary, qos int").write.format("lmq") \
            .option("lmq.namesrv", addr).option("topic", "T").mode("append").save()
