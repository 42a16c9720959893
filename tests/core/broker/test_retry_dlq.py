"""CONSUMER_SEND_MSG_BACK (docs/protocol.md §5.10, §9.3): retry through %RETRY%<group> with a
delay, dead-letter queue after the retry budget, and the C++ push consumer's
RECONSUME_LATER round trip."""

from __future__ import annotations

import pytest

from core.common.msgid import decode_offset_msg_id
from core.common.names import SCHEDULE_TOPIC
from core.remoting import RequestCode, ResponseCode
from tests.core.broker.b_harness import (
    FAST_LEVELS,
    b_driver,
    cpp_produce,
    cpp_pull_all,
    create_topic,
    messages,
    prepare_consumer_topics,
    request,
    toml_config,
    wait_async,
)
from tests.core.broker.harness import ServerProcess, run_embedded, send_request, wait_until

SEND_BACK = RequestCode.CONSUMER_SEND_MSG_BACK


async def _stored(server, client, topic, body=b"payload", props=None):
    """Send one message and return it as stored (MessageExt)."""
    props = {"TAGS": "A", "UNIQ_KEY": "UK1", **(props or {})}
    broker = server.broker
    resp = await client.invoke(broker.broker_addr, send_request(topic, body, properties=props))
    assert resp.code == 0, resp.remark
    _ip, _port, phys = decode_offset_msg_id(resp.ext_fields["msgId"])
    return broker.store.look_message(phys)


def _send_back(offset, group, delay_level=0, version=None, **extra):
    cmd = request(SEND_BACK, offset=offset, group=group, delayLevel=delay_level, **extra)
    if version is not None:
        cmd.version = version
    return cmd


def test_send_back_goes_to_retry_topic_through_the_delay_levels(tmp_path):
    async def body(server, client):
        broker = server.broker
        addr = broker.broker_addr
        msg = await _stored(server, client, "RetryT")
        resp = await client.invoke(addr, _send_back(msg.commitlog_offset, "CID_R"))
        assert resp.code == ResponseCode.SUCCESS, resp.remark

        # First retry: level 3 + reconsumeTimes(0) -> queue 2 of the schedule topic.
        units = broker.store.units(SCHEDULE_TOPIC, 2, 0, 10)
        assert len(units) == 1
        parked = broker.store.look_message(units[0][0])
        assert parked.properties["REAL_TOPIC"] == "%RETRY%CID_R"
        assert parked.reconsume_times == 1

        tc = broker.topic_config_manager.get("%RETRY%CID_R")
        assert (tc.read_queue_nums, tc.write_queue_nums, tc.perm) == (1, 1, 6)

        got = await wait_async(lambda: messages(client, addr, "%RETRY%CID_R"), 15, "retry")
        retry = got[0]
        assert retry.body == b"payload"
        assert retry.reconsume_times == 1
        assert retry.properties["RETRY_TOPIC"] == "RetryT"
        assert retry.properties["ORIGIN_MESSAGE_ID"] == msg.offset_msg_id
        assert retry.properties["UNIQ_KEY"] == "UK1"
        assert retry.born_timestamp == msg.born_timestamp
        assert "DELAY" not in retry.properties

        # Second send-back of the retried copy: the origin id and first topic stay.
        resp = await client.invoke(addr, _send_back(retry.commitlog_offset, "CID_R"))
        assert resp.code == ResponseCode.SUCCESS
        got = await wait_async(
            lambda: _at_least(messages(client, addr, "%RETRY%CID_R"), 2), 15, "2nd retry"
        )
        again = got[1]
        assert again.reconsume_times == 2
        assert again.properties["ORIGIN_MESSAGE_ID"] == msg.offset_msg_id
        assert again.properties["RETRY_TOPIC"] == "RetryT"
        assert broker.schedule_service.offset_table.get(4) == 1  # level 3 + 1

    run_embedded(body, tmp_path, message_delay_level=FAST_LEVELS)


async def _at_least(coro, n):
    got = await coro
    return got if len(got) >= n else None


def test_negative_delay_level_and_spent_budget_go_to_dlq(tmp_path):
    async def body(server, client):
        broker = server.broker
        addr = broker.broker_addr
        msg = await _stored(server, client, "DlqT")
        resp = await client.invoke(addr, _send_back(msg.commitlog_offset, "CID_D", -1))
        assert resp.code == ResponseCode.SUCCESS
        dlq = await messages(client, addr, "%DLQ%CID_D")
        assert len(dlq) == 1  # immediately, no delay
        assert dlq[0].reconsume_times == 1
        assert dlq[0].properties["RETRY_TOPIC"] == "DlqT"
        tc = broker.topic_config_manager.get("%DLQ%CID_D")
        assert (tc.read_queue_nums, tc.perm) == (1, 6)

        # retry_max_times 2: a message already consumed twice goes to the DLQ.
        worn = await client.invoke(addr, send_request(
            "DlqT", b"tired", properties={"TAGS": "A"}, reconsume_times=2))
        assert worn.code == 0
        stored = (await messages(client, addr, "DlqT"))[-1]
        assert stored.reconsume_times == 2
        resp = await client.invoke(addr, _send_back(stored.commitlog_offset, "CID_D"))
        assert resp.code == ResponseCode.SUCCESS
        dlq = await messages(client, addr, "%DLQ%CID_D")
        assert [m.body for m in dlq] == [b"payload", b"tired"]
        assert dlq[1].reconsume_times == 3

    run_embedded(body, tmp_path, retry_max_times=2)


