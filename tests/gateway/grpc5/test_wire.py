"""The gRPC front end spoken to with plain gRPC stubs (no RocketMQ client): what the
official clients insist on (docs/grpc.md), and refusals with the proxy's status codes."""

from __future__ import annotations

import filecmp
import shutil
import subprocess
import sys
import time
import uuid
import zlib
from pathlib import Path

import grpc
import pytest
import trio

from gateway.grpc5.config import GrpcConfig
from gateway.grpc5.proto import messaging_pb2 as pb
from gateway.grpc5.proto import messaging_pb2_grpc as pbg
from tests.gateway.grpc5.harness import GrpcCluster
from tests.tls_certs import self_signed

BODY_LIMIT = 1024
LITE_QUOTA = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with GrpcCluster(tmp_path_factory.mktemp("wire"),
                     grpc=GrpcConfig(port=0, max_body_size=BODY_LIMIT,
                                     lite_subscription_quota=LITE_QUOTA)) as c:
        c.create_topic("W")
        yield c


@pytest.fixture(scope="module")
def stub(cluster):
    channel = grpc.insecure_channel(cluster.endpoint)
    yield pbg.MessagingServiceStub(channel)
    channel.close()


META = (("x-mq-client-id", "wire-test-client"),)


def _message(topic="W", body=b"hello", **sys_props) -> pb.Message:
    m = pb.Message(body=body)
    m.topic.name = topic
    sp = m.system_properties
    sp.message_id = uuid.uuid4().hex
    sp.message_type = sys_props.pop("message_type", pb.NORMAL)
    for key, value in sys_props.items():
        if key == "delivery_timestamp":
            sp.delivery_timestamp.FromMilliseconds(value)
        else:
            setattr(sp, key, value)
    return m


def receive_request(group: str, topic: str = "W", *, batch: int = 4, invisible_s: int = 10,
                    wait_ms: int = 0) -> pb.ReceiveMessageRequest:
    req = pb.ReceiveMessageRequest(batch_size=batch)
    req.group.name = group
    req.message_queue.topic.name = topic
    req.invisible_duration.FromSeconds(invisible_s)
    req.long_polling_timeout.FromMilliseconds(wait_ms)
    return req


def _send(stub, msg: pb.Message, **user_props) -> pb.SendMessageResponse:
    msg.user_properties.update(user_props)
    return stub.SendMessage(pb.SendMessageRequest(messages=[msg]), metadata=META, timeout=10)


def test_route_advertises_a_reachable_endpoint_and_every_message_type(cluster, stub):
    resp = stub.QueryRoute(pb.QueryRouteRequest(topic=pb.Resource(name="W")), metadata=META,
                           timeout=10)
    assert resp.status.code == pb.OK
    assert len(resp.message_queues) == 4
    for mq in resp.message_queues:
        assert mq.permission == pb.READ_WRITE
        [address] = mq.broker.endpoints.addresses
        assert (address.host, address.port) == ("127.0.0.1", cluster.port)
        assert mq.broker.endpoints.scheme == pb.IPv4
        assert set(mq.accept_message_types) == {pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION,
                                                pb.LITE}


def test_settings_replies_carry_what_clients_need(stub):
    producer = pb.TelemetryCommand()
    producer.settings.client_type = pb.PRODUCER
    producer.settings.publishing.topics.add(name="W")
    consumer = pb.TelemetryCommand()
    consumer.settings.client_type = pb.SIMPLE_CONSUMER
    consumer.settings.subscription.group.name = "G_wire"
    replies = []
    call = stub.Telemetry(iter([producer, consumer]), metadata=META, timeout=10)
    for reply in call:
        replies.append(reply)
        if len(replies) == 2:
            call.cancel()
            break
    p, c = replies
    assert p.status.code == pb.OK and c.status.code == pb.OK
    # Without publishing.max_body_size every send fails in the client ("max size=0").
    assert p.settings.publishing.max_body_size == BODY_LIMIT
    assert p.settings.backoff_policy.max_attempts > 0
    assert c.settings.subscription.long_polling_timeout.seconds > 0
    assert c.settings.subscription.lite_subscription_quota > 0


def test_receive_stream_always_ends_with_a_delivery_timestamp(stub):
    req = receive_request("G_empty")
    req.auto_renew = False
    frames = list(stub.ReceiveMessage(req, metadata=META, timeout=10))
    assert frames[0].status.code == pb.MESSAGE_NOT_FOUND
    assert frames[-1].WhichOneof("content") == "delivery_timestamp"


