"""Scheduled messages (docs/protocol.md §9.1, §9.2): delay levels, SCHEDULE_TOPIC_XXXX,
delivery when due, delayOffset.json, and delivery after kill -9."""

from __future__ import annotations

import json
import time

import pytest

from core.broker.schedule import parse_delay_levels
from core.common.message import InnerMessage
from core.common.names import SCHEDULE_TOPIC
from core.common.taghash import tag_hash
from core.remoting import RequestCode
from tests.core.broker.b_harness import (
    b_driver,
    cpp_produce,
    cpp_pull_all,
    messages,
    messages_sync,
    prepare_consumer_topics,
    request,
    toml_config,
    wait_async,
)
from tests.core.broker.harness import (
    ServerProcess,
    run_embedded,
    send_request,
    sync_invoke,
    wait_until,
)


def test_default_delay_levels_are_java_s():
    delays = parse_delay_levels("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h")
    assert len(delays) == 18
    assert delays[:5] == [1000, 5000, 10000, 30000, 60000]
    assert delays[-1] == 2 * 3600 * 1000
    assert parse_delay_levels("2d") == [2 * 86400 * 1000]


@pytest.mark.parametrize("bad", ["", "1x", "s", "1s -5s", "1.5s"])
def test_bad_delay_levels_are_refused(bad):
    with pytest.raises(ValueError):
        parse_delay_levels(bad)


def test_delayed_send_is_parked_in_schedule_topic(tmp_path):
    async def body(server, client):
        broker = server.broker
        addr = broker.broker_addr
        resp = await client.invoke(
            addr, send_request("DelayT", properties={"DELAY": "3", "TAGS": "A"})
        )
        assert resp.code == 0
        assert broker.store.max_offset("DelayT", 0) == 0  # nothing visible yet
        units = broker.store.units(SCHEDULE_TOPIC, 2, 0, 10)  # level 3 -> queue 2
        assert len(units) == 1
        phys, _size, due = units[0]
        parked = broker.store.look_message(phys)
        assert parked.topic == SCHEDULE_TOPIC and parked.queue_id == 2
        assert parked.properties["REAL_TOPIC"] == "DelayT"
        assert parked.properties["REAL_QID"] == "0"
        assert parked.properties["DELAY"] == "3"
        # The CQ tag slot holds the delivery time: store time + 10 s (docs/protocol.md §7.10).
        assert abs(due - (parked.store_timestamp + 10_000)) < 1000

        # Levels above the last are clamped to it, DELAY included.
        resp = await client.invoke(addr, send_request("DelayT", properties={"DELAY": "99"}))
        assert resp.code == 0
        units = broker.store.units(SCHEDULE_TOPIC, 17, 0, 10)
        assert len(units) == 1
        assert broker.store.look_message(units[0][0]).properties["DELAY"] == "18"

    run_embedded(body, tmp_path)


def test_due_message_is_delivered_and_progress_persisted(tmp_path):
    async def body(server, client):
        broker = server.broker
        addr = broker.broker_addr
        # A 1 h message first: the service then sleeps towards a far due time, and the
        # 1 s message sent next must wake it up early.
        assert (await client.invoke(addr, send_request(
            "DelayT", b"late", properties={"DELAY": "2", "TAGS": "B"}))).code == 0
        assert (await client.invoke(addr, send_request(
            "DelayT", b"soon", properties={"DELAY": "1", "TAGS": "A", "KEYS": "k1"}))).code == 0
        got = await wait_async(
            lambda: messages(client, addr, "DelayT"), 15, "delivery of the 1 s message"
        )
        assert [m.body for m in got] == [b"soon"]
        msg = got[0]
        assert msg.topic == "DelayT" and msg.queue_id == 0
        assert "DELAY" not in msg.properties
        assert msg.properties["KEYS"] == "k1"
        assert msg.store_timestamp - msg.born_timestamp >= 1000  # never early
        # Delivered as a normal message: the tag slot is the TAGS hash again.
        assert broker.store.units("DelayT", 0, 0, 1)[0][2] == tag_hash("A")

        path = tmp_path / "data" / "config" / "delayOffset.json"
        await wait_async(lambda: path.exists() and json.loads(path.read_text())
                         ["offsetTable"].get("1") == 1, 10, "delayOffset.json")
        assert json.loads(path.read_text())["offsetTable"].get("2", 0) == 0
        assert broker.schedule_service.offset_table.get(2, 0) == 0
        # Admin tools read the same progress with GET_ALL_DELAY_OFFSET.
        resp = await client.invoke(addr, request(RequestCode.GET_ALL_DELAY_OFFSET))
        assert resp.code == 0
        assert json.loads(resp.body_bytes())["offsetTable"]["1"] == 1
        # One schedule queue per configured level.
        assert broker.topic_config_manager.get(SCHEDULE_TOPIC).write_queue_nums == 2

    run_embedded(body, tmp_path, message_delay_level="1s 1h")


