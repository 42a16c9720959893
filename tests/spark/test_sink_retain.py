"""The sink's `retain` column against a real `lmq serve` (name server, broker, MQTT
gateway): a retained row becomes the topic's retained message in the gateway's retained
table, so an MQTT subscriber arriving later gets the last retained value (paho client)."""

from __future__ import annotations

import argparse
import queue
import time

import pytest

pytestmark = pytest.mark.slow

paho = pytest.importorskip("paho.mqtt.client")


def _retained_on_subscribe(port: int, topic_filter: str, wait_s: float) -> list:
    """(topic, payload, retain flag) of what a new subscription gets within `wait_s`."""
    got: queue.Queue = queue.Queue()
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"late-{time.monotonic_ns()}",
                    protocol=paho.MQTTv311)
    c.on_message = lambda _c, _u, m: got.put((m.topic, m.payload, m.retain))
    subscribed = queue.Queue()
    c.on_subscribe = lambda *_a: subscribed.put(True)
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        c.subscribe(topic_filter, qos=1)
        subscribed.get(timeout=10)
        out, deadline = [], time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                out.append(got.get(timeout=max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                break
        return out
    finally:
        c.disconnect()
        c.loop_stop()


def test_retained_rows_update_the_gateways_retained_table(spark):
    from lmq.commands.demo import _servers

    args = argparse.Namespace(namesrv_addr=None, mqtt_port=None)
    with _servers(args) as (namesrv, mqtt_port):
        ddl = "value binary, mqttTopic string, retain boolean"

        def write(rows):
            spark.createDataFrame(rows, ddl).coalesce(1).write.format("lmq") \
                .option("lmq.namesrv", namesrv).mode("append").save()

        write([(b"20.5", "sensors/d1/last", True), (b"7", "sensors/d2/last", True)])
        # a later retained value replaces the first; a row without retain changes nothing
        write([(b"21.5", "sensors/d1/last", True)])
        write([(b"99", "sensors/d1/last", False), (b"nope", "sensors/d3/last", False)])

        want = {("sensors/d1/last", b"21.5", True), ("sensors/d2/last", b"7", True)}
        deadline = time.monotonic() + 30   # the gateway follows the retained LMQ
        got: set = set()
        while time.monotonic() < deadline:
            got = set(_retained_on_subscribe(mqtt_port, "sensors/+/last", 1.0))
            if got == want:
                break
        assert got == want
