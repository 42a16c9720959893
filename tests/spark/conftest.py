"""Fixtures of the Spark tests: a real name server + broker on free ports (served from a
background thread: Spark's Python workers reach it over TCP) and one small local Spark
session per test module."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark")

from tests.core.client.cluster import start_cluster  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lmq_cluster():
    box, stop = start_cluster()
    yield box
    stop()


@pytest.fixture(scope="module")
def dispatch_cluster():
    """lmq_cluster whose broker lets plain clients set INNER_MULTI_DISPATCH, as the sink's
    mqttTopic column and the tests' AMQP-queue producer do (an ACL account with
    innerProperties, or this switch on a closed network)."""
    box, stop = start_cluster(allow_inner_properties_without_acl=True)
    yield box
    stop()


def make_spark(app: str, master: str = "local[2]"):
    from pyspark.sql import SparkSession

    from spark_sinks import register

    # Spark's Python workers must import this worktree's packages.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.master(master).appName(app)
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.memory", "512m")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


@pytest.fixture(scope="session")
def spark():
    """One Spark session (one JVM) for the whole Spark tier: starting it is the tier's
    largest fixed cost."""
    s = make_spark("lmq-tests")
    yield s
    s.stop()


def _source(read, addr: str, opts: dict):
    r = read.format("lmq").option("lmq.namesrv", addr)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def reader(spark, addr: str, **opts):
    """The lmq batch source on the name server `addr`, with `opts`."""
    return _source(spark.read, addr, opts)


def stream(spark, addr: str, **opts):
    """The lmq streaming source on the name server `addr`, with `opts`."""
    return _source(spark.readStream, addr, opts)


def topic_with_queues(addr: str, topic: str, queues: int = 4) -> None:
    from core.client.blocking import BlockingClient

    with BlockingClient(addr) as c:
        c.admin().topic_create(topic, read_queue_nums=queues, write_queue_nums=queues)


def visible(addr: str, topic: str, group: str = "CG_SINK_CHECK") -> list[bytes]:
    """Bodies consumers can see in `topic` (all queues, from offset 0), sorted."""
    from core.client.blocking import BlockingClient
    from core.client.model import PullStatus

    out = []
    with BlockingClient(addr) as c:
        pc = c.pull_consumer(group)
        for mq in pc.fetch_subscribe_message_queues(topic):
            off = 0
            while True:
                res = pc.pull(mq, None, off, 32)
                if res.status is not PullStatus.FOUND:
                    break
                out.extend(m.body for m in res.messages)
                off = res.next_begin_offset
    return sorted(out)


def send_to_queues(addr: str, topic: str, counts: dict[int, int], prefix: str = "v",
                   broker: str = "broker-a") -> list[bytes]:
    """Send counts[q] messages to queue q of `topic`; the bodies, in send order."""
    from core.client import Message, MessageQueue
    from core.client.blocking import BlockingClient

    bodies = []
    with BlockingClient(addr) as c, c.producer("PG_SPARK_TEST") as p:
        for q, n in counts.items():
            for i in range(n):
                body = f"{prefix}-{q}-{i}".encode()
                m = Message(topic, body)
                m.keys = [f"k-{q}-{i}"]
                m.tags = f"t{q}"
                m.properties["seq"] = str(i)
                p.send_to_queue(m, MessageQueue(topic, broker, q))
                bodies.append(body)
    return bodies
