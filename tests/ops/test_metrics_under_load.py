"""`/metrics` scraped while MQTT, AMQP and RocketMQ clients keep a real `lmq serve` busy:
every scrape is accepted by the reference parser and a promtool-style lint (and by
`promtool check metrics` when it is installed), and the counters move and never go back."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import threading
import time

import paho.mqtt.client as mqtt
import pika
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.mqtt.e2e_support import free_port
from tests.ops.test_metrics import TIMEOUT, _rocketmq_backlog, serve

pytestmark = pytest.mark.timeout(180)
NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def lint(text: str) -> dict[str, float]:
    """Problems raise AssertionError; returns sample name{labels} -> value."""
    help_of = set(re.findall(r"^# HELP (\S+) ", text, re.M))
    type_of = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        name = family.name
        assert NAME.match(name), name
        assert name.split("_")[0] in ("lmq", "process", "python"), name
        exposed = name + "_total" if family.type == "counter" else name
        assert exposed in help_of or name in help_of, f"{name}: no HELP"
        assert type_of.get(exposed, type_of.get(name)) == family.type, f"{name}: TYPE"
        assert family.documentation.strip(), f"{name}: empty HELP"
        for s in family.samples:
            if family.type == "counter":
                assert s.name.endswith(("_total", "_created")), s.name
                assert s.value >= 0, s
            assert math.isfinite(s.value), s
            for label in s.labels:
                assert NAME.match(label) and not label.startswith("__"), label
            key = s.name + "{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}"
            assert key not in samples, f"duplicate series {key}"
            samples[key] = s.value
    return samples


def _mqtt_load(port: int, stop: threading.Event) -> None:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="load-pub")
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        while not stop.is_set():
            c.publish("load/t", b"p" * 200, qos=1).wait_for_publish(10)
    finally:
        c.disconnect()
        c.loop_stop()


def _amqp_load(port: int, stop: threading.Event) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        ch = conn.channel()
        ch.queue_declare("load-q", durable=True)
        while not stop.is_set():
            ch.basic_publish("", "load-q", b"a" * 200)
            conn.process_data_events(0)
    finally:
        conn.close()


def test_metrics_under_load_pass_the_format_checks(tmp_path):
    ns_port = free_port()
    proc, mqtt_port = serve(tmp_path, namesrv_port=ns_port)
    argv = proc.proc.args
    amqp_port = int(argv[argv.index("--amqp-port") + 1])
    stop = threading.Event()
    threads = [threading.Thread(target=f, args=(p, stop), daemon=True)
               for f, p in ((_mqtt_load, mqtt_port), (_amqp_load, amqp_port))]
    promtool = shutil.which("promtool")
    try:
        proc.wait_ready()
        _rocketmq_backlog(f"127.0.0.1:{ns_port}", "LoadTopic", "CG_LOAD", 5)
        for t in threads:
            t.start()
        scrapes = []
        deadline = time.monotonic() + TIMEOUT
        while True:
            status, text = proc.get("/metrics")
            assert status == 200
            if promtool:
                r = subprocess.run([promtool, "check", "metrics"], input=text,
                                   capture_output=True, text=True, timeout=30)
                assert r.returncode == 0, r.stdout + r.stderr
            scrapes.append(lint(text))
            first, last = scrapes[0], scrapes[-1]
            moved = all(last[k] > first[k] for k in (
                "lmq_broker_put_messages_total{}", "lmq_mqtt_messages_received_total{}",
                "lmq_amqp_stored_messages_total{}"))
            if len(scrapes) >= 5 and moved:
                break
            assert time.monotonic() < deadline, {k: (first[k], last[k]) for k in first
                                                 if k.startswith("lmq_") and "total" in k}
            time.sleep(0.2)
        # counters never go back between scrapes
        for before, after in zip(scrapes, scrapes[1:], strict=False):
            for key, value in before.items():
                if key.startswith("lmq_") and "_total" in key and key in after:
                    assert after[key] >= value, key
        last = scrapes[-1]
        for key in ("lmq_broker_commitlog_flush_lag_bytes{}", "lmq_broker_consume_queues{}",
                    "lmq_broker_lmqs{}", "lmq_broker_long_poll_waiters{}",
                    "lmq_mqtt_connections{}", "lmq_mqtt_inflight_messages{}",
                    "lmq_amqp_connections{}", "lmq_event_loop_lag_seconds{}",
                    "process_resident_memory_bytes{}", "lmq_ready{}"):
            assert key in last, key
        assert last["lmq_amqp_connections{}"] == 1 and last["lmq_ready{}"] == 1
        assert any(k.startswith("lmq_broker_consumer_lag_messages{group=CG_LOAD,")
                   for k in last)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        proc.stop()
