"""The real C++ client (rocketmq==0.4.4) against `lmq serve` in a subprocess.

Every client runs in its own process (tests/core/broker/cpp_drivers): the wheel's native
threads must never live in the pytest process.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict

import pytest

from core.remoting.codec import RemotingCommand
from tests.core.broker.harness import (
    Driver,
    ServerProcess,
    create_topic,
    run_driver,
    sync_invoke,
    wait_until,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = ServerProcess(tmp_path_factory.mktemp("cpp") / "data").start()
    yield proc
    assert proc.stop() == 0, proc.log()


def produce(server, topic, count, *extra) -> list[dict]:
    events = run_driver("producer.py", "--namesrv", server.namesrv_addr, "--topic", topic,
                        "--count", str(count), *extra)
    assert not [e for e in events if e["event"] == "error"], events
    assert events[-1]["event"] == "done", events
    return [e for e in events if e["event"] == "sent"]


def pull_everything(server, topic, group="CID_PULL_CHECK") -> list[dict]:
    events = run_driver("pull_consumer.py", "--namesrv", server.namesrv_addr, "--group", group,
                        "--topic", topic)
    assert events[-1]["event"] == "done", events
    return [e for e in events if e["event"] == "msg"]


def max_offsets(server, topic, queues=4) -> list[int]:
    out = []
    for q in range(queues):
        r = sync_invoke(server.broker_addr, RemotingCommand.request(
            30, {"topic": topic, "queueId": str(q)}))
        out.append(int(r.ext_fields["offset"]))
    return out


def consumer_count(server, group) -> int:
    r = sync_invoke(server.broker_addr, RemotingCommand.request(38, {"consumerGroup": group}))
    return len(json.loads(r.body_bytes())["consumerIdList"]) if r.code == 0 else 0


# ---------------------------------------------------------------------- producers
def test_sync_send_auto_creates_topic(server):
    sent = produce(server, "CppSync", 12, "--tag", "TagA", "--keys")
    assert [e["status"] for e in sent] == [0] * 12
    assert all(e["msg_id"] for e in sent)
    assert sum(max_offsets(server, "CppSync")) == 12
    got = pull_everything(server, "CppSync")
    assert sorted(m["body"] for m in got) == sorted(e["body"] for e in sent)
    assert {m["tags"] for m in got} == {"TagA"} and {m["cluster"] for m in got} == {"DefaultCluster"}


def test_oneway_send(server):
    create_topic(server.broker_addr, "CppOneway")
    produce(server, "CppOneway", 6, "--mode", "oneway")
    wait_until(lambda: sum(max_offsets(server, "CppOneway")) == 6, 10, what="oneway stored")


def test_orderly_send_uses_selected_queue(server):
    create_topic(server.broker_addr, "CppOrderly")
    sent = produce(server, "CppOrderly", 8, "--mode", "orderly")
    assert len(sent) == 8
    got = pull_everything(server, "CppOrderly")
    for m in got:
        i = int(m["body"].rsplit("-", 1)[1])
        assert m["queue_id"] == i % 4


def test_batch_and_compressed_batch(server):
    create_topic(server.broker_addr, "CppBatch")
    produce(server, "CppBatch", 8, "--mode", "batch", "--batch-size", "4", "--prefix", "small")
    # 4 x 1500 bytes: the C++ client zlib-compresses the whole batch (>= 4 KiB, docs/protocol.md §7.8)
    produce(server, "CppBatch", 8, "--mode", "batch", "--batch-size", "4", "--prefix", "big",
            "--body-size", "1500")
    got = pull_everything(server, "CppBatch")
    bodies = Counter(m["body"][:12] for m in got)
    assert len(got) == 16
    assert sum(1 for m in got if m["body_len"] == 1500) == 8
    assert all(m["body"].startswith(("small-", "big-")) for m in got), bodies


# ---------------------------------------------------------------------- consumers
def test_push_clustering_two_instances_share_queues(server):
    topic, group = "CppCluster", "CID_CLUSTER"
    create_topic(server.broker_addr, topic)
    a = Driver("push_consumer.py", "--namesrv", server.namesrv_addr, "--group", group,
               "--topic", topic)
    b = Driver("push_consumer.py", "--namesrv", server.namesrv_addr, "--group", group,
               "--topic", topic)
    try:
        wait_until(lambda: consumer_count(server, group) == 2, 30, what="two members")
        time.sleep(4)  # let both rebalance (NOTIFY + the 10 s timer) before producing
        sent = produce(server, topic, 40)
        bodies = {e["body"] for e in sent}

        def all_in():
            got = [m["body"] for m in a.of("msg") + b.of("msg")]
            return set(got) >= bodies

        wait_until(all_in, 60, what="all messages consumed")
        time.sleep(2)
        got_a = [m["body"] for m in a.of("msg")]
        got_b = [m["body"] for m in b.of("msg")]
        assert set(got_a) | set(got_b) == bodies
        assert not set(got_a) & set(got_b), "a message was consumed by both instances"
        assert len(got_a) + len(got_b) == len(bodies), "duplicates within one instance"
        assert got_a and got_b, "one instance got no queue"
    finally:
        a.close()
        b.close()


def test_push_broadcasting_every_instance_gets_all(server):
    topic, group = "CppBroadcast", "CID_BROADCAST"
    create_topic(server.broker_addr, topic)
    drivers = [Driver("push_consumer.py", "--namesrv", server.namesrv_addr, "--group", group,
                      "--topic", topic, "--broadcast") for _ in range(2)]
    try:
        wait_until(lambda: consumer_count(server, group) == 2, 30, what="two members")
        time.sleep(4)  # broadcasting consumers start at the max offset (docs/protocol.md §8.4)
        sent = produce(server, topic, 20)
        bodies = {e["body"] for e in sent}
        for d in drivers:
            d.wait_for(lambda ev: {e.get("body") for e in ev if e["event"] == "msg"} >= bodies,
                       60, "all broadcast messages")
    finally:
        for d in drivers:
            d.close()


def test_push_orderly_keeps_queue_order(server):
    topic, group = "CppOrderlyConsume", "CID_ORDERLY"
    create_topic(server.broker_addr, topic)
    sent = produce(server, topic, 24, "--mode", "orderly")
    d = Driver("push_consumer.py", "--namesrv", server.namesrv_addr, "--group", group,
               "--topic", topic, "--orderly")
    try:
        d.wait_for(lambda ev: len([e for e in ev if e["event"] == "msg"]) >= len(sent), 60,
                   "orderly messages")
        per_queue = defaultdict(list)
        for m in d.of("msg"):
            per_queue[m["queue_id"]].append(m["queue_offset"])
        for offsets in per_queue.values():
            assert offsets == sorted(offsets)
        assert len(per_queue) == 4
    finally:
        d.close()


def test_tag_filtered_push_consumer(server):
    topic, group = "CppTags", "CID_TAGS"
    create_topic(server.broker_addr, topic)
    produce(server, topic, 6, "--tag", "TagA", "--prefix", "a")
    produce(server, topic, 6, "--tag", "TagB", "--prefix", "b")
    d = Driver("push_consumer.py", "--namesrv", server.namesrv_addr, "--group", group,
               "--topic", topic, "--expression", "TagB")
    try:
        d.wait_for(lambda ev: len([e for e in ev if e["event"] == "msg"]) >= 6, 60, "TagB msgs")
        time.sleep(1)
        assert {m["tags"] for m in d.of("msg")} == {"TagB"}
    finally:
        d.close()
    # offsets were committed with UPDATE_CONSUMER_OFFSET by the consumer
    committed = 0
    for q in range(4):
        r = sync_invoke(server.broker_addr, RemotingCommand.request(
            14, {"consumerGroup": group, "topic": topic, "queueId": str(q)}))
        committed += int(r.ext_fields["offset"])
    assert committed == 12


def test_pull_consumer(server):
    create_topic(server.broker_addr, "CppPull")
    sent = produce(server, "CppPull", 10, "--tag", "P")
    got = pull_everything(server, "CppPull", group="CID_PULL")
    assert sorted(m["body"] for m in got) == sorted(e["body"] for e in sent)
    filtered = run_driver("pull_consumer.py", "--namesrv", server.namesrv_addr, "--group",
                          "CID_PULL2", "--topic", "CppPull", "--expression", "Other")
    assert filtered[-1] == {**filtered[-1], "event": "done", "count": 0}
