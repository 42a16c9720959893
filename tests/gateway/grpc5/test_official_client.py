"""The official RocketMQ 5 Python client (rocketmq-python-client 5.1.2), unchanged, against
`lmq serve`'s gRPC front end: producers (normal, FIFO, delay, transactions), the
SimpleConsumer and the PushConsumer (docs/grpc.md)."""

from __future__ import annotations

import pytest

from tests.gateway.grpc5.harness import GrpcCluster, drive, finish_driver, start_driver


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # Quick transaction checks, so the orphaned-transaction test needs no long wait.
    with GrpcCluster(tmp_path_factory.mktemp("grpc5"), transaction_check_interval_s=0.5,
                     transaction_timeout_s=1.0) as c:
        yield c


def _start_group(py: str, cluster: GrpcCluster, topic: str, group: str) -> None:
    """Create the topic and the group's read position (a new group starts at the end)."""
    cluster.create_topic(topic)
    drive(py, endpoint=cluster.endpoint, op="simple", topic=topic, group=group, want=0,
          await_s=1, then_empty=True)


def test_send_receive_ack_simple_consumer(rmq5_python, cluster):
    _start_group(rmq5_python, cluster, "T_simple", "G_simple")
    sent = drive(rmq5_python, endpoint=cluster.endpoint, op="produce", topic="T_simple",
                 bodies=["one", "two", "three"], tag="TagA", keys=["k1", "k2"],
                 props={"color": "red"})
    got = drive(rmq5_python, endpoint=cluster.endpoint, op="simple", topic="T_simple",
                group="G_simple", want=3, await_s=2, double_ack=True, then_empty=True)
    msgs = got["messages"]
    assert sorted(m["body"] for m in msgs) == ["one", "three", "two"]
    assert {m["id"] for m in msgs} == set(sent["ids"])  # the producer's ids, echoed
    for m in msgs:
        assert m["tag"] == "TagA" and sorted(m["keys"]) == ["k1", "k2"]
        assert m["props"] == {"color": "red"}
        assert m["attempt"] == 1 and not m["corrupted"]
    # An acknowledged message's handle is refused a second time, and nothing comes back.
    assert got["events"].count("double-ack-refused:BadRequestException") == 3
    assert got["events"][-1] == "extra:0"


def test_new_group_starts_at_the_latest_offset(rmq5_python, cluster):
    cluster.create_topic("T_latest", queues=1)
    drive(rmq5_python, endpoint=cluster.endpoint, op="produce", topic="T_latest",
          bodies=[f"old-{i}" for i in range(5)])
    got = drive(rmq5_python, endpoint=cluster.endpoint, op="simple", topic="T_latest",
                group="G_latest", want=5, await_s=1, deadline_s=3)
    # Apache's MAX init mode: history is not replayed (at most the newest message of each
    # queue is, docs/pop.md).
    assert [m["body"] for m in got["messages"]] in ([], ["old-4"])


@pytest.mark.slow  # ~8 s (six client runs); the filter is the broker's POP filter
def test_tag_filter(rmq5_python, cluster):
    cluster.create_topic("T_tags")
    drive(rmq5_python, endpoint=cluster.endpoint, op="simple", topic="T_tags",
          group="G_tags", filter="keep", want=0, await_s=1, then_empty=True)
    for tag, body in (("drop", "d1"), ("keep", "k1"), ("drop", "d2"), ("keep", "k2")):
        drive(rmq5_python, endpoint=cluster.endpoint, op="produce", topic="T_tags",
              bodies=[body], tag=tag)
    got = drive(rmq5_python, endpoint=cluster.endpoint, op="simple", topic="T_tags",
                group="G_tags", filter="keep", want=2, await_s=2, then_empty=True)
    assert sorted(m["body"] for m in got["messages"]) == ["k1", "k2"]


