"""`lmq bench spark`: one small run in the test session's Spark (slow tier)."""

from __future__ import annotations

import argparse

import pytest

pytestmark = pytest.mark.slow


def test_bench_run_reads_and_writes_the_rows_it_counts(spark, lmq_cluster):
    from lmq.bench import spark as bench_spark
    from lmq.bench._spark_synth import SynthSource

    addr = lmq_cluster["addr"]
    args = argparse.Namespace(messages=300, sink_rows=200, size=64, queues=2)
    bench_spark._fill(addr, args.messages, args.size, args.queues)
    spark.dataSource.register(SynthSource)
    res = bench_spark._one_run(spark, addr, args)
    assert all(v > 0 for v in res.values())
    src = spark.read.format("lmq").option("lmq.namesrv", addr) \
        .option("subscribe", bench_spark.TOPIC).load()
    assert src.count() == 300 and src.selectExpr("min(length(value))").first()[0] == 64
    assert spark.read.format("lmqbench_synth").option("rows", "300").load().count() == 300
    written = spark.read.format("lmq").option("lmq.namesrv", addr) \
        .option("subscribe", bench_spark.SINK_TOPIC).load().count()
    assert written == 200                 # the sink phase committed every row, once
