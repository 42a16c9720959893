"""The `authorization` header (MQv2-HMAC-SHA1) of the official 5.x client, checked
against the broker's 4.x ACL accounts when ACL is on (docs/grpc.md "Authentication")."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime, timedelta

import grpc
import pytest

from gateway.grpc5.proto import messaging_pb2 as pb
from gateway.grpc5.proto import messaging_pb2_grpc as pbg
from tests.gateway.grpc5.harness import GrpcCluster, drive

ACL = """
[[accounts]]
accessKey = "app-one"
secretKey = "secret-one"
defaultTopicPerm = "DENY"
defaultGroupPerm = "DENY"
topicPerms = ["T_acl=PUB|SUB", "T_closed=DENY", "T_ro=SUB"]
groupPerms = ["G_acl=SUB"]
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("acl")
    (d / "acl.toml").write_text(ACL)
    with GrpcCluster(d, acl_enable=True, acl_file=str(d / "acl.toml")) as c:
        c.create_topic("T_acl")
        c.create_topic("T_closed")
        c.create_topic("T_ro")
        yield c


def _auth(ak: str, sk: str, when: datetime) -> tuple[tuple[str, str], ...]:
    date = when.strftime("%Y%m%dT%H%M%SZ")
    sig = hmac.new(sk.encode(), date.encode(), hashlib.sha1).hexdigest()
    return (("x-mq-date-time", date), ("x-mq-client-id", "acl-test"),
            ("authorization", f"MQv2-HMAC-SHA1 Credential={ak}, "
                              f"SignedHeaders=x-mq-date-time, Signature={sig}"))


def _route(cluster, metadata) -> int:
    with grpc.insecure_channel(cluster.endpoint) as channel:
        resp = pbg.MessagingServiceStub(channel).QueryRoute(
            pb.QueryRouteRequest(topic=pb.Resource(name="T_acl")), metadata=metadata,
            timeout=10)
    return resp.status.code


def test_official_client_with_its_account(rmq5_python, cluster):
    creds = {"ak": "app-one", "sk": "secret-one"}
    drive(rmq5_python, endpoint=cluster.endpoint, op="simple", topic="T_acl",
          group="G_acl", want=0, await_s=1, then_empty=True, **creds)
    drive(rmq5_python, endpoint=cluster.endpoint, op="produce", topic="T_acl",
          bodies=["signed"], **creds)
    got = drive(rmq5_python, endpoint=cluster.endpoint, op="simple", topic="T_acl",
                group="G_acl", want=1, await_s=2, **creds)
    assert [m["body"] for m in got["messages"]] == ["signed"]


def test_wrong_secret_and_missing_rights_are_refused(rmq5_python, cluster):
    # The client's first call (QueryRoute) is refused: it cannot start.
    with pytest.raises(AssertionError, match="route"):
        drive(rmq5_python, endpoint=cluster.endpoint, op="produce", topic="T_acl",
              bodies=["x"], ak="app-one", sk="not-the-secret")
    with pytest.raises(AssertionError, match="route"):
        drive(rmq5_python, endpoint=cluster.endpoint, op="produce", topic="T_closed",
              bodies=["x"], ak="app-one", sk="secret-one")
    # May subscribe but not publish: the send itself is refused with FORBIDDEN.
    with pytest.raises(AssertionError, match="40300"):
        drive(rmq5_python, endpoint=cluster.endpoint, op="produce", topic="T_ro",
              bodies=["x"], ak="app-one", sk="secret-one")


def test_header_checks(cluster):
    now = datetime.now(UTC)
    assert _route(cluster, _auth("app-one", "secret-one", now)) == pb.OK
    assert _route(cluster, (("x-mq-client-id", "c"),)) == pb.UNAUTHORIZED  # no header
    assert _route(cluster, _auth("nobody", "secret-one", now)) == pb.UNAUTHORIZED
    # A captured header stops working: the date it signs must be near our clock.
    old = _auth("app-one", "secret-one", now - timedelta(hours=1))
    assert _route(cluster, old) == pb.UNAUTHORIZED
    wrong = _auth("app-one", "not-the-secret", now)
    assert _route(cluster, wrong) == pb.UNAUTHORIZED
    bad = (("x-mq-date-time", "yesterday"), ("authorization", "MQv2-HMAC-SHA1 garbage"))
    assert _route(cluster, bad) == pb.UNAUTHORIZED