def test_change_invisible_duration_redelivers(rmq5_python, cluster):
    _start_group(rmq5_python, cluster, "T_inv", "G_inv")
    drive(rmq5_python, endpoint=cluster.endpoint, op="produce", topic="T_inv", bodies=["x"])
    got = drive(rmq5_python, endpoint=cluster.endpoint, op="simple", topic="T_inv",
                group="G_inv", want=2, await_s=2, invisible_s=30, change_invisible_s=1)
    attempts = [(m["body"], m["attempt"]) for m in got["messages"]]
    # Not acked but made visible again after 1 s (instead of 30): delivered again.
    assert attempts == [("x", 1), ("x", 2)]
    assert got["events"] == ["changed"]


def test_fifo_message_groups_keep_their_order(rmq5_python, cluster):
    _start_group(rmq5_python, cluster, "T_fifo", "G_fifo")
    bodies = [f"{g}-{i}" for i in range(6) for g in ("a", "b")]
    drive(rmq5_python, endpoint=cluster.endpoint, op="produce", topic="T_fifo",
          bodies=bodies, group_of=["ga", "gb"])
    got = drive(rmq5_python, endpoint=cluster.endpoint, op="simple", topic="T_fifo",
                group="G_fifo", want=12, await_s=2)
    by_group: dict[str, list[str]] = {}
    for m in got["messages"]:
        by_group.setdefault(m["group"], []).append(m["body"])
    assert by_group == {"ga": [f"a-{i}" for i in range(6)],
                        "gb": [f"b-{i}" for i in range(6)]}


def test_delay_message_is_never_early(rmq5_python, cluster):
    _start_group(rmq5_python, cluster, "T_delay", "G_delay")
    drive(rmq5_python, endpoint=cluster.endpoint, op="produce", topic="T_delay",
          bodies=["later"], delay_s=1)
    got = drive(rmq5_python, endpoint=cluster.endpoint, op="simple", topic="T_delay",
                group="G_delay", want=1, await_s=2, deadline_s=15)
    [m] = got["messages"]
    assert m["body"] == "later"
    assert m["delivery_ms"] > 0  # the time asked for, kept
    assert m["recv_ms"] >= m["delivery_ms"]


def test_transactions_commit_rollback_and_server_check(rmq5_python, cluster):
    _start_group(rmq5_python, cluster, "T_tx", "G_tx")
    tx = drive(rmq5_python, endpoint=cluster.endpoint, op="transaction", topic="T_tx",
               bodies=["commit-me", "roll-me", "ask-me"],
               decisions=["commit", "rollback", "none"], check_answer="COMMIT",
               want_checks=1, wait_check_s=20)
    # The unresolved one was pushed back to the producer over Telemetry and committed.
    assert tx["checked"][:1] == [tx["ids"][2]]
    got = drive(rmq5_python, endpoint=cluster.endpoint, op="simple", topic="T_tx",
                group="G_tx", want=2, await_s=2, then_empty=True)
    assert sorted(m["body"] for m in got["messages"]) == ["ask-me", "commit-me"]
    assert got["events"][-1] == "extra:0"


def test_push_consumer_consumes_and_retries_failures(rmq5_python, cluster):
    _start_group(rmq5_python, cluster, "T_push", "G_push")
    proc = start_driver(rmq5_python, endpoint=cluster.endpoint, op="push", topic="T_push",
                        group="G_push", want=6, fail_first=True, deadline_s=40)
    try:
        assert '"ready"' in proc.stdout.readline()
        drive(rmq5_python, endpoint=cluster.endpoint, op="produce", topic="T_push",
              bodies=["p1", "p2", "p3"])
        got = finish_driver(proc)
    finally:
        proc.kill()
    seen = sorted((m["body"], m["attempt"]) for m in got["messages"])
    # Each first attempt fails (the client nacks with its backoff); the second succeeds.
    assert seen == [("p1", 1), ("p1", 2), ("p2", 1), ("p2", 2), ("p3", 1), ("p3", 2)]


