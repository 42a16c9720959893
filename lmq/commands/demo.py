"""`lmq demo iot`: the IoT telemetry pipeline, end to end on this machine.

    lmq demo iot                               # 5 devices, 2 readings/s each, 60 s
    lmq demo iot --devices 20 --rate 5 --duration 0 --out ./iot   # until Ctrl-C

It starts `lmq serve` (name server, broker and MQTT gateway on free ports) unless
``--namesrv-addr`` and ``--mqtt-port`` name a running one; a device simulator (one MQTT
connection per device, msgpack readings {device, ts, temperature, humidity, battery}
published with QoS 1 to ``devices/<id>/telemetry``); and two Spark queries on
``format("lmq").option("mqttTopic", "devices/+/telemetry")``:

* aggregates: per device and event-time window (``--window`` seconds, watermark
  ``--watermark`` seconds): readings, mean / max temperature, mean humidity, min battery,
  appended to Parquet under ``<out>/aggregates`` as windows close;
* alerts: every reading above ``--threshold`` degrees, published exactly once by the lmq
  sink as MQTT traffic to ``alerts/<device>`` (QoS 1, value = the reading as JSON): its
  ``mqttTopic`` column. An MQTT subscriber on ``alerts/#`` (the operator) receives them;
  the demo measures the latency from each reading's publish to its alert's arrival.

The sink multi-dispatches MQTT rows into the subscribers' LMQs (INNER_MULTI_DISPATCH), a
right the broker gives only to ACL accounts with ``innerProperties`` or when
``allow_inner_properties_without_acl`` is set: the `lmq serve` this demo starts (loopback
only) sets it; a cluster given with ``-n`` must grant it.

Every reading sent is also logged to ``<out>/readings.jsonl`` (to check the results).
Progress (readings sent, rows in, batches, backlog, alerts received, alert latency) is a
live line on a terminal and a plain line every 2 s when standard output is not one
(``docker compose logs``); at the end
(duration or Ctrl-C) the simulator stops, the queries drain what was sent and stop, and
the servers it started stop.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from lmq.commands._demo_alerts import AlertSubscriber, percentile
from lmq.progress import Progress

READINGS_SCHEMA = "device string, ts long, temperature double, humidity double, battery int"
TELEMETRY_FILTER = "devices/+/telemetry"
PLAIN_STATUS_EVERY_S = 2.0  # progress lines when stdout is not a terminal
STATUS_MIN_EVERY_S = 1.0  # the status reads Spark's query progress at most this often


def register(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="demos (lmq demo iot: the IoT telemetry pipeline)",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="demo", metavar="DEMO")
    iot = sub.add_parser("iot", help="device simulator -> MQTT -> Spark -> Parquet and alerts",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_iot_arguments(iot)
    iot.set_defaults(func=run_iot_command)
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


def add_iot_arguments(p) -> None:
    p.add_argument("--devices", type=int, default=5, help="simulated devices (default 5)")
    p.add_argument("--rate", type=float, default=2.0, help="readings per second per device")
    p.add_argument("--duration", type=float, default=60.0, help="seconds to run; 0 = until Ctrl-C")
    p.add_argument("--threshold", type=float, default=30.0, help="alert above this temperature")
    p.add_argument("--window", type=int, default=10, help="aggregate window, seconds")
    p.add_argument("--watermark", type=int, default=5, help="late-data allowance, seconds")
    p.add_argument("--trigger", type=float, default=1.0, help="micro-batch interval, seconds")
    p.add_argument("--agg-trigger", type=float, default=None,
                   help="micro-batch interval of the aggregates, seconds (default: the larger "
                        "of --trigger and half of --window)")
    p.add_argument("--out", default=None, help="output directory (default: a new temp dir)")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--seed", type=int, default=1, help="simulator random seed")
    p.add_argument("-n", "--namesrv-addr", help="use this cluster (with --mqtt-port)")
    p.add_argument("--mqtt-port", type=int, help="MQTT port of that cluster's gateway")


# -- device simulator ----------------------------------------------------------------------


class Simulator:
    """`devices` MQTT connections publishing msgpack readings at `rate` per device."""

    def __init__(self, port: int, devices: int, rate: float, log_path: Path, seed: int,
                 host: str = "127.0.0.1") -> None:
        self.host, self.port, self.devices, self.rate = host, port, devices, rate
        self.log_path, self.rng = log_path, random.Random(seed)
        self.sent = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Simulator:
        self._thread = threading.Thread(target=self._run, name="iot-simulator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _connect(self, name: str) -> socket.socket:
        from gateway.mqtt.codec import MqttCodec
        from gateway.mqtt.packets import Connect

        s = socket.create_connection((self.host, self.port), timeout=10)
        s.sendall(MqttCodec(role="client").encode(
            Connect(client_id=name, protocol_version=4, clean_start=True, keepalive=0)))
        ack = _recv_exact(s, 4)
        if ack[0] != 0x20 or ack[3] != 0:
            raise ConnectionError(f"{name}: CONNACK refused ({ack.hex()})")
        return s

    def _run(self) -> None:
        import msgpack

        from gateway.mqtt.codec import MqttCodec
        from gateway.mqtt.packets import Publish

        codec = MqttCodec(role="client", protocol_version=4)
        names = [f"dev{i:03d}" for i in range(self.devices)]
        state = {n: [22.0 + self.rng.uniform(-3, 3), 50.0, 100] for n in names}
        try:
            socks = {n: self._connect(n) for n in names}
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            self.error = exc
            return
        period = 1.0 / self.rate
        nxt = time.monotonic()
        pid = 0
        with open(self.log_path, "a", encoding="utf-8") as log:
            try:
                while not self._stop.is_set():
                    for n in names:
                        st = state[n]
                        st[0] += 0.1 * (24.0 - st[0]) + self.rng.gauss(0, 1.5)  # crosses 30 at times
                        st[1] = min(100.0, max(0.0, st[1] + self.rng.gauss(0, 2)))
                        st[2] = max(0, st[2] - (self.rng.random() < 0.1))
                        r = {"device": n, "ts": int(time.time() * 1000),
                             "temperature": round(st[0], 2), "humidity": round(st[1], 1),
                             "battery": st[2]}
                        pid = pid % 65535 + 1
                        s = socks[n]
                        s.sendall(codec.encode(Publish(f"devices/{n}/telemetry",
                                                       msgpack.packb(r), 1, packet_id=pid)))
                        _recv_exact(s, 4)                 # PUBACK: stored by the broker
                        log.write(json.dumps(r) + "\n")
                        self.sent += 1
                    log.flush()
                    nxt += period
                    self._stop.wait(max(0.0, nxt - time.monotonic()))
            except BaseException as exc:  # noqa: BLE001
                self.error = exc
            finally:
                for s in socks.values():
                    with contextlib.suppress(OSError):
                        s.sendall(b"\xe0\x00")            # DISCONNECT
                        s.close()


def _recv_exact(s: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        part = s.recv(n - len(got))
        if not part:
            raise ConnectionError("connection closed by the gateway")
        got += part
    return got


# -- the Spark job -------------------------------------------------------------------------


def start_queries(spark, namesrv: str, out: Path, args) -> tuple:
    """(aggregates query, alerts query) reading the devices' MQTT traffic. With
    `args.alert_stages` (`lmq bench spark --latency`) each alert also carries the reading's
    store time (`stored`) and its micro-batch's timestamp (`planned`), epoch milliseconds."""
    from pyspark.sql import functions as F

    from spark_sinks.payload import from_msgpack

    stages = getattr(args, "alert_stages", False)
    # Each query runs its jobs in its own scheduler pool (FAIR between pools, make_spark):
    # an alert batch's tasks do not queue behind the aggregates' (stateful, shuffled) ones.
    sc = spark.sparkContext

    raw = (spark.readStream.format("lmq").option("lmq.namesrv", namesrv)
           .option("mqttTopic", TELEMETRY_FILTER).option("startingOffsets", "earliest").load())
    readings = (raw.select(from_msgpack("value", READINGS_SCHEMA).alias("r"),
                           F.unix_millis("timestamp").alias("stored")).select("r.*", "stored")
                .where("device IS NOT NULL")
                .withColumn("event_time", F.timestamp_millis("ts")))
    trigger = f"{args.trigger} seconds"
    agg_trigger = getattr(args, "agg_trigger", None) or max(args.trigger, args.window / 2)
    aggregates = (readings.withWatermark("event_time", f"{args.watermark} seconds")
                  .groupBy(F.window("event_time", f"{args.window} seconds"), "device")
                  .agg(F.count("*").alias("readings"),
                       F.avg("temperature").alias("avg_temperature"),
                       F.max("temperature").alias("max_temperature"),
                       F.avg("humidity").alias("avg_humidity"),
                       F.min("battery").alias("min_battery"))
                  .select(F.col("window.start").alias("window_start"),
                          F.col("window.end").alias("window_end"), "device", "readings",
                          "avg_temperature", "max_temperature", "avg_humidity", "min_battery"))
    sc.setLocalProperty("spark.scheduler.pool", "iot_aggregates")
    # Windows close only as the watermark passes them: no need to run this every second.
    agg_q = (aggregates.writeStream.queryName("iot_aggregates").outputMode("append")
             .format("parquet").option("path", str(out / "aggregates"))
             .option("checkpointLocation", str(out / "checkpoints" / "aggregates"))
             .trigger(processingTime=f"{agg_trigger} seconds").start())
    alerts = (readings.where(F.col("temperature") > F.lit(args.threshold))
              .select(F.col("device").alias("key"),
                      F.to_json(F.struct(*_alert_fields(stages))).alias("value"),
                      F.concat(F.lit("alerts/"), "device").alias("mqttTopic"),
                      F.lit(1).alias("qos")))
    sc.setLocalProperty("spark.scheduler.pool", "iot_alerts")
    alert_q = (alerts.writeStream.queryName("iot_alerts").format("lmq")
               .option("lmq.namesrv", namesrv)
               .option("checkpointLocation", str(out / "checkpoints" / "alerts"))
               .trigger(processingTime=trigger).start())
    sc.setLocalProperty("spark.scheduler.pool", None)
    return agg_q, alert_q


