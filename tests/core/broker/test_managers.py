"""Broker metadata managers, client channels, long polling and group commit — no sockets."""

from __future__ import annotations

import json
import threading

import pytest
import trio
from trio.testing import MockClock, wait_all_tasks_blocked

from core.broker.clients import (
    CONSUME_FROM_WHERE,
    MESSAGE_MODELS,
    ClientChannelInfo,
    ConsumerManager,
    ProducerManager,
    SubscriptionData,
    enum_name,
)
from core.broker.config import BrokerConfig, parse_addr_list
from core.broker.flush import GroupCommitService
from core.broker.long_polling import PullRequestHoldService
from core.broker.metadata import atomic_write_json, read_json
from core.broker.offsets import ConsumerOffsetManager
from core.broker.subscription_group import SubscriptionGroupManager
from core.broker.topic_config import TopicConfig, TopicConfigManager
from core.cluster import build_configs, configs_from_toml
from core.common.taghash import java_string_hash


class FakeConn:
    def __init__(self, name: str) -> None:
        self.remote_addr = name
        self.attributes: dict = {}


# ---------------------------------------------------------------------- metadata files
def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    path = tmp_path / "config" / "x.json"
    atomic_write_json(str(path), {"a": 1})
    atomic_write_json(str(path), {"a": 2})
    assert read_json(str(path)) == {"a": 2}
    assert [p.name for p in path.parent.iterdir()] == ["x.json"]


