"""Client pieces that need no broker: allocation, fault tolerance, routes, subscriptions,
process queues, offset files, admin parsing and formatting."""

from __future__ import annotations

import json
import time

import pytest
import trio
from trio.testing import trio_test

from core.client.admin import decode_mq_map, message_to_dict
from core.client.allocate import (
    allocate_averagely,
    allocate_averagely_by_circle,
    resolve_strategy,
)
from core.client.config import ClientConfig, parse_namesrv_addr
from core.client.instance import ClientInstance
from core.client.latency import MQFaultStrategy, TopicPublishInfo
from core.client.model import MessageQueue, SubscriptionData, TopicRouteData
from core.client.offset_store import LocalFileOffsetStore
from core.client.process_queue import ProcessQueue
from core.common.message import MessageExt
from lmq.commands.admin import UsageError, format_table, parse_time

MQS = [MessageQueue("T", "b", i) for i in range(4)]


def test_allocate_averagely_matches_seed_example():
    assert allocate_averagely("g", "c1", MQS, ["c1", "c2"]) == MQS[:2]
    assert allocate_averagely("g", "c2", MQS, ["c1", "c2"]) == MQS[2:]


def test_allocate_by_circle_matches_seed_example():
    assert allocate_averagely_by_circle("g", "c1", MQS, ["c1", "c2"]) == [MQS[0], MQS[2]]
    assert allocate_averagely_by_circle("g", "c2", MQS, ["c1", "c2"]) == [MQS[1], MQS[3]]


@pytest.mark.parametrize("strategy", [allocate_averagely, allocate_averagely_by_circle])
@pytest.mark.parametrize("n_mqs,n_cids", [(1, 3), (4, 3), (8, 3), (5, 5), (7, 2), (16, 5)])
def test_allocation_is_a_partition(strategy, n_mqs, n_cids):
    mqs = [MessageQueue("T", "b", i) for i in range(n_mqs)]
    cids = [f"c{i}" for i in range(n_cids)]
    parts = [strategy("g", c, mqs, cids) for c in cids]
    flat = [mq for p in parts for mq in p]
    assert sorted(flat) == mqs  # every queue exactly once
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_allocation_of_unknown_member_is_empty():
    assert allocate_averagely("g", "x", MQS, ["c1"]) == []
    assert resolve_strategy("averagely_by_circle") is allocate_averagely_by_circle
    with pytest.raises(ValueError):
        resolve_strategy("nope")


def _route(*brokers: str, queues: int = 4) -> TopicRouteData:
    return TopicRouteData.decode(json.dumps({
        "queueDatas": [{"brokerName": b, "readQueueNums": queues, "writeQueueNums": queues,
                        "perm": 6} for b in brokers],
        "brokerDatas": [{"cluster": "C", "brokerName": b, "brokerAddrs": {"0": f"10.0.0.{i}:10911"}}
                        for i, b in enumerate(brokers)],
    }).encode())


def test_route_decoding_accepts_fastjson_keys_and_builds_queues():
    body = (b'{"queueDatas":[{"brokerName":"a","readQueueNums":2,"writeQueueNums":3,"perm":6}],'
            b'"brokerDatas":[{"cluster":"C","brokerName":"a","brokerAddrs":{0:"1.2.3.4:10911"}}]}')
    route = TopicRouteData.decode(body)
    assert route.broker_datas[0].master_addr() == "1.2.3.4:10911"
    assert [mq.queue_id for mq in route.publish_queues("T")] == [0, 1, 2]
    assert [mq.queue_id for mq in route.subscribe_queues("T")] == [0, 1]


def test_route_queue_data_round_trips_between_name_server_and_client():
    from core.namesrv import QueueData as ServerQueueData

    served = [ServerQueueData("a", 2, 3, 6, 1), ServerQueueData("b", 1, 1, 4)]
    route = TopicRouteData.decode(json.dumps({"queueDatas": [q.to_json() for q in served],
                                              "brokerDatas": []}).encode())
    assert route.queue_datas == served
    assert route.to_json()["queueDatas"] == [q.to_json() for q in served]
    old = TopicRouteData.decode(b'{"queueDatas":[{"brokerName":"c","topicSynFlag":2}]}')
    assert (old.queue_datas[0].topic_sys_flag, old.queue_datas[0].perm) == (2, 6)


def test_route_without_master_or_write_perm_has_no_publish_queues():
    route = _route("a")
    route.queue_datas[0].perm = 4
    assert route.publish_queues("T") == []
    route = _route("a")
    route.broker_datas[0].broker_addrs = {1: "x:1"}
    assert route.publish_queues("T") == []


