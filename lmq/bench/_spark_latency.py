"""`lmq bench spark --latency`: publish-to-alert latency of the `lmq demo iot` pipeline,
split into stages.

It runs the demo's own pipeline (an `lmq serve` child, the device simulator, the two Spark
queries, the MQTT alert subscriber; lmq/commands/demo.py) for ``--latency`` seconds per
round (after a warm-up round of ``--warmup`` seconds, not counted), with each alert
carrying its reading's store time and its micro-batch's timestamp.
Per alert (readings published once both queries ran their first micro-batch):

* publish -> stored: the reading's MQTT PUBLISH until the broker stored it;
* stored -> planned: until the alert query's micro-batch took it (the wait for the
  trigger, the source's latestOffset);
* planned -> committed: the micro-batch itself (the source's read, the msgpack decode,
  the filter, the sink's chunk and its commit), to the alert's store time;
* committed -> delivered: the MQTT gateway's delivery to the ``alerts/#`` subscriber;
* publish -> delivered: the whole way (the issue's target: p50 < 3 s at a 1 s trigger).

Beside them, from Spark's progress events, the median micro-batch duration of each query
and the median of its phases (latestOffset, queryPlanning, walCommit, addBatch,
commitOffsets). Figures are medians over ``--runs`` rounds of each round's p50 / p90.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

STAGES = (("publish_to_stored", "ts", "stored"), ("stored_to_planned", "stored", "planned"),
          ("planned_to_committed", "planned", "committed"),
          ("committed_to_delivered", "committed", "delivered"),
          ("publish_to_delivered", "ts", "delivered"))
PHASES = ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets",
          "triggerExecution")


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


class _Batches:
    """Spark progress events of the demo's two queries (a StreamingQueryListener)."""

    def __init__(self) -> None:
        from pyspark.sql.streaming import StreamingQueryListener

        self.events: list[dict] = []
        outer = self

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event) -> None:
                pass

            def onQueryProgress(self, event) -> None:
                p = event.progress
                outer.events.append({"name": p.name, "rows": p.numInputRows,
                                     "at_ms": int(time.time() * 1000),
                                     "durations": dict(p.durationMs)})

            def onQueryIdle(self, event) -> None:
                pass

            def onQueryTerminated(self, event) -> None:
                pass

        self.listener = Listener()

    def warm_ms(self) -> int:
        """When both queries had finished a micro-batch (epoch ms)."""
        firsts = {}
        for e in self.events:
            firsts.setdefault(e["name"], e["at_ms"])
        return max(firsts.values()) if len(firsts) >= 2 else 2**62

    def summary(self, skip_first: int = 1) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for name in sorted({e["name"] for e in self.events}):
            mine = [e for e in self.events if e["name"] == name and e["rows"]][skip_first:]
            if mine:
                out[name] = {ph: statistics.median(e["durations"].get(ph, 0) for e in mine)
                             for ph in PHASES}
                out[name]["batches"] = len(mine)
        return out


def _committed(spark, namesrv: str) -> dict[tuple[str, int], int]:
    """(device, reading ts) -> the alert's store time (the sink's commit), epoch ms."""
    from pyspark.sql import functions as F

    rows = (spark.read.format("lmq").option("lmq.namesrv", namesrv)
            .option("mqttTopic", "alerts/+").load()
            .select(F.col("key"), F.unix_millis("timestamp").alias("at"),
                    F.get_json_object(F.col("value").cast("string"), "$.ts").cast("long")
                    .alias("ts")).collect())
    return {(r.key, r.ts): r.at for r in rows}


def _one_round(spark, args, seconds: float) -> dict[str, Any]:
    from lmq.commands import demo

    out = Path(tempfile.mkdtemp(prefix="lmq-bench-spark-lat-"))
    ns = argparse.Namespace(devices=args.devices, rate=args.rate, duration=seconds,
                            threshold=args.threshold, window=10, watermark=5,
                            trigger=args.trigger, out=str(out), master=args.master, seed=1,
                            namesrv_addr=None, mqtt_port=None, alert_stages=True)
    batches = _Batches()
    spark.streams.addListener(batches.listener)
    try:
        with demo._servers(ns) as (namesrv, mqtt_port):
            res = demo.run_pipeline(spark, namesrv, mqtt_port, out, ns, quiet=True)
            committed = _committed(spark, namesrv)
        warm = [json.loads(line)
                for line in (out / "alerts_received.jsonl").read_text().splitlines()]
    finally:
        spark.streams.removeListener(batches.listener)
        shutil.rmtree(out, ignore_errors=True)
    per: dict[str, list[float]] = {name: [] for name, _a, _b in STAGES}
    since = batches.warm_ms()
    for g in warm:
        a = dict(g["alert"])
        if "planned" not in a or a["ts"] < since:
            continue
        a["delivered"] = a["ts"] + g["latency_ms"]
        a["committed"] = committed.get((a["device"], a["ts"]))
        if a["committed"] is None:
            continue
        for name, frm, to in STAGES:
            per[name].append(a[to] - a[frm])
    # Only readings published once both queries ran a batch (as the demo counts them).
    result: dict[str, Any] = {"alerts_written": res["alerts"],
                              "alerts_received": res["alerts_received"],
                              "demo_p50_ms": res["alert_latency_p50_ms"],
                              "demo_p90_ms": res["alert_latency_p90_ms"]}
    for name, values in per.items():
        result[f"{name}_p50_ms"] = _pct(values, 0.5)
        result[f"{name}_p90_ms"] = _pct(values, 0.9)
    result["batches"] = batches.summary()
    return result


def run_latency(args) -> int:
    from lmq.bench._client_common import report
    from lmq.commands import demo

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = demo.make_spark(args.master)
    rounds = []
    loads = []
    try:
        if args.warmup > 0:   # JVM, Python workers, connections: not counted
            _one_round(spark, args, args.warmup)
        for _ in range(args.runs):
            rounds.append(_one_round(spark, args, args.latency))
            loads.append(os.getloadavg()[0])
    finally:
        spark.stop()
    keys = ["demo_p50_ms", "demo_p90_ms"] + [f"{n}_{q}_ms" for n, _a, _b in STAGES
                                             for q in ("p50", "p90")]
    result: dict[str, Any] = {}
    for k in keys:
        vals = [r[k] for r in rounds if r.get(k) is not None]
        result[k] = statistics.median(vals) if vals else None
    result.update(rounds=rounds, runs=args.runs, seconds=args.latency, trigger=args.trigger,
                  master=args.master, devices=args.devices, rate=args.rate,
                  load_averages=loads, cpus=os.cpu_count())

    def ms(v) -> str:
        return "-" if v is None else f"{v / 1000:.2f} s"

    rows = [("setup", f"{args.master}, {args.devices} devices x {args.rate:g}/s, trigger "
                      f"{args.trigger:g} s, {args.runs} round(s) of {args.latency:g} s; load "
                      f"average after each: {', '.join(f'{x:.1f}' for x in loads)} on "
                      f"{os.cpu_count()} CPUs")]
    for name, _a, _b in STAGES:
        rows.append((name.replace("_", " "), f"p50 {ms(result[f'{name}_p50_ms'])}  p90 "
                                             f"{ms(result[f'{name}_p90_ms'])}"))
    for i, r in enumerate(rounds):
        for q, ph in r["batches"].items():
            rows.append((f"round {i + 1} {q}", ", ".join(
                f"{k} {v:.0f}" for k, v in ph.items())))
    report(result, args.json, rows)
    return 0
