"""The Spark source and sink across a kill -9 of a master (issue 14; docs/spark.md, "When
a broker fails"): real processes, a controller-mode pair of one broker name
(SYNC_MASTER), the writer and reader methods Spark calls driven in this process.

- A micro-batch whose chunks (half messages) were sent to the old master is committed
  after the failover: its END_TRANSACTIONs go to the new master and its rows become
  visible exactly once; the next batch is written to the new master.
- Ranges planned before the kill are read after it, every row once.
Without the retries both fail with a connection error on the dead address.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.types import StringType, StructField, StructType

from spark_sinks.options import parse_source_options
from spark_sinks.sink import LmqBatchWriter, LmqStreamWriter, parse_sink_options
from spark_sinks.source import make_partitions, queue_bounds, read_range, resolve
from tests.core.broker.harness import wait_until
from tests.core.ha.process_cluster import TOPIC, started
from tests.spark.conftest import visible

pytestmark = pytest.mark.slow

SCHEMA = StructType([StructField("value", StringType())])


def _rows(prefix: str, n: int):
    return [pa.RecordBatch.from_pydict({"value": [f"{prefix}{i}" for i in range(n)]})]


def _opts(ns: str, timeout: str, **more) -> dict:
    # Each request timeout is a client of its own in this process (spark_sinks.conn), as
    # each Spark worker has: one that knew only the old master is what this is about.
    return {"lmq.namesrv": ns, "lmq.requestTimeout": timeout, **more}


def test_sink_commits_and_source_reads_across_a_failover(tmp_path):
    c = started(tmp_path)
    try:
        ns = c.ns_addr
        # (A sink's producer group belongs to one client: one group per client here.)
        stream = LmqStreamWriter(parse_sink_options(_opts(ns, "10", topic=TOPIC,
                                                          **{"lmq.queryId": "q-fo"})), SCHEMA)
        batch_b = LmqBatchWriter(parse_sink_options(_opts(
            ns, "8", topic=TOPIC, **{"lmq.producerGroup": "PG_B"})), SCHEMA)
        batch_c = LmqBatchWriter(parse_sink_options(_opts(
            ns, "6", topic=TOPIC, **{"lmq.producerGroup": "PG_C"})), SCHEMA)
        stream.commit([stream.write(iter(_rows("a", 40)))], 0)
        pending = batch_b.write(iter(_rows("b", 40)))  # halves on the old master
        batch_c.abort([batch_c.write(iter(_rows("x", 5)))])  # its client: old master
        src = parse_source_options(_opts(ns, "7", subscribe=TOPIC), False)
        bounds = queue_bounds(src)  # the source's client knows the old master only
        parts = make_partitions(resolve(-2, bounds, -2), resolve(-1, bounds, -1))
        old, slave = c.master_and_slave()
        old.kill()
        wait_until(lambda: c.master() is slave, 30, what="the slave elected")

        batch_b.commit([pending])  # END_TRANSACTION to the new master
        batch_c.commit([batch_c.write(iter(_rows("c", 40)))])  # chunks to the new master
        stream.commit([stream.write(iter(_rows("d", 40)))], 1)
        want = sorted(f"{p}{i}".encode() for p in "abcd" for i in range(40))
        assert visible(ns, TOPIC) == want

        got = []
        for part in parts:
            for rb in read_range(src, part):
                got += rb.column(rb.schema.get_field_index("value")).to_pylist()
        assert sorted(got) == sorted(f"a{i}".encode() for i in range(40))
    finally:
        c.close()
