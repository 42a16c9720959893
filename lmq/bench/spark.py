"""`lmq bench spark`: rows/s of the Spark connector, each beside its ceiling in the same run.

Source: a batch read of ``--messages`` messages (``--size`` B bodies on ``--queues``
queues) with ``format("lmq")`` into Spark's no-op sink, beside a synthetic in-memory Python
data source that yields the same rows (same schema, same partitions, Arrow batches of the
same size) into the same no-op sink: the ceiling of any Python source in this Spark on this
machine. The issue's target is source >= 0.5 x that ceiling.

Sink: ``--sink-rows`` rows of ``--size`` B values written with ``df.write.format("lmq")``
(batched half messages, then the job's commit), beside the same rows written to a Python
Arrow data source writer that drops them: the ceiling of any Python sink. Rates are medians of
``--runs`` runs; each run's time is the whole Spark job (planning included).

    lmq bench spark                          # local[2], an `lmq serve` child process
    lmq bench spark --quick --json           # smoke run
    lmq bench spark --master 'local[*]' --messages 100000 --runs 5
    lmq bench spark --latency 60             # publish-to-alert time of `lmq demo iot`, by stage
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from lmq.bench._client_common import median_of, ratio, report, server_under_test

REPO = Path(__file__).resolve().parents[1]
TOPIC = "BenchSparkSource"
SINK_TOPIC = "BenchSparkSink"


def add_arguments(parser) -> None:
    parser.add_argument("-n", "--namesrv-addr",
                        help="cluster to measure (default: start `lmq serve` in a temp dir)")
    parser.add_argument("-m", "--messages", type=int, default=40000, help="source rows per run")
    parser.add_argument("--sink-rows", type=int, default=100000, help="sink rows per run")
    parser.add_argument("-s", "--size", type=int, default=256, help="value bytes")
    parser.add_argument("--queues", type=int, default=4, help="queues of the source topic")
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument("--runs", type=int, default=None, help="runs per phase (default 3, --quick 1)")
    parser.add_argument("--quick", action="store_true", help="smoke run (for tests, not figures)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    lat = parser.add_argument_group("latency (--latency): the `lmq demo iot` pipeline's "
                                    "publish-to-alert time by stage")
    lat.add_argument("--latency", type=float, metavar="SECONDS", default=None,
                     help="measure the alert latency instead, rounds of this many seconds")
    lat.add_argument("--devices", type=int, default=5, help="simulated devices (default 5)")
    lat.add_argument("--rate", type=float, default=2.0, help="readings/s per device (default 2)")
    lat.add_argument("--threshold", type=float, default=24.0,
                     help="alert above this temperature (default 24: ~1/3 of the readings)")
    lat.add_argument("--trigger", type=float, default=1.0, help="micro-batch interval, s")
    lat.add_argument("--warmup", type=float, default=20.0,
                     help="seconds of a first round that is not counted (default 20)")


def _spark(master: str):
    from pyspark.sql import SparkSession

    from spark_sinks import register

    # Spark's Python workers must import this checkout's packages.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.master(master).appName("lmq-bench-spark")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    from lmq.bench._spark_synth import SynthSource
    spark.dataSource.register(SynthSource)
    return spark


def _fill(addr: str, messages: int, size: int, queues: int) -> None:
    """`messages` bodies of `size` bytes spread over the queues (batched sends)."""
    from core.client import Message, MessageQueue
    from core.client.blocking import BlockingClient

    with BlockingClient(addr) as c:
        c.admin().topic_create(TOPIC, read_queue_nums=queues, write_queue_nums=queues)
        c.admin().topic_create(SINK_TOPIC, read_queue_nums=queues, write_queue_nums=queues)
        broker = c.admin().topic_route(TOPIC).queue_datas[0].broker_name
        with c.producer("PG_BENCH_SPARK") as p:
            sent = 0
            while sent < messages:
                n = min(32, messages - sent)
                q = (sent // 32) % queues
                p.send_batch([Message(TOPIC, os.urandom(size)) for _ in range(n)],
                             mq=MessageQueue(TOPIC, broker, q))
                sent += n


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _one_run(spark, addr: str, args) -> dict[str, Any]:
    from pyspark.sql import functions as F

    src = spark.read.format("lmq").option("lmq.namesrv", addr).option("subscribe", TOPIC).load()
    t_src = _timed(lambda: src.write.format("noop").mode("overwrite").save())
    synth = (spark.read.format("lmqbench_synth").option("rows", str(args.messages))
             .option("partitions", str(args.queues)).option("size", str(args.size)).load())
    t_synth = _timed(lambda: synth.write.format("noop").mode("overwrite").save())

    rows = (spark.range(args.sink_rows, numPartitions=2)
            .select(F.expr(f"CAST(repeat('x', {args.size}) AS BINARY)").alias("value"))).cache()
    rows.count()
    t_sink = _timed(lambda: rows.write.format("lmq").option("lmq.namesrv", addr)
                    .option("topic", SINK_TOPIC).mode("append").save())
    t_drop = _timed(lambda: rows.write.format("lmqbench_synth").mode("append").save())
    rows.unpersist()
    return {"source_rows_per_s": args.messages / t_src,
            "source_ceiling_rows_per_s": args.messages / t_synth,
            "sink_rows_per_s": args.sink_rows / t_sink,
            "sink_ceiling_rows_per_s": args.sink_rows / t_drop}


def run(args) -> int:
    if args.quick:
        args.messages, args.sink_rows, args.runs = min(args.messages, 2000), \
            min(args.sink_rows, 2000), args.runs or 1
    args.runs = args.runs or 3
    if min(args.messages, args.sink_rows, args.size, args.queues, args.runs) < 1:
        print("lmq bench spark: --messages, --sink-rows, --size, --queues and --runs must be positive")
        return 2
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print("lmq bench spark: needs the spark extra (pip install -e '.[spark]') and Java 17")
        return 2
    if args.latency is not None:
        if args.latency <= 0 or args.devices < 1 or args.rate <= 0 or args.trigger <= 0:
            print("lmq bench spark: --latency, --devices, --rate and --trigger must be positive")
            return 2
        from lmq.bench._spark_latency import run_latency
        return run_latency(args)
    with server_under_test(args.namesrv_addr) as addr:
        _fill(addr, args.messages, args.size, args.queues)
        spark = _spark(args.master)
        try:
            _one_run(spark, addr, args)                   # warm-up: JVM, workers, connections
            runs = [_one_run(spark, addr, args) for _ in range(args.runs)]
        finally:
            spark.stop()
    result = median_of(runs, ("source_rows_per_s", "source_ceiling_rows_per_s",
                              "sink_rows_per_s", "sink_ceiling_rows_per_s"))
    result.update(master=args.master, messages=args.messages, sink_rows=args.sink_rows,
                  size=args.size, queues=args.queues, runs=args.runs,
                  load_average=os.getloadavg()[0], cpus=os.cpu_count(),
                  source_ratio=ratio(result["source_rows_per_s"], result["source_ceiling_rows_per_s"]),
                  sink_ratio=ratio(result["sink_rows_per_s"], result["sink_ceiling_rows_per_s"]))
    report(result, args.json, [
        ("setup", f"{args.master}, {args.size} B values, {args.queues} queues, median of "
                  f"{args.runs} run(s) after a warm-up; load average {result['load_average']:.1f} "
                  f"on {result['cpus']} CPUs"),
        ("source", f"{result['source_rows_per_s']:,.0f} rows/s ({args.messages:,} rows, "
                   "format('lmq') batch read into the noop sink)"),
        ("source ceiling", f"{result['source_ceiling_rows_per_s']:,.0f} rows/s (synthetic "
                           "in-memory Python source, same rows, same partitions)"),
        ("source ratio", f"{result['source_ratio']:.2f} x ceiling"),
        ("sink", f"{result['sink_rows_per_s']:,.0f} rows/s ({args.sink_rows:,} rows, "
                 "format('lmq') batch write: batched halves + commit)"),
        ("sink ceiling", f"{result['sink_ceiling_rows_per_s']:,.0f} rows/s (Python Arrow "
                         "writer that drops the same rows)"),
        ("sink ratio", f"{result['sink_ratio']:.2f} x ceiling"),
    ])
    return 0