@pytest.mark.slow  # ~10 s (six client runs)
def test_namespaces_are_separate_topics(rmq5_python, cluster):
    cluster.create_topic("ns1%T_ns")
    cluster.create_topic("T_ns")
    drive(rmq5_python, endpoint=cluster.endpoint, op="simple", topic="T_ns", group="G_ns",
          namespace="ns1", want=0, await_s=1, then_empty=True)
    drive(rmq5_python, endpoint=cluster.endpoint, op="simple", topic="T_ns", group="G_ns",
          want=0, await_s=1, then_empty=True)
    drive(rmq5_python, endpoint=cluster.endpoint, op="produce", topic="T_ns",
          bodies=["in-ns1"], namespace="ns1")
    drive(rmq5_python, endpoint=cluster.endpoint, op="produce", topic="T_ns",
          bodies=["no-namespace"])
    got = drive(rmq5_python, endpoint=cluster.endpoint, op="simple", topic="T_ns",
                group="G_ns", namespace="ns1", want=1, await_s=2, then_empty=True)
    assert [(m["body"], m["topic"]) for m in got["messages"]] == [("in-ns1", "T_ns")]
    plain = drive(rmq5_python, endpoint=cluster.endpoint, op="simple", topic="T_ns",
                  group="G_ns", want=1, await_s=2, then_empty=True)
    assert [m["body"] for m in plain["messages"]] == ["no-namespace"]

    async def stored(client):  # the broker stores it as `ns1%T_ns` (NamespaceUtil form)
        addr = cluster.server.broker.broker_addr
        return sum([await client.api.get_max_offset(addr, "ns1%T_ns", q) for q in range(4)])

    assert cluster.with_client(stored) == 1


def test_lite_topics_over_lmqs(rmq5_python, cluster):
    cluster.create_topic("T_lite")
    consumer = start_driver(rmq5_python, endpoint=cluster.endpoint, op="lite",
                            topic="T_lite", group="G_lite", lites=["a", "b"], want=4,
                            await_s=2, deadline_s=30)
    try:
        assert '"ready"' in consumer.stdout.readline()
        drive(rmq5_python, endpoint=cluster.endpoint, op="produce", topic="T_lite",
              bodies=["a1", "b1", "c1", "a2", "b2", "c2"], lite_of=["a", "b", "c"])
        got = finish_driver(consumer)
    finally:
        consumer.kill()
    msgs = got["messages"]
    # Only the subscribed lite topics, each in order; "c" is nobody's.
    assert sorted((m["lite"], m["body"]) for m in msgs) == [
        ("a", "a1"), ("a", "a2"), ("b", "b1"), ("b", "b2")]
    for lite in ("a", "b"):
        assert [m["body"] for m in msgs if m["lite"] == lite] == [f"{lite}1", f"{lite}2"]

    async def lmq_sizes(client):  # one LMQ per lite topic, as the broker stores them
        addr = cluster.server.broker.broker_addr
        return [await client.api.get_max_offset(addr, f"%LMQ%$T_lite${x}", 0)
                for x in "abc"]

    assert cluster.with_client(lmq_sizes) == [2, 2, 2]


def test_lite_push_consumer(rmq5_python, cluster):
    cluster.create_topic("T_lpush")
    consumer = start_driver(rmq5_python, endpoint=cluster.endpoint, op="lite_push",
                            topic="T_lpush", group="G_lpush", lites=["x"], want=2,
                            deadline_s=30)
    try:
        assert '"ready"' in consumer.stdout.readline()
        drive(rmq5_python, endpoint=cluster.endpoint, op="produce", topic="T_lpush",
              bodies=["x1", "y1", "x2"], lite_of=["x", "y", "x"])
        got = finish_driver(consumer)
    finally:
        consumer.kill()
    assert [(m["lite"], m["body"], m["attempt"]) for m in got["messages"]] == [
        ("x", "x1", 1), ("x", "x2", 1)]