def test_unusable_scheduled_record_is_skipped(tmp_path):
    async def body(server, client):
        broker = server.broker
        addr = broker.broker_addr
        # A record without REAL_TOPIC at the head of level 1 (only the broker can write
        # one: producers may not send to SCHEDULE_TOPIC_XXXX).
        bad = InnerMessage(topic=SCHEDULE_TOPIC, body=b"bad", queue_id=0,
                           properties={"DELAY": "1"}, tags_code=int(time.time() * 1000))
        assert (await broker.put_message(bad)).status.name == "OK"
        assert (await client.invoke(addr, send_request(
            "DelayS", b"good", properties={"DELAY": "1"}))).code == 0
        got = await wait_async(lambda: messages(client, addr, "DelayS"), 15, "delivery")
        assert [m.body for m in got] == [b"good"]
        assert broker.schedule_service.skipped == 1
        assert broker.schedule_service.offset_table[1] == 2

    run_embedded(body, tmp_path)


def test_progress_survives_clean_restart_without_double_delivery(tmp_path):
    async def first(server, client):
        addr = server.broker.broker_addr
        for i in range(3):
            assert (await client.invoke(addr, send_request(
                "DelayR", f"m{i}".encode(), properties={"DELAY": "1"}))).code == 0
        await wait_async(lambda: server.broker.store.max_offset("DelayR", 0) == 3, 15,
                         "three deliveries")
        # One more, due only after the restart.
        assert (await client.invoke(addr, send_request(
            "DelayR", b"later", properties={"DELAY": "2"}))).code == 0

    async def second(server, client):
        addr = server.broker.broker_addr
        await wait_async(lambda: server.broker.store.max_offset("DelayR", 0) == 4, 15,
                         "the pending message")
        got = await messages(client, addr, "DelayR")
        assert sorted(m.body for m in got) == [b"later", b"m0", b"m1", b"m2"]

    run_embedded(first, tmp_path, message_delay_level="1s 2s")
    run_embedded(second, tmp_path, message_delay_level="1s 2s")


@pytest.mark.slow
def test_cpp_delayed_message_arrives_no_earlier_than_its_delay(tmp_path):
    with ServerProcess(tmp_path / "data") as server:
        prepare_consumer_topics(server, "DelayCpp", "CID_DELAY")
        consumer = b_driver("push_consumer.py", "--namesrv", server.namesrv_addr,
                            "--group", "CID_DELAY", "--topic", "DelayCpp", "--expect", "2",
                            "--max-seconds", "60")
        try:
            consumer.wait_for(lambda ev: any(e["event"] == "started" for e in ev), 30)
            sent = cpp_produce(server.namesrv_addr, "DelayCpp", 2, delay=1, prefix="d")
            consumer.wait_for(lambda ev: sum(e["event"] == "msg" for e in ev) >= 2, 60,
                              "two delayed messages")
        finally:
            events = consumer.close()
        got = [e for e in events if e["event"] == "msg"]
        assert sorted(e["body"] for e in got) == sorted(e["body"] for e in sent)
        for e in got:
            assert e["topic"] == "DelayCpp"
            assert e["reconsume_times"] == 0
            # Level 1 = 1 s: the delivered record was stored at least 1 s after birth.
            assert e["store_timestamp"] - e["born_timestamp"] >= 1000


@pytest.mark.slow
def test_delayed_messages_delivered_after_kill_9(tmp_path):
    data = tmp_path / "data"
    config = toml_config(message_delay_level="1s 4s")
    server = ServerProcess(data, config_text=config).start()
    try:
        early = cpp_produce(server.namesrv_addr, "DelayKill", 3, delay=1, prefix="early")
        late = cpp_produce(server.namesrv_addr, "DelayKill", 3, delay=2, prefix="late")
        progress = data / "config" / "delayOffset.json"
        # The 1 s messages are delivered and their progress persisted before the crash.
        wait_until(lambda: progress.exists() and json.loads(progress.read_text())
                   ["offsetTable"].get("1", 0) >= 3, 20, what="level 1 delivered")
    finally:
        server.kill()

    again = ServerProcess(data, namesrv_port=server.namesrv_port,
                          broker_port=server.broker_port, config_text=config).start()
    try:
        # Every record in the schedule queues (6, or more if a C++ send was retried
        # under load) must reach the real topic exactly once.
        scheduled = sum(
            int(sync_invoke(again.broker_addr, request(
                RequestCode.GET_MAX_OFFSET, topic=SCHEDULE_TOPIC, queueId=q)
            ).ext_fields["offset"])
            for q in (0, 1)
        )
        assert scheduled >= 6

        def delivered():
            out = []
            for q in range(8):
                out += messages_sync(again.broker_addr, "DelayKill", q)
            return out if len(out) >= scheduled else None

        got = wait_until(delivered, 30, what="all delayed messages")
        time.sleep(1.0)  # a double delivery would show up now
        got = delivered()
        assert len(got) == scheduled  # nothing delivered twice
        bodies = sorted(m.body.decode() for m in got)
        assert set(bodies) == {e["body"] for e in early + late}  # nothing lost
        for m in got:
            delay = 1000 if m.body.startswith(b"early") else 4000
            assert m.store_timestamp - m.born_timestamp >= delay
            assert "DELAY" not in m.properties
        # The real client reads them from the real topic.
        seen = cpp_pull_all(again.namesrv_addr, "DelayKill")
        assert sorted(e["body"] for e in seen) == bodies
    finally:
        again.kill()
