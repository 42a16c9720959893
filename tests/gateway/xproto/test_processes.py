"""The amq.topic bridge across processes: `lmq namesrv`, one `lmq broker`, one `lmq mqtt` and one `lmq amqp` (issue 12's done-when: an MQTT publish read by an AMQP
queue bound to amq.topic, from one stored copy; and the way back)."""

from __future__ import annotations

import pika
import pytest

from tests.gateway.amqp.broker_harness import params
from tests.gateway.mqtt.cluster_support import Cluster, _Proc
from tests.gateway.mqtt.e2e_support import Client, PacketTypes, free_port, props, uid
from tests.gateway.xproto.test_amq_topic_bridge import AMQP_STORE, MQTT_STORE, _get, _read_store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("xproto-cluster")
    # Not apache_strict: `lmq amqp` registers a POP holder (900001), a code of ours that
    # strict mode refuses (docs/stateless-gateways.md §4).
    c = Cluster(root, strict=False).start()
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
