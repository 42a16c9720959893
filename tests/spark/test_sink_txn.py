"""The sink's exactly-once protocol driven directly (the writer methods Spark calls, in
this process, against a real broker): crashes before and after the commit record."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.types import StringType, StructField, StructType

from spark_sinks.conn import client_for
from spark_sinks.options import LmqOptionError
from spark_sinks.sink import LmqStreamWriter, _producer, parse_sink_options
from spark_sinks.txn import write_record
from tests.spark.conftest import topic_with_queues, visible

SCHEMA = StructType([StructField("value", StringType()), StructField("key", StringType())])


def writer(addr, topic, query="q-test"):
    return LmqStreamWriter(parse_sink_options({"lmq.namesrv": addr, "topic": topic,
                                               "lmq.queryId": query}), SCHEMA)


def rows(prefix, n):
    """One Arrow record batch, as Spark hands them to the sink's tasks."""
    return [pa.RecordBatch.from_pydict({"value": [f"{prefix}{i}" for i in range(n)],
                                        "key": [f"k{i}" for i in range(n)]})]


def test_replayed_batch_after_crash_before_commit_is_written_once(lmq_cluster):
    addr = lmq_cluster["addr"]
    topic_with_queues(addr, "SinkCrash1", 2)
    first = writer(addr, "SinkCrash1", "q-crash1")
    lost = first.write(iter(rows("r", 5)))          # tasks wrote; the driver died here
    assert sum(c.count for c in lost.chunks) == 5 and visible(addr, "SinkCrash1") == []
    again = writer(addr, "SinkCrash1", "q-crash1")   # restarted query replays batch 0
    msg = again.write(iter(rows("r", 5)))
    again.commit([msg], 0)
    assert visible(addr, "SinkCrash1") == sorted(f"r{i}".encode() for i in range(5))
    again.commit([again.write(iter(rows("r", 5)))], 0)  # Spark replays it once more
    again.commit([again.write(iter(rows("s", 2)))], 1)
    assert visible(addr, "SinkCrash1") == sorted(
        [f"r{i}".encode() for i in range(5)] + [b"s0", b"s1"])


def test_crash_after_commit_record_before_end_transaction(lmq_cluster):
    addr = lmq_cluster["addr"]
    topic_with_queues(addr, "SinkCrash2", 2)
    first = writer(addr, "SinkCrash2", "q-crash2")
    msg = first.write(iter(rows("r", 4)))
    opts = first.opts
    client = client_for(addr, opts.request_timeout)
    # the driver stored the record, then died before END_TRANSACTION
    client.call(write_record, client.instance, _producer(opts).target, opts.commit_topic,
                "q-crash2", 0, msg.chunks)
    assert visible(addr, "SinkCrash2") == []
    again = writer(addr, "SinkCrash2", "q-crash2")
    again.commit([again.write(iter(rows("r", 4)))], 0)
    assert visible(addr, "SinkCrash2") == sorted(f"r{i}".encode() for i in range(4))


def test_abort_rolls_back(lmq_cluster):
    addr = lmq_cluster["addr"]
    topic_with_queues(addr, "SinkAbort", 1)
    w = writer(addr, "SinkAbort", "q-abort")
    w.abort([w.write(iter(rows("x", 3)))], 0)
    w.commit([w.write(iter(rows("y", 1)))], 0)
    assert visible(addr, "SinkAbort") == [b"y0"]


def test_sink_refuses_bad_columns_and_options(lmq_cluster):
    addr = lmq_cluster["addr"]
    with pytest.raises(LmqOptionError, match="'vaule'"):
        LmqStreamWriter(parse_sink_options({"lmq.namesrv": addr, "topic": "T", "lmq.queryId": "q"}),
                        StructType([StructField("vaule", StringType())]))
    with pytest.raises(LmqOptionError, match="option 'topik'"):
        parse_sink_options({"lmq.namesrv": addr, "topik": "T"})
    with pytest.raises(LmqOptionError, match="'topic'"):
        LmqStreamWriter(parse_sink_options({"lmq.namesrv": addr, "lmq.queryId": "q"}), SCHEMA)


def test_back_check_answers_from_the_commit_record(lmq_cluster):
    """The broker's back-check of a half nobody ended is answered from the batch's record:
    listed -> COMMIT, record without it -> ROLLBACK, no record yet -> UNKNOW."""
    from core.client.transaction import LocalTransactionState as S
    from core.common.message import MessageExt
    from spark_sinks.sink import _check_half

    addr = lmq_cluster["addr"]
    topic_with_queues(addr, "SinkCheck", 1)
    w = writer(addr, "SinkCheck", "q-check")
    listed = w.write(iter(rows("a", 1)))
    w.commit([listed], 7)
    client = client_for(addr, w.opts.request_timeout)

    def ask(uniq, batch):
        msg = MessageExt("SinkCheck", b"", properties={
            "SPARK_QUERY": "q-check", "SPARK_BATCH": str(batch), "UNIQ_KEY": uniq})
        return client.call(_check_half, client.instance, w.opts, msg)

    assert ask(listed.chunks[0].half_uniq, 7) is S.COMMIT_MESSAGE
    assert ask("0A0000000000000000000000000000FF", 7) is S.ROLLBACK_MESSAGE
    assert ask(listed.chunks[0].half_uniq, 8) is S.UNKNOW


def test_a_batch_without_rows_stores_no_commit_record(lmq_cluster):
    """An empty micro-batch (a trigger whose rows were all filtered out) costs no broker
    round trip at commit; a replay of it that does write rows commits them once."""
    from spark_sinks.txn import find_record

    addr = lmq_cluster["addr"]
    topic_with_queues(addr, "SinkEmpty", 1)
    w = writer(addr, "SinkEmpty", "q-empty")
    w.commit([w.write(iter([]))], 0)
    client = client_for(addr, w.opts.request_timeout)
    assert client.call(find_record, client.instance, w.opts.commit_topic, "q-empty", 0) is None
    w.commit([w.write(iter(rows("e", 2)))], 0)
    assert visible(addr, "SinkEmpty") == [b"e0", b"e1"]