def test_sent_message_is_received_with_digest_and_handle(stub):
    req = receive_request("G_wire_rx")
    list(stub.ReceiveMessage(req, metadata=META, timeout=10))  # the group starts here
    resp = _send(stub, _message(body=b"payload", tag="t1"), color="blue")
    assert resp.status.code == pb.OK and resp.entries[0].status.code == pb.OK
    req.long_polling_timeout.FromSeconds(3)
    frames = list(stub.ReceiveMessage(req, metadata=META, timeout=10))
    assert [f.WhichOneof("content") for f in frames] == [
        "status", "message", "delivery_timestamp"]
    m = frames[1].message
    assert m.body == b"payload" and m.user_properties["color"] == "blue"
    assert m.system_properties.tag == "t1"
    assert m.system_properties.message_id == resp.entries[0].message_id
    assert m.system_properties.body_digest.type == pb.CRC32
    assert m.system_properties.body_digest.checksum == f"{zlib.crc32(b'payload'):08X}"
    assert m.system_properties.delivery_attempt == 1
    ack = pb.AckMessageRequest(group=req.group, topic=req.message_queue.topic)
    ack.entries.add(message_id=m.system_properties.message_id,
                    receipt_handle=m.system_properties.receipt_handle)
    assert stub.AckMessage(ack, metadata=META, timeout=10).status.code == pb.OK
    again = stub.AckMessage(ack, metadata=META, timeout=10)
    assert again.status.code == pb.INVALID_RECEIPT_HANDLE


