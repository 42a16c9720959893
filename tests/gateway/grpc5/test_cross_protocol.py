"""One message, two protocols: what the official 5.x client sends over gRPC is read by the
Apache 4.x C++ client (wheel `rocketmq` 0.4.4) and by our native client, and the other
way round (docs/grpc.md "Message mapping")."""

from __future__ import annotations

import pytest

from core.client.pop_consumer import PopClient
from tests.core.broker.harness import Driver
from tests.gateway.grpc5.harness import GrpcCluster, drive

pytest.importorskip("rocketmq.client", reason="the 4.x C++ client wheel is not installed")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with GrpcCluster(tmp_path_factory.mktemp("cross")) as c:
        yield c


def test_grpc_producer_read_by_cpp_and_native_clients(rmq5_python, cluster):
    cluster.create_topic("X_5to4")
    sent = drive(rmq5_python, endpoint=cluster.endpoint, op="produce", topic="X_5to4",
                 bodies=["m0", "m1", "m2"], tag="TagX", keys=["order-7"],
                 props={"origin": "grpc"})
    cpp = Driver("pull_consumer.py", "--namesrv", cluster.namesrv_addr, "--group",
                 "CG_cpp", "--topic", "X_5to4")
    try:
        cpp.wait_for(lambda ev: any(e.get("event") == "done" for e in ev), 60, "C++ pull")
    finally:
        cpp.proc.kill()
    msgs = cpp.of("msg")
    assert sorted(m["body"] for m in msgs) == ["m0", "m1", "m2"]
    assert {m["tags"] for m in msgs} == {"TagX"} and {m["keys"] for m in msgs} == {"order-7"}
    # The 4.x message id is the 5.x one (UNIQ_KEY).
    assert {m["id"] for m in msgs} == set(sent["ids"])

    async def native(client):
        addr = cluster.server.broker.broker_addr
        pc = PopClient(client.remoting, addr, "broker-a", "CG_native")
        got = []
        for _ in range(10):
            r = await pc.pop("X_5to4", max_nums=32, poll_ms=0)
            for m in r.messages:
                got.append(m.message)
                await pc.ack(m)
            if len(got) >= 3:
                break
        return got

    got = cluster.with_client(native)
    assert sorted(m.body for m in got) == [b"m0", b"m1", b"m2"]
    assert {m.properties["origin"] for m in got} == {"grpc"}
    assert {m.msg_id for m in got} == set(sent["ids"])


def test_cpp_producer_read_by_grpc_consumer(rmq5_python, cluster):
    cluster.create_topic("X_4to5")
    drive(rmq5_python, endpoint=cluster.endpoint, op="simple", topic="X_4to5",
          group="CG_5", want=0, await_s=1, then_empty=True)
    cpp = Driver("producer.py", "--namesrv", cluster.namesrv_addr, "--topic", "X_4to5",
                 "--count", "3", "--tag", "TagY", "--keys", "--prefix", "cpp")
    try:
        cpp.wait_for(lambda ev: any(e.get("event") == "done" for e in ev), 60, "C++ send")
    finally:
        cpp.proc.kill()
    sent = cpp.of("sent")
    assert len(sent) == 3
    got = drive(rmq5_python, endpoint=cluster.endpoint, op="simple", topic="X_4to5",
                group="CG_5", want=3, await_s=2)
    msgs = got["messages"]
    assert sorted(m["body"] for m in msgs) == sorted(e["body"] for e in sent)
    assert {m["tag"] for m in msgs} == {"TagY"}
    assert all(len(m["keys"]) == 1 and m["keys"][0].startswith("key-cpp-") for m in msgs)
    assert {m["id"] for m in msgs} == {e["msg_id"] for e in sent}
    assert not any(m["corrupted"] for m in msgs)