def _alert_fields(stages: bool) -> list:
    from pyspark.sql import functions as F

    if not stages:
        return ["device", "ts", "temperature"]
    return ["device", "ts", "temperature", "stored",
            F.unix_millis(F.current_timestamp()).alias("planned")]


def _rows_in(q) -> int:
    return sum(int(p.get("numInputRows", 0)) for p in _progress(q))


def _progress(q) -> list[dict]:
    out = []
    for p in q.recentProgress:
        out.append(p if isinstance(p, dict) else json.loads(p.json))
    return out


def alerts_written(spark, namesrv: str, since_ms: int) -> tuple[int, list[int]]:
    """Alerts the sink stored (committed) as MQTT traffic on alerts/<device>, and, for the
    readings published at or after `since_ms`, the milliseconds from the reading's publish
    to its alert's store time, sorted."""
    from pyspark.sql import functions as F

    rows = (spark.read.format("lmq").option("lmq.namesrv", namesrv)
            .option("mqttTopic", "alerts/+").load()
            .select((F.unix_millis("timestamp")
                     - F.get_json_object(F.col("value").cast("string"), "$.ts")
                     .cast("long")).alias("ms"),
                    F.get_json_object(F.col("value").cast("string"), "$.ts").cast("long")
                    .alias("ts")).collect())
    return len(rows), sorted(r.ms for r in rows if r.ms is not None and r.ts >= since_ms)


