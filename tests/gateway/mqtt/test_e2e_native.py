"""Acceptance: MQTT traffic read by native RocketMQ consumers — a publish is stored once on
the regular store topic (default "MQTT_MESSAGES") with the MQTT metadata as message
properties (docs/mqtt.md, "Stored form"), per-topic order kept within one queue; read with
our pull consumer and with the Apache C++ client of the `rocketmq` wheel.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import textwrap

import pytest
import trio

from core.client import ClientInstance, PullConsumer, PullStatus
from tests.gateway.mqtt.e2e_support import (
    REPO,
    PacketTypes,
    clients,
    gateway,
    gateway_only,
    props,
    uid,
)

__all__ = ["clients", "gateway"]  # fixtures used below

pytestmark = gateway_only
STORE_TOPIC = "MQTT_MESSAGES"


def read_store_topic(namesrv_addr: str, token: str, expect: int, timeout: float = 15.0):
    """Every message of the store topic whose MQTT topic contains `token`, per queue."""

    async def main():
        found: dict[int, list] = {}
        async with ClientInstance(namesrv_addr=namesrv_addr) as client:
            pc = PullConsumer(client, "e2e_native_" + uid())
            with trio.move_on_after(timeout):
                while sum(len(v) for v in found.values()) < expect:
                    found.clear()
                    for mq in await pc.fetch_subscribe_message_queues(STORE_TOPIC):
                        offset = 0
                        while True:
                            r = await pc.pull(mq, "*", offset, max_nums=32)
                            if r.status != PullStatus.FOUND:
                                break
                            for m in r.messages:
                                if token in m.properties.get("MQTT_TOPIC", ""):
                                    found.setdefault(mq.queue_id, []).append(m)
                            offset = r.next_begin_offset
                    if sum(len(v) for v in found.values()) < expect:
                        await trio.sleep(0.2)
        return found

    return trio.run(main)


def test_publishes_visible_on_store_topic_with_properties(gateway, clients):
    token = uid()
    pub = clients()
    pub.connect()
    user = [("site", "berlin"), ("site", "paris")]
    pub.publish(f"plant/{token}/temp", b"21.5", qos=1, retain=False, properties=props(
        PacketTypes.PUBLISH, UserProperty=user, ContentType="text/plain", PayloadFormatIndicator=1,
        ResponseTopic=f"reply/{token}", CorrelationData=b"\x00\xffcorr",
        MessageExpiryInterval=3600))
    pub.publish(f"plant/{token}/state", b"\x00\x01binary", qos=2, retain=True)
    pub.publish(f"plant/{token}/q0", b"zero", qos=0)
    found = read_store_topic(gateway.namesrv_addr, token, 3)
    msgs = {m.properties["MQTT_TOPIC"]: m for ms in found.values() for m in ms}
    assert set(msgs) == {f"plant/{token}/temp", f"plant/{token}/state", f"plant/{token}/q0"}
    temp = msgs[f"plant/{token}/temp"]
    assert temp.topic == STORE_TOPIC
    assert temp.body == b"21.5"
    p = temp.properties
    assert p["MQTT_QOS"] == "1"
    assert p["MQTT_CT"] == "text/plain"
    assert p["MQTT_PFI"] == "1"
    assert p["MQTT_RT"] == f"reply/{token}"
    assert base64.b64decode(p["MQTT_CD"]) == b"\x00\xffcorr"
    assert [tuple(x) for x in json.loads(base64.b64decode(p["MQTT_UP"]))] == user
    assert int(p["MQTT_EXPIRY_AT"]) > temp.store_timestamp
    state = msgs[f"plant/{token}/state"]
    assert (state.body, state.properties["MQTT_QOS"], state.properties.get("MQTT_RETAIN")) == (
        b"\x00\x01binary", "2", "1")
    assert msgs[f"plant/{token}/q0"].properties["MQTT_QOS"] == "0"


def test_per_topic_order_within_one_queue(gateway, clients):
    token = uid()
    pub = clients(version=4)
    pub.connect()
    topics = [f"order/{token}/{k}" for k in "abc"]
    for i in range(30):
        pub.publish(topics[i % 3], b"%d" % i, qos=1)
    found = read_store_topic(gateway.namesrv_addr, token, 30)
    for t in topics:
        queues = {q for q, ms in found.items() for m in ms if m.properties["MQTT_TOPIC"] == t}
        assert len(queues) == 1, f"{t} spread over queues {queues}"
        (q,) = queues
        bodies = [int(m.body) for m in found[q] if m.properties["MQTT_TOPIC"] == t]
        assert bodies == [i for i in range(30) if topics[i % 3] == t]


CPP_READER = textwrap.dedent("""
    import sys, time
    from rocketmq.client import PullConsumer
    addr, topic, token, expect = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    c = PullConsumer("e2e_cpp_" + token)
    c.set_namesrv_addr(addr)
    c.start()
    got = []
    deadline = time.time() + 20
    while len(got) < expect and time.time() < deadline:
        for m in c.pull(topic):  # continues from the offsets of the previous round
            t = m.get_property("MQTT_TOPIC")
            t = t.decode() if isinstance(t, bytes) else t
            if token in (t or ""):
                got.append((t, m.body))
        if len(got) < expect:
            time.sleep(0.3)
    c.shutdown()
    for t, b in got:
        print(t, b.decode() if isinstance(b, bytes) else b)
""")


@pytest.mark.slow
def test_cpp_client_reads_mqtt_publishes(gateway, clients):
    token = uid()
    pub = clients(version=4)
    pub.connect()
    for i in range(5):
        pub.publish(f"cpp/{token}/x", b"v%d" % i, qos=1)
    out = subprocess.run(
        [sys.executable, "-c", CPP_READER, gateway.namesrv_addr, STORE_TOPIC, token, "5"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    lines = out.stdout.split("\n")
    got = [line.split() for line in lines if line.startswith("cpp/")]
    assert got == [[f"cpp/{token}/x", f"v{i}"] for i in range(5)], out.stderr[-2000:]
