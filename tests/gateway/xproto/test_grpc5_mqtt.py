"""One message, every protocol (issue 16): the official 5.x client, paho-mqtt and pika on
one `python -m lmq serve` (MQTT, AMQP and gRPC), and a native consumer reading the store
topics (docs/grpc.md "MQTT and AMQP subscribers")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pika
import pytest

from tests.gateway.grpc5.harness import drive, wait_port
from tests.gateway.mqtt.e2e_support import (
    BROKER_TEST_CONFIG,
    REPO,
    Client,
    Gateway,
    free_port,
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
from tests.gateway.xproto.test_amq_topic_bridge import amqp as amqp  # noqa: F401 (fixture)
from tests.gateway.xproto.test_amq_topic_bridge import mqtt as mqtt  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(240)


class AllGateways(BothGateways):
    """`lmq serve` with the MQTT, AMQP and RocketMQ 5 gRPC front ends."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.grpc_port = free_port()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def argv(self) -> list[str]:
        argv = super().argv()
        argv.remove("--no-grpc")
        return argv + ["--grpc-port", str(self.grpc_port)]


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    gw = AllGateways(tmp_path_factory.mktemp("xproto5")).start()
    try:
        wait_port(gw.grpc_port, proc=gw.proc)
        yield gw
    finally:
        gw.stop()


@pytest.fixture(scope="session")
def rmq5_python() -> str:
    from lmq.bench._rmq5_venv import VenvError
    from lmq.bench._rmq5_venv import rmq5_python as make

    try:
        return make()
    except VenvError as exc:
        pytest.skip(str(exc))


def test_mqtt_publish_read_by_5x_simple_consumer(rmq5_python, serve, mqtt):
    # A new group starts at the latest offset: join before the publish.
    group = "CG_mq5_" + uid()
    drive(rmq5_python, endpoint=serve.endpoint, op="simple", topic=MQTT_STORE,
          group=group, want=0, await_s=1)
    token = uid()
    # 16: no matching subscribers (only the store topic)
    assert mqtt().publish("plant/p9/temp", f"hot {token}".encode(), qos=1) in (0, 16)
    got = drive(rmq5_python, endpoint=serve.endpoint, op="simple", topic=MQTT_STORE,
                group=group, want=1, await_s=2)
    [m] = [m for m in got["messages"] if token in m["body"]]
    assert m["props"]["MQTT_TOPIC"] == "plant/p9/temp" and m["props"]["MQTT_QOS"] == "1"


def test_5x_send_reaches_mqtt_and_amqp_subscribers_stored_once(rmq5_python, serve, amqp,
                                                                mqtt):
    q = "xp5-" + uid()
    amqp.queue_declare(q)
    amqp.queue_bind(q, "amq.topic", "fleet.*.cmd")
    sub = mqtt()
    sub.subscribe("fleet/+/cmd", qos=1)
    token = uid()
    # Sent at once after the SUBACK: the front end reads the routes before the send.
    drive(rmq5_python, endpoint=serve.endpoint, op="produce", topic=MQTT_STORE,
          bodies=[f"stop {token}"], props={"MQTT_TOPIC": "fleet/t7/cmd", "origin": "grpc"})

    m = sub.receive_one()
    assert m.payload == f"stop {token}".encode() and m.topic == "fleet/t7/cmd"
    assert m.qos == 1  # a 5.x send is QoS 1 unless it says MQTT_QOS
    assert ("origin", "grpc") in m.properties.UserProperty
    method, properties, body = _get(amqp, q)
    assert body == f"stop {token}".encode()
    assert method.exchange == "amq.topic" and method.routing_key == "fleet.t7.cmd"
    assert properties.headers["origin"] == "grpc" and properties.delivery_mode == 2

    # One stored copy: on the MQTT store topic, none on the AMQP one.
    stored = _read_store(serve.namesrv_addr, MQTT_STORE, token.encode())
    assert len(stored) == 1
    assert stored[0].properties["MQTT_TOPIC"] == "fleet/t7/cmd"
    assert _read_store(serve.namesrv_addr, AMQP_STORE, token.encode()) == []