def _latency(sub, since_ms: int | None) -> str:
    lat = sub.latencies_ms(since_ms or 0)
    if not lat:
        return "-"
    return f"p50 {percentile(lat, 0.5) / 1000:.2f}s p90 {percentile(lat, 0.9) / 1000:.2f}s"


def _status_text(sim, agg_q, sub, warm_ms: int | None) -> str:
    """The progress line: rows in, batches, lag (rows not yet read), alerts."""
    backlog = _backlog(agg_q)
    batches = _progress(agg_q)               # one read of the query's recent progress
    rows = sum(int(p.get("numInputRows", 0)) for p in batches)
    return (f"readings sent {sim.sent:,}  rows in {rows:,}  batches "
            f"{len(batches)}  backlog {backlog if backlog is not None else '-'}  "
            f"alerts received {len(sub.received):,} (latency {_latency(sub, warm_ms)})")


def _backlog(q) -> int | None:
    last = q.lastProgress
    if not last:
        return None
    p = last if isinstance(last, dict) else json.loads(last.json)
    total = 0
    for src in p.get("sources", []):
        end, latest = src.get("endOffset"), src.get("latestOffset")
        if isinstance(end, str):
            end = json.loads(end)
        if isinstance(latest, str):
            latest = json.loads(latest)
        if not isinstance(end, dict) or not isinstance(latest, dict):
            return None
        for topic, per in latest.items():
            for q_, hi in per.items():
                total += max(0, int(hi) - int(end.get(topic, {}).get(q_, 0)))
    return total


