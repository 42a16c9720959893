"""autoCreateTopicEnable per command: on for `lmq serve`, off for `lmq broker`; the native
client and the MQTT gateway work with it off (they create their topics explicitly)."""

from __future__ import annotations

import pytest
from trio.testing import trio_test

from core.client import AdminClient, ClientInstance, Message, Producer, SendStatus
from core.client.errors import MQClientError
from tests.core.broker.harness import ServerProcess, send_request, sync_invoke
from tests.core.client.cluster import cluster

SUCCESS = 0
TOPIC_NOT_EXIST = 17


def test_serve_auto_creates_and_cluster_broker_does_not(tmp_path):
    with ServerProcess(tmp_path / "a") as a:
        assert sync_invoke(a.broker_addr, send_request("ServeNew")).code == SUCCESS
        with ServerProcess(tmp_path / "b", namesrv_addr=a.namesrv_addr,
                           broker_name="broker-b") as b:
            resp = sync_invoke(b.broker_addr, send_request("ClusterNew"))
            assert resp.code == TOPIC_NOT_EXIST and "not exist" in resp.remark
        # The config file still turns it on for a cluster broker.
        with ServerProcess(tmp_path / "c", namesrv_addr=a.namesrv_addr, broker_name="broker-c",
                           config_text="auto_create_topic_enable = true\n") as c:
            assert sync_invoke(c.broker_addr, send_request("ClusterNew")).code == SUCCESS


@trio_test
async def test_native_producer_without_auto_create():
    async with cluster(auto_create_topic_enable=False) as c, \
            ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        async with Producer(client, "PG_NOAUTO", send_timeout=5) as p:
            with pytest.raises(MQClientError):
                await p.send(Message("NotCreated", b"x"))
            await AdminClient(client).topic_create("Created", read_queue_nums=2,
                                                   write_queue_nums=2)
            r = await p.send(Message("Created", b"x"))
            assert r.status is SendStatus.SEND_OK


def test_mqtt_gateway_without_auto_create(tmp_path):
    pytest.importorskip("paho.mqtt")
    from tests.gateway.mqtt.e2e_support import BROKER_TEST_CONFIG, Client, Gateway, write_toml

    class NoAutoCreate(Gateway):
        def argv(self) -> list[str]:
            argv = super().argv()
            write_toml(self.root / "broker.toml",
                       {"broker": {**BROKER_TEST_CONFIG, "auto_create_topic_enable": False}})
            return argv

    gw = NoAutoCreate(tmp_path / "gw").start()
    sub, pub = Client(gw.port, version=5), Client(gw.port, version=4)
    try:
        assert sync_invoke(f"127.0.0.1:{gw.broker_port}", send_request("NoAuto")).code == \
            TOPIC_NOT_EXIST
        sub.connect()
        sub.subscribe("plant/+/temp", qos=1)
        pub.connect()
        pub.publish("plant/7/temp", b"stored", qos=1)
        assert sub.receive_one().payload == b"stored"
    finally:
        sub.close()
        pub.close()
        gw.stop()