def test_5x_sends_interleaved_with_mqtt_publishes_all_arrive(rmq5_python, serve, mqtt):
    # The embedded MQTT gateway predicts the tails of LMQs it alone writes; 5.x sends into
    # them make it read by pulls, or entries would be skipped.
    topic = f"mix5/{uid()}"
    sub = mqtt()
    sub.subscribe(topic, qos=1)
    pub = mqtt()
    sent = []
    for i in range(3):
        sent.append(b"m%d" % i)
        assert pub.publish(topic, sent[-1], qos=1) == 0
        bodies = [f"g{i}-{j}" for j in range(2)]
        drive(rmq5_python, endpoint=serve.endpoint, op="produce", topic=MQTT_STORE,
              bodies=bodies, props={"MQTT_TOPIC": topic, "MQTT_QOS": "0"})
        sent += [b.encode() for b in bodies]
    assert [m.payload for m in sub.receive(len(sent))] == sent


def test_5x_send_with_a_bad_mqtt_topic_is_refused(rmq5_python, serve, mqtt):
    sub = mqtt()
    sub.subscribe("bad/#", qos=1)
    for props in ({"MQTT_TOPIC": "bad/+/x"}, {"MQTT_TOPIC": "bad/x", "MQTT_QOS": "3"},
                  {"MQTT_TOPIC": "bad/x", "MQTT_RETAIN": "1"}):
        with pytest.raises(AssertionError, match="driver failed"):
            drive(rmq5_python, endpoint=serve.endpoint, op="produce", topic=MQTT_STORE,
                  bodies=["x"], props=props, timeout=60)
    sub.nothing(1.0)


def test_other_topics_are_not_mqtt_traffic(rmq5_python, serve, amqp, mqtt):
    # MQTT_TOPIC on any other topic is an ordinary user property.
    sub = mqtt()
    sub.subscribe("plain5/#", qos=1)
    token = uid()
    drive(rmq5_python, endpoint=serve.endpoint, op="produce", topic="Plain5Topic",
          bodies=[token], props={"MQTT_TOPIC": "plain5/a"})
    sub.nothing(1.0)
    amqp.basic_publish("amq.topic", "plain5.a", b"marker",
                       properties=pika.BasicProperties(delivery_mode=2))
    assert sub.receive_one().payload == b"marker"


class OpenBroker(Gateway):
    """`lmq serve` (MQTT only) whose broker lets TCP clients set INNER_MULTI_DISPATCH
    without ACL (docs/acl.md §4), as a separate `lmq proxy` needs."""

    def argv(self) -> list[str]:
        argv = super().argv()
        write_toml(self.root / "broker.toml", {"broker": {
            **BROKER_TEST_CONFIG, "allow_inner_properties_without_acl": True}})
        return argv


@pytest.mark.slow  # ~15 s: a server and a proxy of their own
def test_lmq_proxy_sends_reach_an_embedded_mqtt_gateway(rmq5_python, tmp_path):
    # A separate `lmq proxy`: the MQTT gateway of `lmq serve` learns from the route log's
    # members that its LMQs have another writer.
    gw = OpenBroker(tmp_path).start()
    port = free_port()
    proxy = None
    try:
        proxy = subprocess.Popen(
            [sys.executable, "-m", "lmq", "proxy", "--namesrv-addr", gw.namesrv_addr,
             "--grpc-port", str(port)], cwd=REPO, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        wait_port(port, proc=proxy)
        topic = f"px/{uid()}"
        sub = Client(gw.port, "px-" + uid())
        sub.connect()
        pub = Client(gw.port, "px-" + uid())
        pub.connect()
        sub.subscribe(topic, qos=1)
        sent = []
        for i in range(3):
            sent.append(b"m%d" % i)
            assert pub.publish(topic, sent[-1], qos=1) == 0
            drive(rmq5_python, endpoint=f"127.0.0.1:{port}", op="produce",
                  topic=MQTT_STORE, bodies=[f"p{i}"], props={"MQTT_TOPIC": topic})
            sent.append(b"p%d" % i)
        assert [m.payload for m in sub.receive(len(sent))] == sent
        sub.close()
        pub.close()
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait(30)
        gw.stop()