def run_pipeline(spark, namesrv: str, mqtt_port: int, out: Path, args,
                 stop: threading.Event | None = None, quiet: bool = False) -> dict:
    """Run simulator + queries until `args.duration` passed (0: until `stop` or Ctrl-C),
    then drain and stop. Returns the final counters."""
    out.mkdir(parents=True, exist_ok=True)
    stop = stop or threading.Event()
    old_handler = None
    if threading.current_thread() is threading.main_thread():
        # PySpark's own SIGINT handler cancels every job, failing the queries mid-batch:
        # the first Ctrl-C asks for a clean stop instead, a second one interrupts.
        def on_sigint(_sig, _frame):
            if stop.is_set():
                raise KeyboardInterrupt
            stop.set()
        old_handler = signal.signal(signal.SIGINT, on_sigint)
    sub = AlertSubscriber(mqtt_port).start()          # subscribed before any alert
    agg_q, alert_q = start_queries(spark, namesrv, out, args)
    sim = Simulator(mqtt_port, args.devices, args.rate, out / "readings.jsonl", args.seed).start()
    t0 = time.monotonic()
    # Latencies count the readings published once both queries ran their first batch
    # (before that, readings wait for Spark to start).
    warm_ms = None
    # Reporting: a live line on a terminal, a plain line every PLAIN_STATUS_EVERY_S when
    # piped (`docker compose logs iot` reads those), nothing with quiet (lmq.progress).
    progress = Progress("lmq demo iot", sys.stdout, enabled=False if quiet else None,
                        plain_every=None if quiet else PLAIN_STATUS_EVERY_S).__enter__()
    try:
        while not stop.is_set():
            if warm_ms is None and agg_q.lastProgress and alert_q.lastProgress:
                warm_ms = int(time.time() * 1000)
            if sim.error is not None:
                raise RuntimeError(f"device simulator failed: {sim.error}")
            for q in (agg_q, alert_q):
                if q.exception() is not None:
                    raise RuntimeError(f"query {q.name} failed: {q.exception()}")
            if progress.interval is not None:
                progress.status(_status_text(sim, agg_q, sub, warm_ms))
            if args.duration and time.monotonic() - t0 >= args.duration:
                break
            stop.wait(max(progress.interval or PLAIN_STATUS_EVERY_S, STATUS_MIN_EVERY_S))
    except KeyboardInterrupt:
        pass
    finally:
        progress.set_phase("stopping: draining the queries")
        sim.stop()
        try:
            for q in (agg_q, alert_q):       # drain what the simulator sent, then stop
                if q.isActive and q.exception() is None:
                    q.processAllAvailable()
        finally:
            progress.__exit__(None, None, None)  # erase the live line before the result
            agg_q.stop()
            alert_q.stop()
            if warm_ms is None:
                warm_ms = int(time.time() * 1000)
            written, stored_ms = alerts_written(spark, namesrv, warm_ms)
            deadline = time.monotonic() + 5        # the last alerts' way to the subscriber
            while len(sub.received) < written and time.monotonic() < deadline:
                time.sleep(0.1)
            sub.stop()
            if old_handler is not None:
                signal.signal(signal.SIGINT, old_handler)
    lat = sub.latencies_ms(warm_ms)
    result = {"readings_sent": sim.sent, "rows_in": _rows_in(agg_q), "alerts": written,
              "alerts_received": len(sub.received),
              "alert_latency_p50_ms": percentile(lat, 0.5),
              "alert_latency_p90_ms": percentile(lat, 0.9),
              "alert_stored_p50_ms": percentile(stored_ms, 0.5),
              "alert_stored_p90_ms": percentile(stored_ms, 0.9), "out": str(out)}
    with open(out / "alerts_received.jsonl", "w", encoding="utf-8") as f:
        for topic, alert, latency in sub.received:
            f.write(json.dumps({"topic": topic, "alert": alert, "latency_ms": latency}) + "\n")
    if not quiet:
        stored = "-" if not stored_ms else (f"p50 {percentile(stored_ms, 0.5) / 1000:.2f}s "
                                            f"p90 {percentile(stored_ms, 0.9) / 1000:.2f}s")
        print(f"stopped: {result['readings_sent']:,} readings sent, {written:,} alerts "
              f"written to alerts/<device>, {len(sub.received):,} received over MQTT (latency "
              f"{_latency(sub, warm_ms)}, trigger {args.trigger:g}s; publish to alert stored: "
              f"{stored}), aggregates in {out / 'aggregates'}")
    return result