def test_retry_avoids_the_broker_that_failed():
    info = TopicPublishInfo("T", _route("a", "b"))
    fault = MQFaultStrategy(enabled=False)
    for _ in range(20):
        assert fault.select(info, "a").broker_name == "b"


def test_latency_fault_tolerance_keeps_away_from_a_failed_broker():
    info = TopicPublishInfo("T", _route("a", "b"))
    fault = MQFaultStrategy(enabled=True)
    fault.update_fault_item("a", 3000, isolation=True)
    assert not fault.tolerance.is_available("a")
    # Fresh sends (no last broker) avoid "a" too, not only retries.
    assert all(fault.select(info, None).broker_name == "b" for _ in range(20))
    # A fast answer makes it available again at once.
    fault.update_fault_item("a", 10, isolation=False)
    assert fault.tolerance.is_available("a")
    assert {fault.select(info, None).broker_name for _ in range(20)} == {"a", "b"}


def test_latency_thresholds_and_all_brokers_avoided():
    fault = MQFaultStrategy(enabled=True)
    assert fault.compute_not_available_ms(10) == 0
    assert fault.compute_not_available_ms(600) == 30000
    assert fault.compute_not_available_ms(30000) == 600000
    info = TopicPublishInfo("T", _route("a", "b"))
    fault.update_fault_item("a", 3000, True)
    fault.update_fault_item("b", 600, False)
    # Both avoided: the one that recovers first is used.
    assert fault.select(info, None).broker_name == "b"
    with pytest.raises(ValueError):
        MQFaultStrategy(True, (1, 2), (1,))


def test_subscription_expressions():
    s = SubscriptionData.build("T", " A || B ||  ")
    assert s.tags_set == ["A", "B"] and s.code_set == [65, 66] and s.is_tag_filter
    assert SubscriptionData.build("T", "*").sub_string == "*"
    assert SubscriptionData.build("T", None).tags_set == []
    sql = SubscriptionData.build("T", "a > 1", "sql92")
    assert sql.expression_type == "SQL92" and not sql.is_tag_filter
    with pytest.raises(ValueError):
        SubscriptionData.build("T", "", "SQL92")
    m = MessageExt("T", b"x", properties={"TAGS": "B"})
    assert s.matches(m)
    m.properties["TAGS"] = "C"
    assert not s.matches(m)
    assert sql.matches(m)


def _msg(off: int, size: int = 10) -> MessageExt:
    return MessageExt("T", b"x" * size, queue_offset=off)


def test_process_queue_commit_offset_is_lowest_in_flight():
    pq = ProcessQueue()
    pq.put([_msg(i) for i in range(5, 10)])
    assert pq.msg_count == 5 and pq.msg_size == 50 and pq.max_span == 4
    assert pq.remove([_msg(7)]) == 5
    assert pq.remove([_msg(5)]) == 6
    assert pq.remove([_msg(6), _msg(8), _msg(9)]) == 10
    assert pq.is_empty() and pq.msg_count == 0


def test_process_queue_orderly_take_commit_and_retry():
    pq = ProcessQueue()
    pq.put([_msg(i) for i in (3, 1, 2)])
    batch = pq.take(2)
    assert [m.queue_offset for m in batch] == [1, 2]
    pq.consume_again(batch)
    assert [m.queue_offset for m in pq.take(2)] == [1, 2]
    assert pq.commit() == 3
    assert [m.queue_offset for m in pq.take(5)] == [3]
    assert pq.commit() == 4
    assert pq.commit() == -1
    assert not pq.has_pending


@trio_test
async def test_local_offset_file_round_trip(tmp_path):
    client = ClientInstance(ClientConfig(namesrv_addr="127.0.0.1:1", instance_name="inst",
                                         offset_store_dir=str(tmp_path)))
    store = LocalFileOffsetStore(client, "G")
    store.update(MQS[0], 5)
    store.update(MQS[0], 3, increase_only=True)
    store.update(MQS[1], 7)
    await store.persist_all()
    await store.persist_all()  # a second write keeps a .bak of the first
    again = LocalFileOffsetStore(client, "G")
    await again.load()
    assert again.read_memory(MQS[0]) == 5 and again.read_memory(MQS[1]) == 7
    assert await again.read_store(MQS[2]) == -1
    assert (tmp_path / "inst" / "G" / "offsets.json.bak").exists()


