"""Broker ACL beside the MQTT gateway: the reserved-property right keeps native producers
out of MQTT subscribers' LMQs, and a stand-alone gateway signs with its own account."""

from __future__ import annotations

import os
import tempfile

import pytest
import trio

from core.client import ClientInstance, Message, MQClientError, Producer
from core.common.properties import MessageConst
from gateway.mqtt.config import MqttConfig
from gateway.mqtt.embedded import MqttService, run_standalone
from tests.core.acl.acl_cluster import GATEWAY, USER, acl_cluster
from tests.trio_thread import TrioThread

pytest.importorskip("paho.mqtt.client")
from tests.gateway.mqtt.server_harness import Client  # noqa: E402

MQTT_ACL = """\
deny    publish   any secret/#
allow   publish   any #
allow   subscribe any #
"""

# The attacker's account may publish anywhere (PUB|SUB by default) but has no right to
# the reserved properties.
ATTACKER_ACL = f"""
[[accounts]]
accessKey = "{USER[0]}"
secretKey = "{USER[1]}"
defaultTopicPerm = "PUB|SUB"
defaultGroupPerm = "PUB|SUB"

# A stand-alone gateway creates its store topic on every broker at start: admin.
[[accounts]]
accessKey = "{GATEWAY[0]}"
secretKey = "{GATEWAY[1]}"
admin = true

[[accounts]]
accessKey = "lmqadmin"
secretKey = "admin-secret-1"
admin = true
"""


class ThreadedAclGateway(TrioThread):
    """Broker + name server with ACL, an embedded MQTT gateway, and optionally a
    stand-alone gateway reaching them over TCP, in a background trio thread."""

    def __init__(self, standalone: bool = False) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="lmq-acl-mqtt-")
        acl = os.path.join(self.root, "mqtt.acl")
        with open(acl, "w") as fh:
            fh.write(MQTT_ACL)
        self.mqtt = MqttService(MqttConfig(host="127.0.0.1", port=0, sys_interval_s=0, gc_freeze_at_start=False,
                                           acl_file=acl))
        self.standalone = standalone
        self.standalone_gateway = None

    def __enter__(self) -> ThreadedAclGateway:
        self.start_thread("servers")
        return self

    async def _main(self) -> None:
        self.stop_event = trio.Event()
        async with acl_cluster(ATTACKER_ACL, services=[self.mqtt]) as srv:
            self.srv = srv
            async with trio.open_nursery() as nursery:
                if self.standalone:
                    cfg = MqttConfig(host="127.0.0.1", port=0, sys_interval_s=0, gc_freeze_at_start=False,
                                     data_dir=os.path.join(self.root, "standalone"),
                                     broker_access_key=GATEWAY[0],
                                     broker_secret_key=GATEWAY[1])
                    self.standalone_gateway = await nursery.start(
                        run_standalone, cfg, srv.namesrv_addr)
                self._ready.set()
                await self.stop_event.wait()
                if self.standalone_gateway is not None:
                    self.standalone_gateway.stop()
                self.mqtt.stop()
                nursery.cancel_scope.cancel()

    def __exit__(self, *exc: object) -> None:
        try:
            self.call(self.stop_event.set)
        except trio.RunFinishedError:
            pass
        self._thread.join(60)


def native_send(namesrv: str, who: tuple[str, str], topic: str, props: dict) -> object:
    async def main():
        async with ClientInstance(namesrv_addr=namesrv, access_key=who[0],
                                  secret_key=who[1]) as client:
            async with Producer(client, "PG_ATTACK", retry_times=0) as p:
                try:
                    return await p.send(Message(topic, b"forged", properties=props))
                except MQClientError as exc:
                    return exc

    return trio.run(main)


def test_native_producer_cannot_inject_into_an_mqtt_subscribers_lmq():
    with ThreadedAclGateway() as gw:
        port = gw.mqtt.gateway.ports["tcp"]
        sub = Client(port, "victim")
        assert sub.subscribe("secret/#", qos=1)[1][0] == 1
        lmq = gw.mqtt.gateway.registry.lmq_for("secret/#")
        # The MQTT ACL refuses the publish through the gateway ...
        pub = Client(port, "mallory")
        pub.publish("secret/plans", b"via mqtt", qos=1)
        # ... and the broker refuses the same message sent natively with the LMQ named in
        # the reserved property.
        result = native_send(gw.srv.namesrv_addr, USER, gw.mqtt.config.store_topic, {
            MessageConst.INNER_MULTI_DISPATCH: lmq,
            MessageConst.INNER_MULTI_QUEUE_OFFSET: "0",
            "MQTT_TOPIC": "secret/plans",
        })
        assert isinstance(result, MQClientError), result
        assert "NO_PERMISSION" in str(result)
        assert MessageConst.INNER_MULTI_DISPATCH in str(result)
        assert gw.call(gw.srv.broker.store.max_offset, lmq, 0) == 0
        assert sub.none(0.5)
        # A permitted MQTT publish still reaches the subscriber (the gateway is trusted).
        sub.subscribe("public/#", qos=1)
        pub.publish("public/news", b"hello", qos=1)
        assert sub.get().payload == b"hello"
        sub.disconnect()
        pub.disconnect()


def test_standalone_gateway_signs_with_its_account():
    with ThreadedAclGateway(standalone=True) as gw:
        port = gw.standalone_gateway.ports["tcp"]
        sub = Client(port, "s1")
        sub.subscribe("room/#", qos=1)
        pub = Client(port, "p1")
        pub.publish("room/1", b"over tcp", qos=1)
        assert sub.get().payload == b"over tcp"
        sub.disconnect()
        pub.disconnect()
        assert gw.call(lambda: gw.srv.broker.table.guard.refused) == 0
