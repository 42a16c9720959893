"""RecallMessage through the gRPC front end (docs/grpc.md "RecallMessage"): the official
producer recalls a delayed message with its receipt's recall handle, and it is never
delivered; a recall after the delivery time, or with a malformed handle, is refused."""

from __future__ import annotations

import grpc
import pytest

from gateway.grpc5.proto import messaging_pb2 as pb
from gateway.grpc5.proto import messaging_pb2_grpc as pbg
from tests.gateway.grpc5.harness import GrpcCluster, drive


def _recall(cluster: GrpcCluster, topic: str, handle: str) -> pb.RecallMessageResponse:
    req = pb.RecallMessageRequest(recall_handle=handle)
    req.topic.name = topic
    with grpc.insecure_channel(cluster.endpoint) as channel:
        return pbg.MessagingServiceStub(channel).RecallMessage(req, timeout=10)


@pytest.mark.slow  # ~10 s: the 5 s delay level (the broker side: tests/core/broker/test_recall.py)
def test_recalled_delayed_message_is_never_delivered(rmq5_python, tmp_path):
    topic, group = "T_recall", "G_recall"
    with GrpcCluster(tmp_path) as cluster:
        cluster.create_topic(topic)
        drive(rmq5_python, endpoint=cluster.endpoint, op="simple", topic=topic, group=group,
              want=0, await_s=1, then_empty=True)
        # Both wait on the same delay level (2 s asked: the 5 s level), "gone" first.
        sent = drive(rmq5_python, endpoint=cluster.endpoint, op="recall", topic=topic,
                     bodies=["gone", "stays"], delay_s=2, recall=["gone"])["sent"]
        gone, stays = sent
        assert gone.get("error") is None and gone["recalled"] == gone["id"]
        assert gone["handle"] and stays["handle"]
        got = drive(rmq5_python, endpoint=cluster.endpoint, op="simple", topic=topic,
                    group=group, want=1, await_s=2, deadline_s=20, then_empty=True)
        # "stays" was delivered after "gone" came due: "gone" was dropped, not late.
        assert [m["body"] for m in got["messages"]] == ["stays"]
        assert got["events"] == ["extra:0"]
        # Too late: "stays" was delivered; and a handle that is not one.
        late = _recall(cluster, topic, stays["handle"])
        assert late.status.code == pb.BAD_REQUEST
        assert _recall(cluster, topic, "not-a-handle").status.code == pb.BAD_REQUEST
        assert _recall(cluster, "T_other", gone["handle"]).status.code != pb.OK