# -- the command ---------------------------------------------------------------------------


@contextlib.contextmanager
def _servers(args):
    """(name server address, MQTT port): the given cluster, or an `lmq serve` child."""
    if args.namesrv_addr:
        if not args.mqtt_port:
            raise SystemExit("lmq demo iot: --namesrv-addr needs --mqtt-port")
        yield args.namesrv_addr, args.mqtt_port
        return
    import subprocess

    from lmq.bench._client_common import free_port

    data = tempfile.mkdtemp(prefix="lmq-demo-iot-")
    ns, broker, mqtt = free_port(), free_port(), free_port()
    config = os.path.join(data, "demo.toml")
    with open(config, "w", encoding="utf-8") as f:
        # the sink multi-dispatches MQTT alerts; this server listens on loopback only
        f.write("[broker]\nallow_inner_properties_without_acl = true\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmq", "serve", "--no-grpc", "--data-dir", data, "--config", config,
         "--host", "127.0.0.1", "--namesrv-port", str(ns),
         "--broker-port", str(broker), "--mqtt-port", str(mqtt), "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL, start_new_session=True)  # Ctrl-C stops the demo, not it
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", mqtt), timeout=0.5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("lmq demo iot: `lmq serve` did not start") from None
                time.sleep(0.2)
        time.sleep(0.5)  # the broker registers with its name server
        yield f"127.0.0.1:{ns}", mqtt
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(data, ignore_errors=True)


def make_spark(master: str):
    from pyspark.sql import SparkSession

    from spark_sinks import register

    repo = str(Path(__file__).resolve().parents[2])   # Spark's Python workers import it
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH"))
                                               if p)
    spark = (SparkSession.builder.master(master).appName("lmq-demo-iot")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.scheduler.mode", "FAIR")           # the queries' pools share
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def run_iot_command(args) -> int:
    if min(args.devices, args.window, args.watermark) < 1 or args.rate <= 0 or args.trigger <= 0 \
            or args.duration < 0 or (args.agg_trigger is not None and args.agg_trigger <= 0):
        print("lmq demo iot: --devices, --rate, --window, --watermark, --trigger, --agg-trigger "
              "must be positive and --duration >= 0")
        return 2
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print("lmq demo iot: needs the spark extra (pip install -e '.[spark]') and Java 17")
        return 2
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="lmq-iot-out-"))
    with _servers(args) as (namesrv, mqtt_port):
        spark = make_spark(args.master)
        try:
            run_pipeline(spark, namesrv, mqtt_port, out, args)
        finally:
            spark.stop()
    return 0