def test_header_max_reconsume_times_only_for_new_clients(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        msg = await _stored(server, client, "MaxT")
        # version 63 (the C++ wheel): the header is ignored, group default 16 applies.
        resp = await client.invoke(addr, _send_back(
            msg.commitlog_offset, "CID_M", version=63, maxReconsumeTimes=0))
        assert resp.code == ResponseCode.SUCCESS
        assert await messages(client, addr, "%DLQ%CID_M") == []
        # version >= V3_4_9 (121): maxReconsumeTimes 0 sends it straight to the DLQ.
        resp = await client.invoke(addr, _send_back(
            msg.commitlog_offset, "CID_M", version=407, maxReconsumeTimes=0))
        assert resp.code == ResponseCode.SUCCESS
        assert len(await messages(client, addr, "%DLQ%CID_M")) == 1

    run_embedded(body, tmp_path)


def test_send_back_errors(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        resp = await client.invoke(addr, _send_back(987654321, "CID_E"))
        assert resp.code == ResponseCode.SYSTEM_ERROR
        assert resp.remark == "look message by offset failed, 987654321"
        resp = await client.invoke(addr, request(SEND_BACK, group="CID_E"))
        assert resp.code == ResponseCode.SYSTEM_ERROR  # offset missing
        resp = await client.invoke(addr, request(SEND_BACK, group="CID_E", offset="x"))
        assert resp.code == ResponseCode.SYSTEM_ERROR

    run_embedded(body, tmp_path)


def test_unknown_group_without_auto_create(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        msg = await _stored(server, client, "NoGroupT")
        resp = await client.invoke(addr, _send_back(msg.commitlog_offset, "CID_UNKNOWN"))
        assert resp.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST

    run_embedded(body, tmp_path, auto_create_subscription_group=False)


@pytest.mark.slow
def test_cpp_reconsume_later_comes_back_from_retry_topic(tmp_path):
    config = toml_config(message_delay_level=FAST_LEVELS)
    with ServerProcess(tmp_path / "data", config_text=config) as server:
        prepare_consumer_topics(server, "LaterT", "CID_LATER")
        consumer = b_driver("push_consumer.py", "--namesrv", server.namesrv_addr,
                            "--group", "CID_LATER", "--topic", "LaterT", "--fail-first", "1",
                            "--expect", "1", "--max-seconds", "90")
        try:
            consumer.wait_for(lambda ev: any(e["event"] == "started" for e in ev), 30)
            sent = cpp_produce(server.namesrv_addr, "LaterT", 1, prefix="again")
            consumer.wait_for(
                lambda ev: any(e.get("result") == "ok" for e in ev), 90, "the redelivery"
            )
        finally:
            events = consumer.close()
    got = [e for e in events if e["event"] == "msg"]
    assert [e["body"] for e in got] == [sent[0]["body"]] * 2
    first, second = got
    assert first["result"] == "later" and first["reconsume_times"] == 0
    assert second["result"] == "ok" and second["reconsume_times"] == 1
    # The C++ client restores the original topic from RETRY_TOPIC (docs/protocol.md §5.10).
    assert second["topic"] == "LaterT"
    assert second["properties"]["RETRY_TOPIC"] == "LaterT"
    assert second["properties"].get("ORIGIN_MESSAGE_ID")
    assert second["id"] == first["id"]  # same UNIQ_KEY


@pytest.mark.slow
def test_cpp_message_lands_in_dlq_after_max_reconsume_times(tmp_path):
    config = toml_config(message_delay_level=FAST_LEVELS, retry_max_times=2)
    with ServerProcess(tmp_path / "data", config_text=config) as server:
        prepare_consumer_topics(server, "DeadT", "CID_DEAD")
        create_topic(server.broker_addr, "%DLQ%CID_DEAD", 1)
        consumer = b_driver("push_consumer.py", "--namesrv", server.namesrv_addr,
                            "--group", "CID_DEAD", "--topic", "DeadT", "--fail-always",
                            "--max-seconds", "90")
        try:
            consumer.wait_for(lambda ev: any(e["event"] == "started" for e in ev), 30)
            sent = cpp_produce(server.namesrv_addr, "DeadT", 1, prefix="doomed")

            def dead_lettered():
                return cpp_pull_all(server.namesrv_addr, "%DLQ%CID_DEAD") or None

            dlq = wait_until(dead_lettered, 60, interval=1.0, what="the DLQ message")
        finally:
            events = consumer.close()
    tries = [e for e in events if e["event"] == "msg"]
    # Delivered with reconsume times 0, 1, 2 - then the budget (2) is spent.
    assert [e["reconsume_times"] for e in tries] == [0, 1, 2]
    assert len(dlq) == 1
    dead = dlq[0]
    assert dead["body"] == sent[0]["body"]
    assert dead["reconsume_times"] == 3
    assert dead["properties"]["RETRY_TOPIC"] == "DeadT"
