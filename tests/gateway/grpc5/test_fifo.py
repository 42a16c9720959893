"""FIFO consumer groups through the gRPC front end (docs/grpc.md "FIFO", docs/pop.md
"FIFO message groups"): Settings say fifo for a group with consumeMessageOrderly; the
official SimpleConsumer and PushConsumer see each message group in order, and a message
not acknowledged holds back its own group only."""

from __future__ import annotations

import json

import grpc
import pytest

from core.remoting.codes import RequestCode
from gateway.grpc5.proto import messaging_pb2 as pb
from gateway.grpc5.proto import messaging_pb2_grpc as pbg
from tests.gateway.grpc5.harness import GrpcCluster, drive, finish_driver, start_driver

FIFO_GROUPS = ("G_fifo_simple", "G_fifo_push", "G_fifo_wire", "G_fifo_natural")


def make_fifo(cluster: GrpcCluster, group: str) -> None:
    """Mark `group` FIFO as `mqadmin updateSubGroup -o true` does."""
    addr = cluster.server.broker.broker_addr
    client = cluster.service.server.client
    body = json.dumps({"groupName": group, "consumeMessageOrderly": True}).encode()

    async def run() -> None:
        await client.api.call(addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, body)

    cluster.call(run)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with GrpcCluster(tmp_path_factory.mktemp("fifo")) as c:
        for group in FIFO_GROUPS:  # before any Settings (the front end caches the table)
            make_fifo(c, group)
        for topic in ("T_fifo_simple", "T_fifo_push", "T_fifo_wire", "T_fifo_natural"):
            c.create_topic(topic)
        yield c


def _settings_fifo(cluster: GrpcCluster, group: str) -> bool:
    cmd = pb.TelemetryCommand()
    cmd.settings.client_type = pb.SIMPLE_CONSUMER
    cmd.settings.subscription.group.name = group
    cmd.settings.subscription.subscriptions.add().topic.name = "T_fifo_wire"
    with grpc.insecure_channel(cluster.endpoint) as channel:
        call = pbg.MessagingServiceStub(channel).Telemetry(
            iter([cmd]), metadata=(("x-mq-client-id", f"fifo-{group}"),), timeout=10)
        reply = next(iter(call))
        call.cancel()
    assert reply.status.code == pb.OK
    return reply.settings.subscription.fifo


def test_settings_say_fifo_for_a_fifo_group_only(cluster):
    assert _settings_fifo(cluster, "G_fifo_wire") is True
    assert _settings_fifo(cluster, "G_plain_wire") is False


def _start(py: str, cluster: GrpcCluster, topic: str, group: str) -> None:
    """The group's read position (a new group starts at the end of the queues)."""
    drive(py, endpoint=cluster.endpoint, op="simple", topic=topic, group=group, want=0,
          await_s=1, then_empty=True)


def test_unacked_message_blocks_its_group_only_and_comes_back_first(rmq5_python, cluster):
    topic, group = "T_fifo_simple", "G_fifo_simple"
    _start(rmq5_python, cluster, topic, group)
    n = 4
    bodies = [f"{g}-{i}" for i in range(n) for g in ("a", "b", "c")]
    drive(rmq5_python, endpoint=cluster.endpoint, op="produce", topic=topic,
          bodies=bodies, group_of=["ga", "gb", "gc"])
    got = drive(rmq5_python, endpoint=cluster.endpoint, op="fifo_simple", topic=topic,
                group=group, hold="ga", others=2 * n, want=3 * n + 1, invisible_s=60,
                deadline_s=40)
    seq = got["sequence"]
    cut = seq.index("released")  # after the other groups were all received
    before, after = seq[:cut], seq[cut + 1:]
    # While a-0 was held (60 s invisible), b and c went on to the end; a stopped.
    assert [m["body"] for m in before if m["group"] == "ga"] == ["a-0"]
    for g, p in (("gb", "b"), ("gc", "c")):
        assert [m["body"] for m in before if m["group"] == g] == [f"{p}-{i}" for i in range(n)]
    # Visible again: a-0 comes back (second attempt) before the rest of its group.
    assert [(m["body"], m["attempt"]) for m in after] == \
        [("a-0", 2)] + [(f"a-{i}", 1) for i in range(1, n)]


@pytest.mark.slow  # ~10 s: waits for a 4 s invisible time to pass
def test_redelivery_after_invisible_time_keeps_group_order(rmq5_python, cluster):
    topic, group = "T_fifo_natural", "G_fifo_natural"
    _start(rmq5_python, cluster, topic, group)
    n = 3
    drive(rmq5_python, endpoint=cluster.endpoint, op="produce", topic=topic,
          bodies=[f"{g}-{i}" for i in range(n) for g in ("a", "b")], group_of=["ga", "gb"])
    got = drive(rmq5_python, endpoint=cluster.endpoint, op="fifo_simple", topic=topic,
                group=group, hold="ga", others=n, want=2 * n + 1, invisible_s=4,
                natural=True, deadline_s=40)
    seq = got["sequence"]
    a = [(m["body"], m["attempt"]) for m in seq if m["group"] == "ga"]
    # a-0 not acknowledged: after its 4 s it comes again, and only then the rest of a.
    assert a == [("a-0", 1), ("a-0", 2)] + [(f"a-{i}", 1) for i in range(1, n)]
    assert [m["body"] for m in seq if m["group"] == "gb"] == [f"b-{i}" for i in range(n)]


def test_push_consumer_gets_fifo_settings_and_group_order(rmq5_python, cluster):
    topic, group = "T_fifo_push", "G_fifo_push"
    _start(rmq5_python, cluster, topic, group)
    n = 5
    proc = start_driver(rmq5_python, endpoint=cluster.endpoint, op="push", topic=topic,
                        group=group, want=3 * n, sleep_s=0.05, deadline_s=40)
    try:
        assert '"ready"' in proc.stdout.readline()
        drive(rmq5_python, endpoint=cluster.endpoint, op="produce", topic=topic,
              bodies=[f"{g}-{i}" for i in range(n) for g in ("a", "b", "c")],
              group_of=["ga", "gb", "gc"])
        got = finish_driver(proc)
    finally:
        proc.kill()
    assert got["fifo"] is True
    for g, p in (("ga", "a"), ("gb", "b"), ("gc", "c")):
        assert [m["body"] for m in got["messages"] if m["group"] == g] == \
            [f"{p}-{i}" for i in range(n)]