@pytest.mark.parametrize(("msg", "props", "code"), [
    (_message(body=b""), {}, pb.MESSAGE_BODY_EMPTY),
    (_message(body=b"x" * (BODY_LIMIT + 1)), {}, pb.MESSAGE_BODY_TOO_LARGE),
    (_message(), {"POP_CK": "0 0 0 0 0 b 0 0"}, pb.ILLEGAL_MESSAGE_PROPERTY_KEY),
    (_message(), {"INNER_MULTI_DISPATCH": "%LMQ%x"}, pb.ILLEGAL_MESSAGE_PROPERTY_KEY),
    # The broker holds a message carrying these (Apache 5's timer properties).
    (_message(), {"TIMER_DELAY_SEC": "60"}, pb.ILLEGAL_MESSAGE_PROPERTY_KEY),
    (_message(), {"TIMER_DELAY_MS": "60000"}, pb.ILLEGAL_MESSAGE_PROPERTY_KEY),
    (_message(message_type=pb.FIFO), {}, pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (_message(message_type=pb.DELAY,
              delivery_timestamp=int(time.time() * 1000) + 4 * 86400_000),
     {}, pb.ILLEGAL_DELIVERY_TIME),
    (_message(tag="a|b"), {}, pb.ILLEGAL_MESSAGE_TAG),
    (_message(topic=""), {}, pb.ILLEGAL_TOPIC),
])
def test_bad_messages_are_refused_with_the_proxy_codes(stub, msg, props, code):
    resp = _send(stub, msg, **props)
    assert resp.status.code == code
    assert resp.entries[0].status.code == code


def test_malformed_receipt_handles_are_refused(stub):
    ack = pb.AckMessageRequest()
    ack.group.name = "G"
    ack.topic.name = "W"
    ack.entries.add(message_id="m", receipt_handle="not a handle")
    assert stub.AckMessage(ack, metadata=META, timeout=10).status.code == \
        pb.INVALID_RECEIPT_HANDLE
    change = pb.ChangeInvisibleDurationRequest(receipt_handle="1 2 3")
    change.group.name = "G"
    change.topic.name = "W"
    change.invisible_duration.FromSeconds(1)
    assert stub.ChangeInvisibleDuration(change, metadata=META, timeout=10).status.code == \
        pb.INVALID_RECEIPT_HANDLE


def test_unknown_topic_is_not_found_without_auto_creation(tmp_path):
    with GrpcCluster(tmp_path, auto_create_topic_enable=False) as c:
        with grpc.insecure_channel(c.endpoint) as channel:
            resp = pbg.MessagingServiceStub(channel).QueryRoute(
                pb.QueryRouteRequest(topic=pb.Resource(name="Nope")), metadata=META,
                timeout=10)
    assert resp.status.code == pb.TOPIC_NOT_FOUND


def test_generated_code_matches_the_proto(tmp_path):
    pytest.importorskip("grpc_tools")
    from gateway.grpc5.proto import generate

    here = Path(generate.__file__).parent
    copy = tmp_path / "gateway" / "grpc5" / "proto"
    copy.mkdir(parents=True)
    shutil.copy(here / "messaging.proto", copy)
    shutil.copy(generate.__file__, copy)
    subprocess.run([sys.executable, "gateway/grpc5/proto/generate.py"], cwd=tmp_path,
                   check=True, capture_output=True)
    for name in ("messaging_pb2.py", "messaging_pb2_grpc.py"):
        assert filecmp.cmp(copy / name, here / name, shallow=False), \
            f"{name} is stale: run python3 -m gateway.grpc5.proto.generate"


def test_lite_subscription_refusals(stub):
    def sync(action, names, client="lite-client"):
        req = pb.SyncLiteSubscriptionRequest(action=action, lite_topic_set=names)
        req.topic.name = "W"
        req.group.name = "G_lite_wire"
        return stub.SyncLiteSubscription(req, metadata=(("x-mq-client-id", client),),
                                         timeout=10).status.code

    assert sync(pb.PARTIAL_ADD, ["s1", "s2"]) == pb.OK
    assert sync(pb.PARTIAL_ADD, ["bad name"]) == pb.ILLEGAL_LITE_TOPIC
    assert sync(pb.PARTIAL_ADD, ["x" * 65]) == pb.ILLEGAL_LITE_TOPIC
    assert sync(pb.PARTIAL_ADD, ["s3", "s4"]) == pb.LITE_SUBSCRIPTION_QUOTA_EXCEEDED
    assert sync(pb.COMPLETE_ADD, ["s3", "s4", "s5"]) == pb.OK  # replaces the set
    assert sync(pb.PARTIAL_REMOVE, ["s3"]) == pb.OK
    assert sync(pb.PARTIAL_ADD, ["s6"]) == pb.OK


def test_lite_message_needs_a_valid_lite_topic(stub):
    msg = _message(message_type=pb.LITE)
    assert _send(stub, msg).status.code == pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    msg = _message(message_type=pb.LITE, lite_topic="no/slash")
    assert _send(stub, msg).status.code == pb.ILLEGAL_LITE_TOPIC


def test_a_cancelled_long_poll_ends_its_broker_side_at_once(cluster, stub):
    """The gRPC call's cancellation reaches the trio task and the broker's held poll."""
    service = cluster.server.broker.pop_service
    cluster.create_topic("W_cancel")  # empty: the poll is held
    req = receive_request("G_cancel", "W_cancel", wait_ms=20_000)
    call = stub.ReceiveMessage(req, metadata=META, timeout=30)
    deadline = time.monotonic() + 10
    while service.polling == 0:  # held in the broker
        assert time.monotonic() < deadline, "the poll was never held"
        time.sleep(0.01)
    call.cancel()
    deadline = time.monotonic() + 5  # well before the 20 s poll would end by itself
    while service.polling:
        assert time.monotonic() < deadline, "the broker still holds the cancelled poll"
        time.sleep(0.01)


def test_tls(tmp_path):
    cert, key = self_signed(tmp_path)
    config = GrpcConfig(port=0, tls_certfile=cert, tls_keyfile=key)
    with GrpcCluster(tmp_path, grpc=config) as c:
        c.create_topic("W")
        creds = grpc.ssl_channel_credentials(root_certificates=Path(cert).read_bytes())
        req = pb.QueryRouteRequest(topic=pb.Resource(name="W"))
        with grpc.secure_channel(c.endpoint, creds) as channel:
            resp = pbg.MessagingServiceStub(channel).QueryRoute(req, metadata=META, timeout=10)
        assert resp.status.code == pb.OK
        with grpc.insecure_channel(c.endpoint) as channel, pytest.raises(grpc.RpcError):
            pbg.MessagingServiceStub(channel).QueryRoute(req, metadata=META, timeout=3)


def test_forward_to_dead_letter_queue(cluster, stub):
    cluster.create_topic("W_dlq")
    req = receive_request("G_dlq", "W_dlq", batch=1, invisible_s=30)
    list(stub.ReceiveMessage(req, metadata=META, timeout=10))  # the group starts here
    assert _send(stub, _message(topic="W_dlq", body=b"poison")).status.code == pb.OK
    req.long_polling_timeout.FromSeconds(3)
    frames = list(stub.ReceiveMessage(req, metadata=META, timeout=10))
    m = frames[1].message
    fwd = pb.ForwardMessageToDeadLetterQueueRequest(
        receipt_handle=m.system_properties.receipt_handle,
        message_id=m.system_properties.message_id, delivery_attempt=1,
        max_delivery_attempts=1)
    fwd.group.name = "G_dlq"
    fwd.topic.name = "W_dlq"
    assert stub.ForwardMessageToDeadLetterQueue(fwd, metadata=META, timeout=10).status.code \
        == pb.OK
    # Parked at once (never delivered again) and stored in the group's DLQ topic.
    again = stub.ForwardMessageToDeadLetterQueue(fwd, metadata=META, timeout=10)
    assert again.status.code == pb.INVALID_RECEIPT_HANDLE

    async def dlq_size(client):
        addr = cluster.server.broker.broker_addr
        for _ in range(100):
            try:
                if await client.api.get_max_offset(addr, "%DLQ%G_dlq", 0) == 1:
                    return 1
            except Exception:  # noqa: BLE001 - not created yet
                pass
            await trio.sleep(0.05)
        return 0

    assert cluster.with_client(dlq_size) == 1


def test_request_frame_limit(stub):
    big = _message(body=b"x" * (GrpcConfig().max_request_bytes + 1))
    with pytest.raises(grpc.RpcError) as info:
        _send(stub, big)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_advertised_host_in_routes(tmp_path):
    with GrpcCluster(tmp_path, grpc=GrpcConfig(port=0, advertise_host="localhost")) as c:
        c.create_topic("A")
        with grpc.insecure_channel(c.endpoint) as channel:
            resp = pbg.MessagingServiceStub(channel).QueryRoute(
                pb.QueryRouteRequest(topic=pb.Resource(name="A")), metadata=META, timeout=10)
    endpoints = resp.message_queues[0].broker.endpoints
    assert endpoints.scheme == pb.DOMAIN_NAME
    assert [(a.host, a.port) for a in endpoints.addresses] == [("localhost", c.port)]
