"""SEND_MESSAGE / SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE against a real broker (TCP)."""

from __future__ import annotations

import zlib

from core.common.codec import decode_host, decode_records, encode_host
from core.common.msgid import decode_offset_msg_id
from core.common.properties import decode_properties
from core.remoting.codec import RemotingCommand
from tests.core.broker.harness import (
    batch_body,
    pull_request,
    run_embedded,
    send_request,
)

UNIQ = "0100007F00000BDA0000F689596E0100"
CPP_PROPS = f"KEYS\x01key-0\x02TAGS\x01TagA\x02UNIQ_KEY\x01{UNIQ}\x02WAIT\x01true\x02custom\x01v0\x02"


async def pull_all(client, addr, topic, queue_id=0, group="CID_T"):
    resp = await client.invoke(addr, pull_request(group, topic, queue_id, 0))
    assert resp.code == 0, (resp.code, resp.remark)
    return decode_records(resp.body_bytes())


def test_single_send_cpp_style(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        resp = await client.invoke(addr, send_request("SendT", b"hello", properties=CPP_PROPS))
        assert resp.code == 0, resp.remark
        ext = resp.ext_fields
        # Every value a string (the C++ decoder ignores numbers) — check the wire form.
        assert all(isinstance(v, str) for v in ext.values())
        assert ext["queueId"] == "0" and ext["queueOffset"] == "0"
        assert ext["MSG_REGION"] == "DefaultRegion" and ext["TRACE_ON"] == "true"
        ip, port, offset = decode_offset_msg_id(ext["msgId"])
        assert f"{ip}:{port}" == addr
        conn = await client.connection(addr)
        [msg] = await pull_all(client, addr, "SendT")
        assert msg.body == b"hello" and msg.topic == "SendT" and msg.commitlog_offset == offset
        assert msg.store_host == addr
        assert msg.born_host == conn.local_addr
        assert msg.properties["CLUSTER"] == "DefaultCluster"
        assert msg.properties["UNIQ_KEY"] == UNIQ and msg.properties["custom"] == "v0"
        assert "WAIT" not in msg.properties

    run_embedded(body, tmp_path)


def test_send_v2_letters_and_auto_created_topic(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        resp = await client.invoke(addr, send_request("V2Topic", b"v2", code=310, queue_id=3,
                                                      properties={"TAGS": "x"}))
        assert resp.code == 0, resp.remark
        assert resp.ext_fields["queueId"] == "3"
        tc = server.broker.topic_config_manager.get("V2Topic")
        assert (tc.read_queue_nums, tc.perm) == (4, 6)  # min(4 requested, 8 of TBW102)
        [msg] = await pull_all(client, addr, "V2Topic", 3)
        assert msg.body == b"v2" and msg.queue_id == 3

    run_embedded(body, tmp_path)


def test_batch_send_all_flavours(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        items = [(f"b{i}".encode(), {"TAGS": "TagB", "UNIQ_KEY": f"U{i}", "WAIT": "true"})
                 for i in range(3)]
        raw = batch_body(items)
        offset = 0
        for code, flag in ((10, "1"), (10, "true"), (320, None), (310, "true")):
            resp = await client.invoke(addr, send_request(
                "BatchT", raw, code=code, batch=flag, properties={"WAIT": "true"}))
            assert resp.code == 0, (code, resp.remark)
            ids = resp.ext_fields["msgId"].split(",")
            assert len(ids) == 3
            assert resp.ext_fields["queueOffset"] == str(offset)
            offset += 3
        msgs = await pull_all(client, addr, "BatchT")
        assert [m.queue_offset for m in msgs] == list(range(12))
        assert [m.body for m in msgs[:3]] == [b"b0", b"b1", b"b2"]
        for m in msgs:
            assert m.properties["CLUSTER"] == "DefaultCluster"
            assert "WAIT" not in m.properties and m.properties["TAGS"] == "TagB"
        assert msgs[1].properties["UNIQ_KEY"] == "U1"

    run_embedded(body, tmp_path)


def test_compressed_batch_is_inflated_and_split(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        items = [(f"payload-{i}-".encode() * 200, {"UNIQ_KEY": f"C{i}"}) for i in range(4)]
        raw = batch_body(items)
        assert len(raw) >= 4096
        resp = await client.invoke(addr, send_request(
            "ZBatch", zlib.compress(raw, 5), batch=True, sys_flag=1))
        assert resp.code == 0, resp.remark
        msgs = await pull_all(client, addr, "ZBatch")
        assert [m.body for m in msgs] == [b for b, _ in items]
        assert all(m.sys_flag & 1 == 0 for m in msgs)
        # a corrupt compressed batch is refused, not stored
        bad = await client.invoke(addr, send_request("ZBatch", b"\x78\x9cnot zlib", batch=True,
                                                     sys_flag=1))
        assert bad.code == 13

    run_embedded(body, tmp_path)


def test_single_compressed_body_is_stored_as_is(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        payload = zlib.compress(b"z" * 5000)
        resp = await client.invoke(addr, send_request("ZOne", payload, sys_flag=1))
        assert resp.code == 0
        [msg] = await pull_all(client, addr, "ZOne")
        assert msg.body == payload and msg.sys_flag & 1

    run_embedded(body, tmp_path)


def test_queue_selection(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        seen = set()
        for _ in range(20):
            resp = await client.invoke(addr, send_request("QSel", queue_id=-1))
            assert resp.code == 0
            seen.add(int(resp.ext_fields["queueId"]))
        assert seen <= {0, 1, 2, 3} and len(seen) > 1
        resp = await client.invoke(addr, send_request("QSel", queue_id=4))
        assert resp.code == 1 and "queueId[4] is illegal" in resp.remark

    run_embedded(body, tmp_path)


def test_send_refusals(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        for topic in ("SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "OFFSET_MOVED_EVENT"):
            resp = await client.invoke(addr, send_request(topic))
            assert resp.code == 16 and "forbidden" in resp.remark
        resp = await client.invoke(addr, send_request("bad topic!"))
        assert resp.code == 1 and "illegal" in resp.remark
        resp = await client.invoke(addr, send_request("T" * 128))
        assert resp.code == 1
        resp = await client.invoke(addr, send_request("MissingField", drop=("bornTimestamp",)))
        assert resp.code == 1 and "bornTimestamp" in resp.remark
        resp = await client.invoke(addr, send_request("BadInt", extra={"queueId": "x"}))
        assert resp.code == 1 and "queueId" in resp.remark
        big = b"x" * (server.broker.config.max_message_size + 1)
        resp = await client.invoke(addr, send_request("Big", big))
        assert resp.code == 13 and "size" in resp.remark
        resp = await client.invoke(addr, send_request("%LMQ%direct"))
        assert resp.code == 16

    run_embedded(body, tmp_path)


def test_unknown_topic_without_auto_create(tmp_path):
    async def body(server, client):
        resp = await client.invoke(server.broker.broker_addr, send_request("NoAuto"))
        assert resp.code == 17 and "not exist" in resp.remark

    run_embedded(body, tmp_path, auto_create_topic_enable=False)


def test_retry_topic_over_max_goes_to_dlq(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        ok = await client.invoke(addr, send_request("%RETRY%G1", b"r", reconsume_times=3))
        assert ok.code == 0
        dead = await client.invoke(addr, send_request("%RETRY%G1", b"dead", reconsume_times=16))
        assert dead.code == 0
        [msg] = await pull_all(client, addr, "%DLQ%G1")
        assert msg.body == b"dead" and msg.reconsume_times == 16
        [retry] = await pull_all(client, addr, "%RETRY%G1")
        assert retry.body == b"r"

    run_embedded(body, tmp_path)


def test_delay_is_diverted_to_schedule_topic(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        resp = await client.invoke(addr, send_request("DelayT", b"later", properties={"DELAY": "3"}))
        assert resp.code == 0
        store = server.broker.store
        assert store.max_offset("SCHEDULE_TOPIC_XXXX", 2) == 1
        assert store.max_offset("DelayT", 0) == 0

    run_embedded(body, tmp_path)


def test_oneway_flag_gets_no_answer_but_is_stored(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        await client.invoke_oneway(addr, send_request("OneWay", b"1"))
        resp = await client.invoke(addr, send_request("OneWay", b"2"))
        assert resp.code == 0
        msgs = await pull_all(client, addr, "OneWay")
        assert sorted(m.body for m in msgs) == [b"1", b"2"]

    run_embedded(body, tmp_path)


def test_sync_flush_mode(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        store = server.broker.store
        resp = await client.invoke(addr, send_request("SyncT", b"durable"))
        assert resp.code == 0
        assert store.flushed_offset >= store.max_physical_offset
        assert server.broker._group_commit.flushes >= 1

    run_embedded(body, tmp_path, flush="sync")


def test_store_host_and_born_host_encoding():
    assert decode_host(encode_host("10.0.0.1:10911")) == "10.0.0.1:10911"
    assert decode_properties(CPP_PROPS)["TAGS"] == "TagA"
    assert RemotingCommand.request(10).code == 10


def test_transactional_send_becomes_half_message(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        resp = await client.invoke(addr, send_request(
            "TxT", b"half", sys_flag=4, properties={"TRAN_MSG": "true", "PGROUP": "PID_TX"}))
        assert resp.code == 0, resp.remark
        store = server.broker.store
        assert store.max_offset("RMQ_SYS_TRANS_HALF_TOPIC", 0) == 1
        assert store.max_offset("TxT", 0) == 0

    run_embedded(body, tmp_path)
