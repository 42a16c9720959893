"""A real Spark streaming query (lmq source -> lmq sink, exactly once) keeps going when the
master of its broker name is killed -9 (controller mode, SYNC_MASTER; docs/ha.md): rows
sent before and after the failover all arrive in the output topic, each once."""

from __future__ import annotations

import time

import pytest

from core.client import Message
from core.client.blocking import BlockingClient
from tests.core.broker.harness import create_topic, has_topic, wait_until
from tests.core.ha.process_cluster import TOPIC, started
from tests.spark.conftest import visible

pytestmark = pytest.mark.slow

OUT = "FailoverStreamOut"


def _send(ns: str, prefix: str, n: int) -> None:
    with BlockingClient(ns) as c, c.producer("PG_FAILOVER_STREAM") as p:
        for i in range(n):
            p.send(Message(TOPIC, f"{prefix}{i}".encode()))


def test_streaming_query_keeps_going_across_a_master_kill(tmp_path, spark):
    c = started(tmp_path)
    try:
        ns = c.ns_addr
        old, slave = c.master_and_slave()
        create_topic(old.broker_addr, OUT)
        wait_until(lambda: has_topic(slave.broker_addr, OUT), 30, what="output topic on the slave")
        _send(ns, "a", 20)
        q = (spark.readStream.format("lmq").option("lmq.namesrv", ns).option("subscribe", TOPIC)
             .option("startingOffsets", "earliest").load().select("value")
             .writeStream.format("lmq").option("lmq.namesrv", ns).option("topic", OUT)
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(processingTime="1 second").start())
        try:
            want_a = sorted(f"a{i}".encode() for i in range(20))
            wait_until(lambda: visible(ns, OUT) == want_a, 120, what="the first rows copied")
            old.kill()
            wait_until(lambda: c.master() is slave, 30, what="the slave elected")
            _send(ns, "b", 20)
            want = sorted(want_a + [f"b{i}".encode() for i in range(20)])
            deadline = time.monotonic() + 120
            while visible(ns, OUT) != want and time.monotonic() < deadline:
                assert q.exception() is None, q.exception()
                time.sleep(1)
            assert visible(ns, OUT) == want           # every row once, none lost, none repeated
            assert q.isActive and q.exception() is None
        finally:
            q.stop()
    finally:
        c.close()
