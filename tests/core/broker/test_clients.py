"""HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP and NOTIFY_CONSUMER_IDS_CHANGED."""

from __future__ import annotations

import json

import trio
from trio.testing import wait_all_tasks_blocked

from core.remoting.client import RemotingClient
from core.remoting.codec import RemotingCommand
from core.remoting.processor import ProcessorTable
from tests.core.broker.harness import cpp_consumer_data, heartbeat_request, run_embedded


def consumer_list(resp) -> list[str]:
    assert resp.code == 0, resp.remark
    return json.loads(resp.body_bytes())["consumerIdList"]


def list_request(group: str) -> RemotingCommand:
    return RemotingCommand.request(38, {"consumerGroup": group})


def notify_recorder() -> tuple[ProcessorTable, list[str]]:
    table = ProcessorTable()
    seen: list[str] = []

    async def on_notify(ctx, cmd):
        seen.append(cmd.ext_str("consumerGroup"))
        return None

    table.register(40, on_notify)
    return table, seen


def test_cpp_heartbeat_registers_and_creates_retry_topic(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        hb = heartbeat_request("123-127.0.0.1@DEFAULT",
                               consumers=[cpp_consumer_data("CID_A", "T")],
                               producers=["PID_A"])
        hb.ext_fields.update({"AccessKey": "", "OnsChannel": "ALIYUN", "Signature": "x"})
        assert (await client.invoke(addr, hb)).code == 0
        tc = server.broker.topic_config_manager.get("%RETRY%CID_A")
        assert (tc.read_queue_nums, tc.perm) == (1, 6)
        assert consumer_list(await client.invoke(addr, list_request("CID_A"))) == [
            "123-127.0.0.1@DEFAULT"]
        info = server.broker.consumer_manager.get("CID_A")
        assert info.message_model == "CLUSTERING" and info.consume_type == "CONSUME_PASSIVELY"
        assert len(server.broker.producer_manager.connections_of_group("PID_A")) == 1
        none = await client.invoke(addr, list_request("CID_NONE"))
        assert none.code == 1 and none.remark == "no consumer for this group, CID_NONE"

    run_embedded(body, tmp_path)


def test_java_heartbeat_form(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        hb = heartbeat_request("10.0.0.1@123#456", consumers=[{
            "groupName": "CID_J", "consumeType": "CONSUME_PASSIVELY",
            "messageModel": "BROADCASTING", "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
            "unitMode": False,
            "subscriptionDataSet": [{"classFilterMode": False, "topic": "T", "subString": "a",
                                     "tagsSet": ["a"], "codeSet": [97], "subVersion": 17,
                                     "expressionType": "TAG"}],
        }], producers=["CLIENT_INNER_PRODUCER"])
        assert (await client.invoke(addr, hb)).code == 0
        info = server.broker.consumer_manager.get("CID_J")
        assert info.message_model == "BROADCASTING"
        assert info.consume_from_where == "CONSUME_FROM_FIRST_OFFSET"
        assert info.subscriptions["T"].sub_version == 17

    run_embedded(body, tmp_path)


def test_bad_heartbeats_are_refused(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        for raw in (b"", b"not json", b"[1,2]", b'{"consumerDataSet": 5}'):
            resp = await client.invoke(addr, RemotingCommand.request(34, {}, raw))
            assert resp.code == 1, raw
        # malformed entries inside an otherwise valid body are skipped
        resp = await client.invoke(addr, RemotingCommand.request(34, {}, json.dumps({
            "clientID": "c", "consumerDataSet": [5, {"groupName": "bad group!"},
                                                 {"groupName": "G", "subscriptionDataSet": [7]}],
        }).encode()))
        assert resp.code == 0

    run_embedded(body, tmp_path)


def test_membership_changes_notify_other_members(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        table_a, seen_a = notify_recorder()
        async with RemotingClient(processors=table_a) as a:
            hb_a = heartbeat_request("client-a", consumers=[cpp_consumer_data("CID_N", "T")])
            assert (await a.invoke(addr, hb_a)).code == 0
            # Broker and clients share this trio loop: once every task is blocked, whatever
            # the broker sends about a's own join has arrived.
            await wait_all_tasks_blocked()
            seen_a.clear()
            async with RemotingClient() as b:
                hb_b = heartbeat_request("client-b", consumers=[cpp_consumer_data("CID_N", "T")])
                assert (await b.invoke(addr, hb_b)).code == 0
                await wait_all_tasks_blocked()
                assert seen_a == ["CID_N"]
                assert consumer_list(await a.invoke(addr, list_request("CID_N"))) == [
                    "client-a", "client-b"]
                seen_a.clear()
            # b's connection closed: a hears about it and the list shrinks
            await wait_all_tasks_blocked()
            assert seen_a == ["CID_N"]
            assert consumer_list(await a.invoke(addr, list_request("CID_N"))) == ["client-a"]
            seen_a.clear()
            unreg = RemotingCommand.request(35, {"clientID": "client-a", "producerGroup": "",
                                                 "consumerGroup": "CID_N"})
            assert (await a.invoke(addr, unreg)).code == 0
            assert (await a.invoke(addr, list_request("CID_N"))).code == 1

    run_embedded(body, tmp_path)


def test_silent_clients_expire(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        hb = heartbeat_request("quiet", consumers=[cpp_consumer_data("CID_Q", "T")],
                               producers=["PID_Q"])
        assert (await client.invoke(addr, hb)).code == 0
        # Watch from another connection: the broker closes the silent client's own.
        async with RemotingClient() as observer:
            with trio.fail_after(10):
                while (await observer.invoke(addr, list_request("CID_Q"))).code == 0:
                    await trio.sleep(0.1)
        assert server.broker.producer_manager.connections_of_group("PID_Q") == []

    run_embedded(body, tmp_path, client_channel_expiry_s=0.5, client_scan_interval_s=0.1)


def test_unregister_with_empty_groups(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        hb = heartbeat_request("p1", producers=["PID_U"])
        assert (await client.invoke(addr, hb)).code == 0
        unreg = RemotingCommand.request(35, {"clientID": "p1", "producerGroup": "PID_U",
                                             "consumerGroup": ""})
        assert (await client.invoke(addr, unreg)).code == 0
        assert server.broker.producer_manager.connections_of_group("PID_U") == []
        missing = await client.invoke(addr, RemotingCommand.request(35, {}))
        assert missing.code == 1 and "clientID" in missing.remark

    run_embedded(body, tmp_path)


def test_silent_client_expires_and_its_connection_is_closed(tmp_path):
    """No heartbeat within client_channel_expiry_s: the member is dropped, the group told,
    and the connection closed, as Java's client housekeeping does."""
    async def body(server, client):
        addr = server.broker.broker_addr
        hb = heartbeat_request("quiet-1", consumers=[cpp_consumer_data("CID_Q", "T")],
                               producers=["PID_Q"])
        assert (await client.invoke(addr, hb)).code == 0
        conn = await client.connection(addr)
        with trio.fail_after(10):
            while server.broker.consumer_manager.get("CID_Q") is not None or not conn.closed:
                await trio.sleep(0.05)
        assert server.broker.producer_manager.connections_of_group("PID_Q") == []
        # The client reconnects and registers again.
        assert (await client.invoke(addr, hb)).code == 0
        assert consumer_list(await client.invoke(addr, list_request("CID_Q"))) == ["quiet-1"]

    run_embedded(body, tmp_path, client_channel_expiry_s=0.3, client_scan_interval_s=0.1)
