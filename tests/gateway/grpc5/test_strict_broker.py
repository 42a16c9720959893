"""The gRPC front end in front of a broker that speaks only Apache RocketMQ 5's codes (ours
in `apache_strict` mode): ForwardMessageToDeadLetterQueue falls back from the private
POP_DEAD_LETTER to Apache's way (docs/grpc.md, "In front of an Apache RocketMQ 5 broker")."""

from __future__ import annotations

import logging
import uuid

import grpc
import pytest
import trio

from gateway.grpc5.proto import messaging_pb2 as pb
from gateway.grpc5.proto import messaging_pb2_grpc as pbg
from tests.gateway.grpc5.harness import GrpcCluster
from tests.gateway.grpc5.test_wire import receive_request

pytestmark = pytest.mark.timeout(120)

META = (("x-mq-client-id", "strict-test-client"),)


def _receive(stub, group: str, topic: str, wait_s: float) -> list[pb.Message]:
    req = receive_request(group, topic, invisible_s=1, wait_ms=int(wait_s * 1000))
    frames = list(stub.ReceiveMessage(req, metadata=META, timeout=wait_s + 10))
    return [f.message for f in frames if f.WhichOneof("content") == "message"]


def _forward(stub, group: str, topic: str, m: pb.Message) -> int:
    fwd = pb.ForwardMessageToDeadLetterQueueRequest(
        receipt_handle=m.system_properties.receipt_handle,
        message_id=m.system_properties.message_id, delivery_attempt=1,
        max_delivery_attempts=1)
    fwd.group.name = group
    fwd.topic.name = topic
    return stub.ForwardMessageToDeadLetterQueue(fwd, metadata=META, timeout=10).status.code


def _dlq_bodies(cluster: GrpcCluster, group: str) -> list[bytes]:
    async def read(client):
        addr = cluster.server.broker.broker_addr
        topic = f"%DLQ%{group}"
        with trio.fail_after(10):
            while True:
                try:
                    if await client.api.get_max_offset(addr, topic, 0) >= 1:
                        break
                except Exception:  # noqa: BLE001 - not created yet
                    pass
                await trio.sleep(0.05)
        # Whatever came in since: a second copy would be a bug (one message forwarded).
        await trio.sleep(0.3)
        from core.client.pop_consumer import INIT_MODE_MIN, PopClient

        pop = PopClient(client.remoting, addr, cluster.server.broker.config.broker_name,
                        "G_dlq_reader")
        result = await pop.pop(topic, max_nums=8, init_mode=INIT_MODE_MIN, queue_id=0)
        return [m.body for m in result.messages]

    return cluster.with_client(read)


def test_forward_to_dead_letter_queue_on_a_strict_broker(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="gateway.grpc5.backend")
    with GrpcCluster(tmp_path, apache_strict=True) as cluster, \
            grpc.insecure_channel(cluster.endpoint) as channel:
        cluster.create_topic("S")
        stub = pbg.MessagingServiceStub(channel)
        assert _receive(stub, "G_s", "S", 0) == []  # the group starts here
        for body in (b"poison-1", b"poison-2"):
            msg = pb.Message(body=body)
            msg.topic.name = "S"
            msg.system_properties.message_id = uuid.uuid4().hex
            msg.system_properties.message_type = pb.NORMAL
            sent = stub.SendMessage(pb.SendMessageRequest(messages=[msg]), metadata=META,
                                    timeout=10)
            assert sent.status.code == pb.OK
        got: list[pb.Message] = []
        while len(got) < 2:
            got += _receive(stub, "G_s", "S", 3)
        assert [_forward(stub, "G_s", "S", m) for m in got] == [pb.OK, pb.OK]
        # Acknowledged in the group: the handle is spent, and nothing comes back once the
        # invisible time (1 s) has passed.
        assert _forward(stub, "G_s", "S", got[0]) == pb.INVALID_RECEIPT_HANDLE
        assert _receive(stub, "G_s", "S", 2.5) == []
        assert sorted(_dlq_bodies(cluster, "G_s")) == [b"poison-1", b"poison-2"]
    refusals = [r for r in caplog.records if "POP_DEAD_LETTER" in r.getMessage()]
    assert len(refusals) == 1  # one warning, then the Apache path at once