def test_corrupt_metadata_is_set_aside(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{not json")
    assert read_json(str(path), {"d": 1}) == {"d": 1}
    assert (tmp_path / "x.json.corrupt").exists()


# ---------------------------------------------------------------------- topics
def _tcm(tmp_path, **kw) -> TopicConfigManager:
    tcm = TopicConfigManager(str(tmp_path), broker_name="broker-a", cluster_name="C", **kw)
    tcm.load()
    return tcm


def test_system_topics_and_tbw102(tmp_path):
    tcm = _tcm(tmp_path)
    tbw = tcm.get("TBW102")
    assert (tbw.perm, tbw.read_queue_nums, tbw.write_queue_nums) == (7, 8, 8)
    assert tcm.get("SELF_TEST_TOPIC") is not None
    assert tcm.get("broker-a") is not None and tcm.get("C") is not None


def test_auto_create_from_template_and_persist(tmp_path):
    tcm = _tcm(tmp_path)
    changes = []
    tcm.on_change = lambda: changes.append(1)
    version = tcm.data_version.counter
    tc = tcm.create_topic_in_send_message_method("NewTopic", "TBW102", 4)
    assert (tc.read_queue_nums, tc.write_queue_nums, tc.perm) == (4, 4, 6)
    assert changes and tcm.data_version.counter == version + 1
    # more queues than the template has are capped by it
    assert tcm.create_topic_in_send_message_method("Big", "TBW102", 100).write_queue_nums == 8
    # a template without the INHERIT bit refuses
    assert tcm.create_topic_in_send_message_method("X", "NewTopic", 4) is None
    again = _tcm(tmp_path)
    assert again.get("NewTopic") == tc


def test_auto_create_disabled(tmp_path):
    tcm = _tcm(tmp_path, auto_create_topic=False)
    assert tcm.get("TBW102") is None
    assert tcm.create_topic_in_send_message_method("T", "TBW102", 4) is None


def test_lmq_topics_are_fabricated_not_stored(tmp_path):
    tcm = _tcm(tmp_path)
    tc = tcm.get("%LMQ%abc")
    assert (tc.read_queue_nums, tc.write_queue_nums, tc.perm) == (1, 1, 6)
    assert "%LMQ%abc" not in tcm.table
    assert _tcm(tmp_path, enable_lmq=False).get("%LMQ%abc") is None


def test_topic_update_delete(tmp_path):
    tcm = _tcm(tmp_path)
    tcm.update(TopicConfig("T1", 2, 3, 6))
    assert tcm.get("T1").queue_nums == 3
    assert tcm.delete("T1") and not tcm.delete("T1")
    assert _tcm(tmp_path).get("T1") is None


# ---------------------------------------------------------------------- groups & offsets
def test_subscription_groups(tmp_path):
    sgm = SubscriptionGroupManager(str(tmp_path))
    sgm.load()
    sg = sgm.find_or_create("G1")
    assert (sg.retry_max_times, sg.retry_queue_nums, sg.consume_enable) == (16, 1, True)
    sgm.persist()
    again = SubscriptionGroupManager(str(tmp_path))
    again.load()
    assert again.get("G1") == sg
    off = SubscriptionGroupManager(str(tmp_path), auto_create=False)
    off.load()
    assert off.find_or_create("Unknown") is None
    lmq_group = off.find_or_create("%LMQ%group")  # LMQ groups always accepted, consumable
    assert (lmq_group.group_name, lmq_group.consume_enable) == ("%LMQ%group", True)
    assert "%LMQ%group" not in off.table


def test_offsets_tables_and_persistence(tmp_path):
    om = ConsumerOffsetManager(str(tmp_path))
    assert om.query("G", "T", 0) == -1
    om.commit("G", "T", 0, 5)
    om.commit("G", "T", 3, 7)
    om.commit("%LMQ%g", "%LMQ%q", 0, 9)
    om.persist()
    data = json.loads((tmp_path / "consumerOffset.json").read_text())
    assert data["offsetTable"] == {"T@G": {"0": 5, "3": 7}}
    assert data["lmqOffsetTable"] == {"%LMQ%q@%LMQ%g": 9}
    again = ConsumerOffsetManager(str(tmp_path))
    again.load()
    assert again.query("G", "T", 3) == 7 and again.query("%LMQ%g", "%LMQ%q", 0) == 9
    assert again.topics_of_group("G") == {"T"}
    again.remove_topic("T")
    assert again.query("G", "T", 0) == -1


def test_offsets_forget_a_group_or_a_topic_in_both_tables(tmp_path):
    om = ConsumerOffsetManager(str(tmp_path))
    for group, topic in (("G", "T"), ("G", "U"), ("H", "T"), ("%LMQ%g", "%LMQ%q")):
        om.commit(group, topic, 0, 1)
    om.remove_group("G")
    assert [om.query(g, t, 0) for g, t in (("G", "T"), ("G", "U"), ("H", "T"))] == [-1, -1, 1]
    om.remove_topic("%LMQ%q")
    assert om.query("%LMQ%g", "%LMQ%q", 0) == -1 and om.query("H", "T", 0) == 1


# ---------------------------------------------------------------------- clients
def test_subscription_parsing_ignores_codeset():
    sub = SubscriptionData.from_heartbeat(
        {"codeSet": [0, 0], "subString": "TagA || TagC", "subVersion": "17", "topic": "T"}
    )
    assert sub.code_set == {java_string_hash("TagA"), java_string_hash("TagC")}
    assert sub.sub_version == 17
    star = SubscriptionData.from_heartbeat({"topic": "T", "subString": "*", "subVersion": 5})
    assert star.code_set is None and star.sub_string == "*"


def test_enum_names_accept_ordinals_and_names():
    assert enum_name(1, MESSAGE_MODELS, "x") == "CLUSTERING"
    assert enum_name("BROADCASTING", MESSAGE_MODELS, "x") == "BROADCASTING"
    assert enum_name("4", CONSUME_FROM_WHERE, "x") == "CONSUME_FROM_FIRST_OFFSET"
    assert enum_name(99, MESSAGE_MODELS, "dflt") == "dflt"
    assert enum_name(None, MESSAGE_MODELS, "dflt") == "dflt"


def _register(cm, group, conn, cid, topics=("T",), sub="*"):
    return cm.register(
        group, ClientChannelInfo(conn, cid), consume_type="CONSUME_PASSIVELY",
        message_model="CLUSTERING", consume_from_where="CONSUME_FROM_LAST_OFFSET",
        subscriptions=[SubscriptionData.build(t, sub) for t in topics],
    )


def test_consumer_membership_changes_notify_members():
    notes = []
    cm = ConsumerManager(expiry_s=120, on_change=lambda g, conns: notes.append((g, len(conns))))
    a, b = FakeConn("a"), FakeConn("b")
    assert _register(cm, "G", a, "id-b")
    assert notes == [("G", 1)]
    assert not _register(cm, "G", a, "id-b")  # same heartbeat again: no change
    assert _register(cm, "G", b, "id-a")
    assert notes[-1] == ("G", 2)
    assert cm.get("G").client_ids() == ["id-a", "id-b"]  # sorted
    assert _register(cm, "G", b, "id-a", sub="TagX")  # subscription change
    assert cm.connection_closed(a) == ["G"]
    assert notes[-1] == ("G", 1)
    assert cm.unregister("G", b, "id-a")
    assert cm.get("G") is None


def test_consumer_expiry():
    notes = []
    cm = ConsumerManager(expiry_s=10, on_change=lambda g, conns: notes.append(g))
    a, b = FakeConn("a"), FakeConn("b")
    _register(cm, "G", a, "1")
    _register(cm, "G", b, "2")
    cm.get("G").channels[a].last_update -= 20
    assert [(g, c) for g, c, _ in cm.scan_expired()] == [("G", "1")]
    assert cm.get("G").client_ids() == ["2"]


def test_producer_manager():
    pm = ProducerManager(expiry_s=10)
    a = FakeConn("a")
    pm.register("P", ClientChannelInfo(a, "x"))
    assert pm.connections_of_group("P") == [a]
    pm.connection_closed(a)
    assert pm.connections_of_group("P") == []


# ---------------------------------------------------------------------- config
def test_config_toml_and_overrides(tmp_path):
    path = tmp_path / "lmq.toml"
    path.write_text(
        'host = "127.0.0.1"\nbroker_port = 20911\nnamesrv_port = 29876\n'
        'flush = "sync"\nnamesrv_addrs = "a:1;b:2"\n[namesrv]\nbroker_expiry_s = 5.0\n'
    )
    broker, namesrv = build_configs(str(path), {"broker_name": "bx", "flush": None}, {})
    assert (broker.host, broker.port, broker.flush, broker.broker_name) == (
        "127.0.0.1", 20911, "sync", "bx")
    assert broker.namesrv_addrs == ["a:1", "b:2"]
    assert (namesrv.host, namesrv.port, namesrv.broker_expiry_s) == ("127.0.0.1", 29876, 5.0)
    with pytest.raises(ValueError):
        configs_from_toml({"port": 1})
    with pytest.raises(ValueError):
        configs_from_toml({"no_such_key": 1})


def test_advertised_address():
    assert BrokerConfig(host="0.0.0.0", port=1).broker_addr == "127.0.0.1:1"
    assert BrokerConfig(host="10.1.1.1", port=1).broker_addr == "10.1.1.1:1"
    assert BrokerConfig(advertise_host="1.2.3.4", port=1).broker_addr == "1.2.3.4:1"
    assert parse_addr_list(" a:1 ; b:2;") == ["a:1", "b:2"]


# ---------------------------------------------------------------------- long polling
def test_hold_service_wakes_only_its_queue():
    async def main():
        hold = PullRequestHoldService()
        results = {}

        async def waiter(name, topic, qid, offset, timeout):
            results[name] = await hold.wait(topic, qid, offset, timeout)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter, "a", "T", 0, 5, 10)
            nursery.start_soon(waiter, "b", "T", 1, 5, 3)
            nursery.start_soon(waiter, "c", "T", 0, 9, 3)
            await wait_all_tasks_blocked()
            assert hold.held == 3
            hold.notify("T", 0, 6)  # wakes a (offset 5 < 6), not c (9)
            await wait_all_tasks_blocked()
            assert results == {"a": True}
            clock.jump(2.9)  # b and c wait their whole timeout
            await wait_all_tasks_blocked()
            assert results == {"a": True} and hold.held == 2
            clock.jump(0.2)
        assert results == {"a": True, "b": False, "c": False}
        assert hold.held == 0

    clock = MockClock()  # time moves only when the test jumps it
    trio.run(main, clock=clock)


# ---------------------------------------------------------------------- group commit
class FakeStore:
    def __init__(self):
        self.max_physical_offset = 0
        self.flushed_offset = 0
        self.flush_calls = 0
        self.lock = threading.Lock()

    def flush(self):
        with self.lock:
            self.flush_calls += 1
            self.flushed_offset = self.max_physical_offset
            return self.flushed_offset


def test_group_commit_shares_fsyncs():
    async def main():
        store = FakeStore()
        gc = GroupCommitService(store, timeout_s=5)
        oks = []
        async with trio.open_nursery() as nursery:
            await nursery.start(gc.run)

            async def put(end):
                store.max_physical_offset = max(store.max_physical_offset, end)
                oks.append(await gc.wait_flushed(end))

            async with trio.open_nursery() as puts:
                for i in range(50):
                    puts.start_soon(put, (i + 1) * 100)
            nursery.cancel_scope.cancel()
        assert oks == [True] * 50
        assert store.flush_calls < 50

    trio.run(main)


def test_group_commit_timeout():
    class Stuck(FakeStore):
        def flush(self):
            return 0

    async def main():
        store = Stuck()
        gc = GroupCommitService(store, timeout_s=0.2)
        async with trio.open_nursery() as nursery:
            await nursery.start(gc.run)
            store.max_physical_offset = 10
            assert await gc.wait_flushed(10) is False
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_group_commit_forgets_timed_out_waiters_while_fsync_fails():
    class Broken(FakeStore):
        def flush(self):
            self.flush_calls += 1
            raise OSError(5, "Input/output error")

    async def main():
        store = Broken()
        gc = GroupCommitService(store, timeout_s=0.05)
        async with trio.open_nursery() as nursery:
            await nursery.start(gc.run)
            store.max_physical_offset = 10
            for _ in range(20):
                assert await gc.wait_flushed(10) is False
            assert gc._waiters == [] and gc.failing
            nursery.cancel_scope.cancel()
        assert store.flush_calls >= 1

    trio.run(main)
