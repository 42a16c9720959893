"""MQTT and AMQP on one message through `amq.topic` (issue 13 §3, issue 12's done-when):
one `python -m lmq serve` with both gateways, paho-mqtt and pika clients, a native
consumer reading the store topics."""

from __future__ import annotations

import time
from pathlib import Path

import pika
import pytest
import trio

from core.client import ClientInstance, PullConsumer, PullStatus
from tests.gateway.amqp.broker_harness import params
from tests.gateway.mqtt.e2e_support import (
    Client,
    Gateway,
    PacketTypes,
    free_port,
    props,
    uid,
)

pytestmark = pytest.mark.timeout(180)

MQTT_STORE = "MQTT_MESSAGES"
AMQP_STORE = "LMQ_AMQP_STORE"


class BothGateways(Gateway):
    """`lmq serve` with the MQTT and the AMQP gateway."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.amqp_port = free_port()

    def argv(self) -> list[str]:
        argv = super().argv()
        argv.remove("--no-amqp")
        return argv + ["--amqp-port", str(self.amqp_port)]


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    gw = BothGateways(tmp_path_factory.mktemp("xproto")).start()
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture
def amqp(serve):
    conn = pika.BlockingConnection(params(serve.amqp_port))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        yield ch
    finally:
        if conn.is_open:
            conn.close()


@pytest.fixture
def mqtt(serve):
    made: list[Client] = []

    def make() -> Client:
        c = Client(serve.port, "xp-" + uid())
        c.connect()
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def _get(ch, queue: str, timeout: float = 15.0):
    """Basic.Get until a message is there (an MQTT publish is stored before its PUBACK,
    but an AMQP confirm is not awaited by every test: retried, bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        method, properties, body = ch.basic_get(queue, auto_ack=True)
        if method is not None:
            return method, properties, body
        time.sleep(0.05)
    raise AssertionError(f"nothing in {queue} after {timeout} s")


def _read_store(namesrv_addr: str, topic: str, token: bytes) -> list:
    """Messages of store topic `topic` whose body contains `token` (native consumer)."""

    async def main():
        found = []
        async with ClientInstance(namesrv_addr=namesrv_addr) as client:
            pc = PullConsumer(client, "xproto_native_" + uid())
            try:
                queues = await pc.fetch_subscribe_message_queues(topic)
            except Exception:
                return found  # the topic does not exist: nothing stored there
            for mq in queues:
                offset = 0
                while True:
                    r = await pc.pull(mq, "*", offset, max_nums=32)
                    if r.status != PullStatus.FOUND:
                        break
                    found += [m for m in r.messages if token in m.body]
                    offset = r.next_begin_offset
        return found

    return trio.run(main)


def test_mqtt_publish_reaches_amq_topic_queue_with_properties(serve, amqp, mqtt):
    q = "xp-in-" + uid()
    amqp.queue_declare(q)
    amqp.queue_bind(q, "amq.topic", "plant.*.temp")
    sub = mqtt()
    sub.subscribe("plant/#", qos=1)
    pub = mqtt()
    token = uid().encode()
    p = props(PacketTypes.PUBLISH, ContentType="application/json", ResponseTopic="plant/reply",
              CorrelationData=b"corr-1", MessageExpiryInterval=120,
              UserProperty=[("site", "north"), ("unit", "C")])
    assert pub.publish("plant/p1/temp", b"21.5 " + token, qos=1, properties=p) == 0

    method, properties, body = _get(amqp, q)
    assert body == b"21.5 " + token
    assert (method.exchange, method.routing_key) == ("amq.topic", "plant.p1.temp")
    assert properties.content_type == "application/json"
    assert properties.correlation_id == "corr-1"
    assert properties.reply_to == "plant.reply"
    assert properties.delivery_mode == 2  # QoS 1: persistent (RabbitMQ's MQTT plugin)
    assert 0 < int(properties.expiration) <= 120_000
    assert properties.headers["site"] == "north" and properties.headers["unit"] == "C"
    assert properties.headers["x-mqtt-publish-qos"] == 1
    # The MQTT subscriber got the same message, and it was stored once (MQTT's store topic).
    assert sub.receive_one().payload == b"21.5 " + token
    stored = _read_store(serve.namesrv_addr, MQTT_STORE, token)
    assert len(stored) == 1 and stored[0].properties["MQTT_TOPIC"] == "plant/p1/temp"
    assert _read_store(serve.namesrv_addr, AMQP_STORE, token) == []

    # QoS 0 is transient; a topic no binding matches stays out of the queue.
    assert pub.publish("plant/p2/temp", b"q0", qos=0) == 0
    pub.publish("plant/p2/humidity", b"other", qos=1)
    _, properties, body = _get(amqp, q)
    assert body == b"q0" and properties.delivery_mode == 1
    assert amqp.basic_get(q, auto_ack=True) == (None, None, None)


def test_amqp_publish_to_amq_topic_reaches_mqtt_subscribers(serve, amqp, mqtt):
    sub = mqtt()
    sub.subscribe("fleet/+/cmd", qos=2)
    q = "xp-out-" + uid()
    amqp.queue_declare(q)
    amqp.queue_bind(q, "amq.topic", "fleet.#")
    token = uid().encode()
    amqp.basic_publish("amq.topic", "fleet.v7.cmd", b"stop " + token, properties=pika.BasicProperties(
        content_type="text/plain", correlation_id="c-42", reply_to="fleet.v7.ack",
        expiration="60000", delivery_mode=2, headers={"prio": "high", "n": 3}), mandatory=True)
    m = sub.receive_one()
    assert (m.topic, m.payload, m.qos) == ("fleet/v7/cmd", b"stop " + token, 1)
    p = m.properties
    assert p.ContentType == "text/plain"
    assert p.CorrelationData == b"c-42"
    assert p.ResponseTopic == "fleet/v7/ack"
    assert 0 < p.MessageExpiryInterval <= 60
    assert sorted(p.UserProperty) == [("n", "3"), ("prio", "high")]
    # The AMQP queue got it too: one stored copy (AMQP's store topic), read by both.
    _, properties, body = _get(amqp, q)
    assert body == b"stop " + token and properties.correlation_id == "c-42"
    stored = _read_store(serve.namesrv_addr, AMQP_STORE, token)
    assert len(stored) == 1
    # A native consumer reads it as MQTT traffic (gateway/mqtt/message.py) ...
    assert stored[0].properties["MQTT_TOPIC"] == "fleet/v7/cmd"
    assert stored[0].properties["MQTT_QOS"] == "1"
    # ... and as AMQP traffic.
    assert stored[0].properties["AMQP_CORRELATION_ID"] == "c-42"
    assert _read_store(serve.namesrv_addr, MQTT_STORE, token) == []

    # Transient (delivery mode 1) is QoS 0; x-mqtt-publish-qos overrides it.
    amqp.basic_publish("amq.topic", "fleet.v8.cmd", b"t0",
                       properties=pika.BasicProperties(delivery_mode=1))
    amqp.basic_publish("amq.topic", "fleet.v8.cmd", b"t2", properties=pika.BasicProperties(
        delivery_mode=1, headers={"x-mqtt-publish-qos": 2}))
    got = sub.receive(2)
    assert [(x.payload, x.qos) for x in got] == [(b"t0", 0), (b"t2", 2)]
    # The bridge's own header is no user property.
    assert not hasattr(got[1].properties, "UserProperty")


def test_keys_that_are_no_mqtt_topic_stay_amqp(serve, amqp, mqtt):
    sub = mqtt()
    sub.subscribe("#", qos=1)
    q = "xp-only-" + uid()
    amqp.queue_declare(q)
    amqp.queue_bind(q, "amq.topic", "#")
    # Wildcards and `$` topics are not MQTT topic names one may publish to.
    for key in ("a.*.b", "$SYS.broker.fake"):
        amqp.basic_publish("amq.topic", key, key.encode())
    amqp.basic_publish("amq.topic", "plain.key", b"marker")
    assert sub.receive_one().payload == b"marker"
    got = sorted(_get(amqp, q)[2] for _ in range(3))
    assert got == [b"$SYS.broker.fake", b"a.*.b", b"marker"]


def test_subscribe_then_amqp_publish_at_once_is_delivered(serve, amqp, mqtt):
    # The SUBSCRIBE is answered once the AMQP gateway applied the route too.
    for i in range(5):
        sub = mqtt()
        topic = f"now/{uid()}"
        sub.subscribe(topic, qos=1)
        amqp.basic_publish("amq.topic", topic.replace("/", "."), b"%d" % i)
        assert sub.receive_one().payload == b"%d" % i


def test_interleaved_mqtt_and_amqp_publishes_all_reach_the_subscriber(serve, amqp, mqtt):
    # The embedded MQTT gateway predicts the tails of the LMQs it alone writes; once the
    # AMQP gateway writes them too it must read them by pulls, or entries are skipped.
    sub = mqtt()
    topic = f"mix/{uid()}"
    sub.subscribe(topic, qos=1)
    pub = mqtt()
    sent = []
    for i in range(20):
        sent.append(b"m%d" % i)
        assert pub.publish(topic, sent[-1], qos=1) == 0
        sent.append(b"a%d" % i)
        amqp.basic_publish("amq.topic", topic.replace("/", "."), sent[-1],
                           properties=pika.BasicProperties(delivery_mode=2))
    assert [m.payload for m in sub.receive(len(sent))] == sent
