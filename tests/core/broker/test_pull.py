"""PULL_MESSAGE: the status table, filters, long polling, commit side effect, LMQ pulls."""

from __future__ import annotations

import functools

import trio
from trio.testing import MockClock, wait_all_tasks_blocked

from core.common.codec import decode_records
from core.remoting.codec import RemotingCommand
from tests.core.broker.harness import (
    cpp_consumer_data,
    heartbeat_request,
    pull_request,
    run_embedded,
    send_request,
)

SUSPEND = 2
SUBSCRIPTION = 4
COMMIT = 1


async def send_n(client, addr, topic, n, queue_id=0, tags=None, props=None):
    for i in range(n):
        p = dict(props or {})
        if tags:
            p["TAGS"] = tags[i % len(tags)]
        resp = await client.invoke(addr, send_request(topic, f"m{i}".encode(),
                                                      queue_id=queue_id, properties=p))
        assert resp.code == 0, resp.remark


def test_status_table(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr

        async def pull(offset, topic="PullT"):
            r = await client.invoke(addr, pull_request("CID_P", topic, 0, offset))
            return r.code, int(r.ext_fields["nextBeginOffset"]), r

        await send_n(client, addr, "Other", 1)  # creates nothing for PullT
        await client.invoke(addr, send_request("PullT", queue_id=1))  # topic exists, q0 empty
        assert (await pull(0))[:2] == (19, 0)
        assert (await pull(5))[:2] == (21, 0)
        await send_n(client, addr, "PullT", 3)
        code, nxt, r = await pull(0)
        assert (code, nxt) == (0, 3)
        assert r.ext_fields["minOffset"] == "0" and r.ext_fields["maxOffset"] == "3"
        assert r.ext_fields["suggestWhichBrokerId"] == "0"
        assert [m.body for m in decode_records(r.body_bytes())] == [b"m0", b"m1", b"m2"]
        assert (await pull(3))[:2] == (19, 3)
        assert (await pull(10))[:2] == (21, 3)
        code, nxt, r = await pull(1)
        assert (code, nxt) == (0, 3) and len(decode_records(r.body_bytes())) == 2
        small = await client.invoke(addr, pull_request("CID_P", "PullT", 0, 0, max_nums=2))
        assert small.ext_fields["nextBeginOffset"] == "2"

    run_embedded(body, tmp_path)


def test_pull_errors(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        r = await client.invoke(addr, pull_request("CID_P", "NoSuchTopic"))
        assert r.code == 17
        await send_n(client, addr, "ErrT", 1)
        r = await client.invoke(addr, pull_request("CID_P", "ErrT", 9))
        assert r.code == 1 and "queueId[9]" in r.remark
        bad = pull_request("CID_P", "ErrT")
        del bad.ext_fields["queueOffset"]
        r = await client.invoke(addr, bad)
        assert r.code == 1 and "queueOffset" in r.remark
        # no SUBSCRIPTION bit and no heartbeat: the broker has no subscription to use
        r = await client.invoke(addr, pull_request("CID_P", "ErrT", sys_flag=0))
        assert r.code == 24
        r = await client.invoke(addr, pull_request("CID_P", "ErrT", subscription="a >",
                                                   expression_type="SQL92"))
        assert r.code == 23

    run_embedded(body, tmp_path)


def test_tag_filter_by_hash(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        await send_n(client, addr, "TagT", 3, tags=["TagA", "TagB", "TagA"])
        r = await client.invoke(addr, pull_request("CID_P", "TagT", subscription="TagB"))
        assert r.code == 0
        assert [m.properties["TAGS"] for m in decode_records(r.body_bytes())] == ["TagB"]
        r = await client.invoke(addr, pull_request("CID_P", "TagT", subscription="TagA || TagB"))
        assert len(decode_records(r.body_bytes())) == 3
        r = await client.invoke(addr, pull_request("CID_P", "TagT", subscription="TagC"))
        assert r.code == 20 and r.ext_fields["nextBeginOffset"] == "3"

    run_embedded(body, tmp_path)


def test_sql92_and_heartbeat_subscription(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        for a in (1, 5, 9):
            await client.invoke(addr, send_request("SqlT", f"a{a}".encode(),
                                                   properties={"a": str(a), "TAGS": "X"}))
        r = await client.invoke(addr, pull_request("CID_S", "SqlT", subscription="a > 3",
                                                   expression_type="SQL92"))
        assert [m.body for m in decode_records(r.body_bytes())] == [b"a5", b"a9"]
        # Java push consumers pull without the SUBSCRIPTION bit: the heartbeat's is used.
        hb = heartbeat_request("java-1", consumers=[{
            "groupName": "CID_S", "consumeType": "CONSUME_PASSIVELY",
            "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
            "unitMode": False,
            "subscriptionDataSet": [{"topic": "SqlT", "subString": "a = 1", "subVersion": 1,
                                     "expressionType": "SQL92", "tagsSet": [], "codeSet": [],
                                     "classFilterMode": False}],
        }])
        assert (await client.invoke(addr, hb)).code == 0
        r = await client.invoke(addr, pull_request("CID_S", "SqlT", sys_flag=0))
        assert [m.body for m in decode_records(r.body_bytes())] == [b"a1"]

    run_embedded(body, tmp_path)


def test_long_polling_wakes_on_new_message(tmp_path):
    # Time stands still (MockClock) unless the test jumps it; client, broker and the loopback
    # socket all run in this trio loop, so once every task is blocked an answer the broker
    # would already have given has been received.
    clock = MockClock()

    async def body(server, client):
        addr = server.broker.broker_addr
        await send_n(client, addr, "LongT", 1)
        result = {}

        async def puller():
            req = pull_request("CID_L", "LongT", 0, 1, sys_flag=SUSPEND | SUBSCRIPTION,
                               suspend_ms=20000)
            result["resp"] = await client.invoke(addr, req, timeout=30)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(puller)
            await wait_all_tasks_blocked()
            assert "resp" not in result  # held
            assert server.broker.pull_hold_service.held == 1
            clock.jump(19.5)  # most of the suspend time has passed: still held
            await wait_all_tasks_blocked()
            assert "resp" not in result
            await send_n(client, addr, "LongT", 1, queue_id=1)  # other queue: still held
            await wait_all_tasks_blocked()
            assert "resp" not in result
            assert server.broker.pull_hold_service.held == 1
            await send_n(client, addr, "LongT", 1)
        r = result["resp"]
        assert r.code == 0 and r.ext_fields["nextBeginOffset"] == "2"
        assert [m.body for m in decode_records(r.body_bytes())] == [b"m0"]
        assert server.broker.pull_hold_service.held == 0

    run_embedded(body, tmp_path, clock=clock)


def test_long_polling_skips_unmatched_and_times_out(tmp_path):
    clock = MockClock()

    async def body(server, client):
        addr = server.broker.broker_addr
        await send_n(client, addr, "LongF", 1, tags=["A"])
        result = {}

        async def puller(key, **kw):
            req = pull_request("CID_L", "LongF", 0, 1, sys_flag=SUSPEND | SUBSCRIPTION, **kw)
            result[key] = await client.invoke(addr, req, timeout=30)

        async with trio.open_nursery() as nursery:
            # nothing arrives: answered (19) when the suspend time is up, not before
            nursery.start_soon(functools.partial(puller, "timeout", suspend_ms=3000))
            await wait_all_tasks_blocked()
            clock.jump(2.9)
            await wait_all_tasks_blocked()
            assert "timeout" not in result
            clock.jump(0.2)
        r = result["timeout"]
        assert r.code == 19 and r.ext_fields["nextBeginOffset"] == "1"

        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(puller, "resp", suspend_ms=20000,
                                                 subscription="B"))
            await wait_all_tasks_blocked()
            assert server.broker.pull_hold_service.held == 1
            await send_n(client, addr, "LongF", 1, tags=["A"])
            await wait_all_tasks_blocked()
            assert "resp" not in result  # a non-matching message does not answer the pull
            assert server.broker.pull_hold_service.held == 1
            await send_n(client, addr, "LongF", 1, tags=["B"])
        r = result["resp"]
        assert r.code == 0 and r.ext_fields["nextBeginOffset"] == "3"
        assert [m.properties["TAGS"] for m in decode_records(r.body_bytes())] == ["B"]

    run_embedded(body, tmp_path, clock=clock)


def test_commit_offset_side_effect(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        await send_n(client, addr, "CommitT", 2)
        r = await client.invoke(addr, pull_request("CID_C", "CommitT", 0, 2,
                                                   sys_flag=COMMIT | SUBSCRIPTION,
                                                   commit_offset=2))
        assert r.code == 19
        q = await client.invoke(addr, RemotingCommand.request(14, {
            "consumerGroup": "CID_C", "topic": "CommitT", "queueId": 0}))
        assert q.code == 0 and q.ext_fields["offset"] == "2"

    run_embedded(body, tmp_path)


def test_lmq_pull_and_offsets(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        props = {"INNER_MULTI_DISPATCH": "%LMQ%dev1,%LMQ%dev2", "TAGS": "t"}
        await send_n(client, addr, "Telemetry", 2, props=props)
        for lmq in ("%LMQ%dev1", "%LMQ%dev2"):
            r = await client.invoke(addr, pull_request("%LMQ%grp", lmq, 0, 0))
            assert r.code == 0, r.remark
            msgs = decode_records(r.body_bytes())
            assert [m.topic for m in msgs] == ["Telemetry", "Telemetry"]
            assert [m.properties["INNER_MULTI_QUEUE_OFFSET"] for m in msgs] == ["0,0", "1,1"]
        r = await client.invoke(addr, pull_request("%LMQ%grp", "%LMQ%dev1", 1, 0))
        assert r.code == 1
        r = await client.invoke(addr, pull_request("%LMQ%grp", "%LMQ%never", 0, 0))
        assert r.code == 19
        upd = await client.invoke(addr, RemotingCommand.request(15, {
            "consumerGroup": "%LMQ%grp", "topic": "%LMQ%dev1", "queueId": 0,
            "commitOffset": "2"}))
        assert upd.code == 0
        om = server.broker.offset_manager
        assert om.lmq_table == {"%LMQ%dev1@%LMQ%grp": 2}
        assert "%LMQ%dev1" not in server.broker.topic_config_manager.table

    run_embedded(body, tmp_path, allow_inner_properties_without_acl=True)


def test_cpp_heartbeat_then_pull_without_subscription_bit(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        await send_n(client, addr, "HbT", 3, tags=["TagA", "TagB", "TagC"])
        hb = heartbeat_request("1-127.0.0.1@DEFAULT",
                               consumers=[cpp_consumer_data("CID_HB", "HbT", "TagA || TagC")])
        assert (await client.invoke(addr, hb)).code == 0
        r = await client.invoke(addr, pull_request("CID_HB", "HbT", sys_flag=0))
        assert [m.properties["TAGS"] for m in decode_records(r.body_bytes())] == ["TagA", "TagC"]

    run_embedded(body, tmp_path)
