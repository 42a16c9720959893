"""$SYS statistics, native readers of MQTT traffic, and `lmq serve` with the gateway."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib

import pytest
import trio

from core.client import ClientInstance, MessageQueue, PullConsumer
from tests.gateway.mqtt.server_harness import (
    Client,
    GatewayServer,
    ServeProcess,
    free_port,
    serve_process,
)


def test_sys_topics_published_and_not_matched_by_hash():
    with GatewayServer(sys_interval_s=0.2) as srv:
        sys_sub = Client(srv.port, "sys-sub", 4)
        sys_sub.subscribe("$SYS/#", 0)
        everything = Client(srv.port, "sys-hash", 4)
        everything.subscribe("#", 0)
        wanted = {"$SYS/broker/uptime", "$SYS/broker/messages/received",
                  "$SYS/broker/bytes/sent", "$SYS/broker/subscriptions/count",
                  "$SYS/broker/retained messages/count", "$SYS/broker/version",
                  "$SYS/broker/clients/connected"}
        seen: dict[str, bytes] = {}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
                wanted <= set(seen) and int(seen["$SYS/broker/clients/connected"]) >= 2):
            m = sys_sub.get()
            seen[m.topic] = m.payload
        assert wanted <= set(seen)
        assert int(seen["$SYS/broker/clients/connected"]) >= 2
        assert everything.none(0.5)
        # Clients may not publish there.
        everything.publish("$SYS/broker/uptime", b"fake", 1)
        sys_sub.disconnect()
        everything.disconnect()


def test_native_consumer_reads_mqtt_traffic_on_the_regular_topic():
    with GatewayServer() as srv:
        pub = Client(srv.port, "native-pub", 5)
        pub.publish("native/topic", b"for spark", 1, retain=True)
        pub.disconnect()
        broker = srv.server.broker
        addr = srv.server.namesrv_addr

        async def read():
            async with ClientInstance(namesrv_addr=addr) as client:
                consumer = PullConsumer(client, "NATIVE_READER")
                found = []
                for q in range(8):
                    mq = MessageQueue("MQTT_MESSAGES", broker.config.broker_name, q)
                    result = await consumer.pull(mq, "*", 0, 32)
                    found += [m for m in result.messages
                              if m.properties.get("MQTT_TOPIC") == "native/topic"]
                return found

        found = trio.run(read)
        assert len(found) == 1
        m = found[0]
        assert m.body == b"for spark"
        assert m.properties["MQTT_QOS"] == "1"
        assert m.properties["MQTT_RETAIN"] == "1"
        assert m.properties["MQTT_CLIENT"] == "native-pub"


@pytest.mark.slow
def test_persistent_session_survives_kill_9_of_lmq_serve():
    with serve_process() as first:
        s = Client(first.mqtt_port, "restart-1", 4, clean=False)
        s.subscribe("restart/#", 1)
        s.disconnect()
        pub = Client(first.mqtt_port, "restart-pub", 4)
        for i in range(20):
            pub.publish("restart/t", b"%d" % i, 1)
        pub.drop()
        time.sleep(0.5)  # > state_flush_interval_s
        first.kill9()
        with first.restarted() as second:
            s = Client(second.mqtt_port, "restart-1", 4, clean=False)
            assert s.flags.session_present is True
            assert [m.payload for m in s.get_all(20)] == [b"%d" % i for i in range(20)]
            assert s.none()
            s.disconnect()


@pytest.mark.slow
def test_inflight_qos1_retransmitted_after_kill_9():
    from gateway.mqtt.packets import Puback, Publish, Suback, Subscribe, Subscription
    from tests.gateway.mqtt.server_harness import RawClient

    with serve_process() as first:
        raw = RawClient(first.mqtt_port, 4)
        raw.connect("restart-inflight", clean=False)
        raw.send(Subscribe(1, (Subscription("rif/t", 1),)))
        raw.recv_type(Suback)
        pub = Client(first.mqtt_port, "rif-pub", 4)
        pub.publish("rif/t", b"unacked", 1)
        held = raw.recv_type(Publish)
        time.sleep(0.5)
        first.kill9()
        raw.close()
        with first.restarted() as second:
            raw = RawClient(second.mqtt_port, 4)
            assert raw.connect("restart-inflight", clean=False).session_present
            again = raw.recv_type(Publish)
            assert again.dup and again.packet_id == held.packet_id
            assert again.payload == b"unacked"
            raw.send(Puback(again.packet_id))
            raw.close()


@pytest.mark.slow
def test_lmq_serve_no_mqtt_and_taken_port():
    d = tempfile.mkdtemp(prefix="lmq-mqtt-test-")
    try:
        p = ServeProcess(d, extra=["--no-mqtt"])
        with pytest.raises(RuntimeError):
            p.start(timeout=6)  # never opens the MQTT port
        p.stop()
        # A taken MQTT port leaves the broker running (one error line).
        import socket

        blocker = socket.socket()
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        q = ServeProcess(d)
        q.mqtt_port = blocker.getsockname()[1]
        q.start()  # the port answers (the blocker's backlog): we only check the process
        # The gateway starts after the name server and broker: wait for its error line (a
        # loaded machine can take seconds), then check the server is still running.
        deadline = time.monotonic() + 60
        while "MQTT gateway not started" not in open(q.log_path).read():
            assert q.proc.poll() is None, "lmq serve exited"
            assert time.monotonic() < deadline, "no 'MQTT gateway not started' line"
            time.sleep(0.1)
        assert q.proc.poll() is None
        q.stop()
        blocker.close()
        assert free_port()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_two_brokers_every_message_delivered_once():
    with GatewayServer(extra_brokers=1) as srv:
        gw = srv.gateway
        # The second broker registers after the gateway started: it is picked up by the
        # cluster refresh (forced here rather than waiting 30 s).
        assert trio.from_thread.run(gw.link.refresh_cluster, trio_token=srv._token) is None
        assert len(gw.link.brokers) == 2
        sub = Client(srv.port, "multi-sub", 5)
        sub.subscribe("multi/#", 1)
        sub.subscribe("multi/+/x", 1)  # overlapping: still one delivery per message
        pub = Client(srv.port, "multi-pub", 5)
        topics = [f"multi/{i}/x" for i in range(16)]
        for n in range(3):
            for t in topics:
                pub.publish(t, f"{t}:{n}".encode(), 1)
        got = sub.get_all(48)
        assert sub.none()
        assert sorted(m.payload for m in got) == sorted(
            f"{t}:{n}".encode() for t in topics for n in range(3))
        brokers_used = {gw.link.queues[zlib.crc32(t.encode()) % 16][0] for t in topics}
        assert len(brokers_used) == 2
        for t in topics:  # per-topic order
            assert [m.payload for m in got if m.topic == t] == [f"{t}:{n}".encode()
                                                              for n in range(3)]
        sub.disconnect()
        pub.disconnect()


@pytest.mark.slow
def test_standalone_gateway_over_tcp():
    from tests.gateway.mqtt.server_harness import REPO

    d = tempfile.mkdtemp(prefix="lmq-mqtt-test-")
    brokers = ServeProcess(d, extra=["--no-mqtt"])
    gateway = None
    try:
        brokers.mqtt_port = brokers.broker_port  # "ready" = the broker port answers
        brokers.start()
        port = free_port()
        log = open(os.path.join(d, "gateway.log"), "ab")
        gateway = subprocess.Popen(
            [sys.executable, "-m", "lmq", "mqtt", "--namesrv-addr",
             f"127.0.0.1:{brokers.namesrv_port}", "--data-dir", os.path.join(d, "gw"),
             "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                sub = Client(port, "standalone-sub", 5)
                break
            except (OSError, Exception):
                assert time.monotonic() < deadline, open(os.path.join(d, "gateway.log")).read()
                time.sleep(0.3)
        sub.subscribe("standalone/#", 1)
        pub = Client(port, "standalone-pub", 5)
        for i in range(10):
            pub.publish("standalone/t", b"%d" % i, 1)
        assert [m.payload for m in sub.get_all(10)] == [b"%d" % i for i in range(10)]
        sub.disconnect()
        pub.disconnect()
    finally:
        if gateway is not None:
            gateway.terminate()
            gateway.wait(30)
        brokers.stop()
        shutil.rmtree(d, ignore_errors=True)