def test_config_parsing():
    assert parse_namesrv_addr("a:1; b:2,c:3") == ["a:1", "b:2", "c:3"]
    with pytest.raises(ValueError):
        parse_namesrv_addr("nohost")
    c1, c2 = ClientConfig(namesrv_addr="127.0.0.1:9876"), ClientConfig(namesrv_addr="127.0.0.1:9876")
    assert c1.client_id != c2.client_id  # two instances are two group members
    with pytest.raises(ValueError):
        ClientConfig(request_timeout=0)


def test_decode_fastjson_mq_map():
    text = ('{{"brokerName":"b","queueId":1,"topic":"T"}:{"maxOffset":5},'
            '{"brokerName":"b","queueId":0,"topic":"T"}:{"maxOffset":3}}')
    pairs = dict(decode_mq_map(text))
    assert pairs[MessageQueue("T", "b", 1)] == {"maxOffset": 5}
    assert pairs[MessageQueue("T", "b", 0)] == {"maxOffset": 3}


def test_admin_time_parsing_and_table():
    now = 1_700_000_000_000
    assert parse_time("now", now) == now
    assert parse_time("-2h", now) == now - 7_200_000
    assert parse_time("1234", now) == 1234
    assert parse_time("2024-01-01T00:00:00") == int(time.mktime((2024, 1, 1, 0, 0, 0, 0, 0, -1)) * 1000)
    with pytest.raises(UsageError):
        parse_time("yesterday")
    out = format_table([{"a": 1, "b": None}], [("a", "A"), ("b", "BEE")])
    assert out.splitlines() == ["A  BEE", "1  -"]


def test_message_to_dict_handles_binary_bodies():
    d = message_to_dict(MessageExt("T", b"\xff\x00", properties={"TAGS": "x"}))
    assert d["bodyEncoding"] == "hex" and d["body"] == "ff00" and d["tags"] == "x"


@trio_test
async def test_instance_unwraps_body_exceptions():
    with pytest.raises(KeyError):
        async with ClientInstance(namesrv_addr="127.0.0.1:1"):
            raise KeyError("x")
    with trio.move_on_after(0.01):
        async with ClientInstance(namesrv_addr="127.0.0.1:1"):
            await trio.sleep_forever()


def test_consumers_pass_the_common_options_to_their_base(tmp_path):
    from core.client import LitePullConsumer, PushConsumer
    from core.client.model import ConsumeFromWhere, MessageModel

    client = ClientInstance(ClientConfig(namesrv_addr="127.0.0.1:1", offset_store_dir=str(tmp_path)))
    opts = {"message_model": "BROADCASTING", "consume_timestamp_ms": 5,
            "consume_from_where": "CONSUME_FROM_FIRST_OFFSET"}
    lite = LitePullConsumer(client, "G", pull_batch_size=3, **opts)
    push = PushConsumer(client, "G", lambda msgs: None, orderly=True, **opts)
    for c in (lite, push):
        assert (c.message_model, c.consume_from_where, c.consume_timestamp_ms) == (
            MessageModel.BROADCASTING, ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, 5)
    assert (lite.orderly, push.orderly, lite.pull_batch_size) == (False, True, 3)
    with pytest.raises(TypeError):
        LitePullConsumer(client, "G", orderly=True)  # push consumers only
    with pytest.raises(TypeError):
        PushConsumer(client, "G", lambda msgs: None, bogus=1)


def test_a_failed_pull_of_a_pull_loop_is_none_after_the_pause():
    from trio.testing import MockClock

    from core.client.pull_consumer import pull_or_pause

    async def main():
        t0 = trio.current_time()
        # offset -1: pull_kernel refuses it before any I/O
        result = await pull_or_pause(None, "G", MQS[0], None, -1, 1, pause_s=7.0)
        assert result is None and trio.current_time() - t0 == 7.0

    trio.run(main, clock=MockClock(autojump_threshold=0))


def test_a_failing_member_does_not_stop_the_others_shutting_down(caplog):
    client = ClientInstance(ClientConfig(namesrv_addr="127.0.0.1:1"))
    done = []

    class Member:
        def __init__(self, group, fails):
            self.group, self.fails = group, fails

        async def shutdown(self):
            if self.fails:
                raise RuntimeError("boom")
            done.append(self.group)

    client.consumers = {"A": Member("A", True), "B": Member("B", False)}
    client.producers = {"P": Member("P", True), "Q": Member("Q", False)}
    trio.run(client.shutdown_members)
    assert done == ["B", "Q"]
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        "shutdown of consumer A failed", "shutdown of producer P failed"]
