"""The amq.topic bridge across processes: `lmq namesrv`, one `lmq broker`, one `lmq mqtt` and one `lmq amqp` (issue 12's done-when: an MQTT publish read by an AMQP
queue bound to amq.topic, from one stored copy; and the way back)."""

from __future__ import annotations

import pika
import pytest

from tests.gateway.amqp.broker_harness import params
from tests.gateway.mqtt.cluster_support import Cluster, _Proc
from tests.gateway.mqtt.e2e_support import (
    BROKER_TEST_CONFIG,
    Client,
    PacketTypes,
    free_port,
    props,
    uid,
    write_toml,
)
from tests.gateway.xproto.test_amq_topic_bridge import (
    AMQP_STORE,
    MQTT_STORE,
    BothGateways,
    _get,
    _read_store,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("xproto-cluster")
    c = Cluster(root).start()  # apache_strict brokers: the gateway uses Apache's POP codes
    amqp_port = free_port()
    amqp = _Proc(root, "amqp", ["amqp", "--namesrv-addr", c.namesrv_addr, "--host",
                                "127.0.0.1", "--amqp-port", str(amqp_port), "--log-level",
                                "INFO"])
    try:
        mqtt = c.gateway()
        amqp.start()
        amqp.wait_port(amqp_port)
        yield c, mqtt, amqp_port
    finally:
        amqp.stop()
        c.stop()


def test_mqtt_and_amqp_gateway_processes_share_one_message(cluster):
    c, mqtt_gw, amqp_port = cluster
    conn = pika.BlockingConnection(params(amqp_port))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        q = "proc-" + uid()
        ch.queue_declare(q)
        ch.queue_bind(q, "amq.topic", "dev.*.state")  # waits until the MQTT gateway has it
        sub = Client(mqtt_gw.port, "proc-sub-" + uid())
        sub.connect()
        sub.subscribe("dev/+/cmd", qos=1)  # waits until the AMQP gateway has it
        pub = Client(mqtt_gw.port, "proc-pub-" + uid())
        pub.connect()
        token = uid().encode()
        p = props(PacketTypes.PUBLISH, ContentType="text/plain", UserProperty=[("k", "v")])
        assert pub.publish("dev/d1/state", b"on " + token, qos=1, properties=p) == 0
        method, properties, body = _get(ch, q, timeout=30)
        assert (method.routing_key, body) == ("dev.d1.state", b"on " + token)
        assert properties.content_type == "text/plain" and properties.headers["k"] == "v"
        assert len(_read_store(c.namesrv_addr, MQTT_STORE, token)) == 1

        ch.basic_publish("amq.topic", "dev.d1.cmd", b"off " + token, properties=pika.
                         BasicProperties(delivery_mode=2, correlation_id="r1"))
        m = sub.receive_one(timeout=30)
        assert (m.topic, m.payload, m.qos) == ("dev/d1/cmd", b"off " + token, 1)
        assert m.properties.CorrelationData == b"r1"
        assert len(_read_store(c.namesrv_addr, AMQP_STORE, token)) == 1
        for client in (sub, pub):
            client.disconnect()
    finally:
        if conn.is_open:
            conn.close()


SWITCH_LINE = "other gateways write the LMQs too"


def _interleave(mqtt_port: int, amqp_port: int, n: int = 15) -> None:
    """MQTT and AMQP publishes to one topic, alternating: the subscriber gets them all."""
    sub = Client(mqtt_port, "mix-sub-" + uid())
    sub.connect()
    topic = f"mix/{uid()}"
    sub.subscribe(topic, qos=1)
    pub = Client(mqtt_port, "mix-pub-" + uid())
    pub.connect()
    conn = pika.BlockingConnection(params(amqp_port))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        sent = []
        for i in range(n):
            sent.append(b"m%d" % i)
            assert pub.publish(topic, sent[-1], qos=1) == 0
            sent.append(b"a%d" % i)
            ch.basic_publish("amq.topic", topic.replace("/", "."), sent[-1],
                             properties=pika.BasicProperties(delivery_mode=2))
        assert [m.payload for m in sub.receive(len(sent), timeout=30)] == sent
    finally:
        conn.close()
        sub.disconnect()
        pub.disconnect()


class ServeWithInnerProperties(BothGateways):
    """`lmq serve` whose broker lets a separate `lmq amqp` set INNER_MULTI_DISPATCH."""

    def argv(self) -> list[str]:
        argv = super().argv()
        cfg = self.root / "broker.toml"
        write_toml(cfg, {"broker": dict(BROKER_TEST_CONFIG,
                                        allow_inner_properties_without_acl=True)})
        argv[argv.index("--config") + 1] = str(cfg)
        return argv


def test_embedded_mqtt_with_a_separate_amqp_gateway(tmp_path):
    # The embedded MQTT gateway learns from the route log's members that another
    # process's AMQP gateway may write its LMQs; its own AMQP gateway does not count.
    serve = ServeWithInnerProperties(tmp_path / "serve").start()
    amqp = _Proc(tmp_path, "amqp", ["amqp", "--namesrv-addr", serve.namesrv_addr, "--host",
                                    "127.0.0.1", "--amqp-port", str(port := free_port()),
                                    "--log-level", "INFO"])
    try:
        amqp.start()
        amqp.wait_port(port)
        _interleave(serve.port, port)
    finally:
        amqp.stop()
        serve.stop()


def test_embedded_gateways_switch_to_long_polls_only_when_bridging(tmp_path):
    serve = BothGateways(tmp_path / "serve").start()
    try:
        sub = Client(serve.port, "lazy-sub-" + uid())
        sub.connect()
        sub.subscribe("lazy/#", qos=1)
        pub = Client(serve.port, "lazy-pub-" + uid())
        pub.connect()
        assert pub.publish("lazy/a", b"1", qos=1) == 0
        assert sub.receive_one().payload == b"1"
        assert SWITCH_LINE not in serve.log_tail(100_000)  # its own AMQP gateway: no switch
        conn = pika.BlockingConnection(params(serve.amqp_port))
        conn.channel().basic_publish("amq.topic", "lazy.b", b"2")
        conn.close()
        assert sub.receive_one().payload == b"2"
        assert SWITCH_LINE in serve.log_tail(100_000)
        for c in (sub, pub):
            c.disconnect()
    finally:
        serve.stop()


def test_two_brokers_mqtt_publishes_reach_amqp_queues(tmp_path):
    # MQTT spreads its store by topic over every broker; a publish that reaches an AMQP
    # queue is stored on the first master by name, where `lmq amqp` pops the queue.
    c = Cluster(tmp_path, brokers=2, strict=False).start()
    port = free_port()
    amqp = _Proc(tmp_path, "amqp", ["amqp", "--namesrv-addr", c.namesrv_addr, "--host",
                                    "127.0.0.1", "--amqp-port", str(port), "--log-level",
                                    "INFO"])
    try:
        mqtt_gw = c.gateway()
        amqp.start()
        amqp.wait_port(port)
        conn = pika.BlockingConnection(params(port))
        ch = conn.channel()
        q = "two-" + uid()
        ch.queue_declare(q)
        ch.queue_bind(q, "amq.topic", "spread.#")
        pub = Client(mqtt_gw.port, "two-pub-" + uid())
        pub.connect()
        sent = {b"%d" % i for i in range(16)}  # 16 topics: both brokers' store queues
        for body in sorted(sent):
            assert pub.publish(f"spread/{body.decode()}", body, qos=1) == 0
        got = {_get(ch, q, timeout=30)[2] for _ in sent}
        assert got == sent
        pub.disconnect()
        conn.close()
    finally:
        amqp.stop()
        c.stop()
