"""Offset requests, lookups, admin requests and name server registration."""

from __future__ import annotations

import json
import time

import trio

from core.broker.processors.admin import decode_mq_map
from core.common.codec import decode_records
from core.common.msgid import decode_offset_msg_id
from core.remoting.codec import RemotingCommand
from tests.core.broker.harness import (
    cpp_consumer_data,
    heartbeat_request,
    run_embedded,
    send_request,
)


def req(code: int, **ext) -> RemotingCommand:
    return RemotingCommand.request(code, {k: v for k, v in ext.items()})


def test_consumer_offsets(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        q = await client.invoke(addr, req(14, consumerGroup="NewG", topic="OffT", queueId=0))
        assert q.code == 0 and q.ext_fields["offset"] == "0"  # nothing deleted: from 0
        u = await client.invoke(addr, req(15, consumerGroup="NewG", topic="OffT", queueId=0,
                                          commitOffset="42"))
        assert u.code == 0
        q = await client.invoke(addr, req(14, consumerGroup="NewG", topic="OffT", queueId=0))
        assert q.ext_fields["offset"] == "42"
        bad = await client.invoke(addr, req(15, consumerGroup="NewG", topic="OffT", queueId=0))
        assert bad.code == 1 and "commitOffset" in bad.remark
        path = tmp_path / "data" / "config" / "consumerOffset.json"
        with trio.fail_after(5):
            while not path.exists():
                await trio.sleep(0.05)
        assert json.loads(path.read_text())["offsetTable"]["OffT@NewG"] == {"0": 42}

    run_embedded(body, tmp_path, flush_consumer_offset_interval_s=0.1)


def test_queue_offsets_and_times(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        before = int(time.time() * 1000) - 1
        for i in range(3):
            assert (await client.invoke(addr, send_request("QT", f"{i}".encode()))).code == 0
        mx = await client.invoke(addr, req(30, topic="QT", queueId=0))
        mn = await client.invoke(addr, req(31, topic="QT", queueId=0))
        assert (mx.ext_fields["offset"], mn.ext_fields["offset"]) == ("3", "0")
        early = await client.invoke(addr, req(32, topic="QT", queueId=0))
        assert int(early.ext_fields["timestamp"]) >= before
        s = await client.invoke(addr, req(29, topic="QT", queueId=0, timestamp=str(before)))
        assert s.ext_fields["offset"] == "0"
        s = await client.invoke(addr, req(29, topic="QT", queueId=0,
                                          timestamp=str(int(time.time() * 1000) + 60000)))
        assert s.ext_fields["offset"] == "3"
        empty = await client.invoke(addr, req(30, topic="Nothing", queueId=5))
        assert empty.code == 0 and empty.ext_fields["offset"] == "0"

    run_embedded(body, tmp_path)


def test_view_and_query_message(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        resp = await client.invoke(addr, send_request(
            "LookT", b"findme", properties={"KEYS": "order-1 order-2", "UNIQ_KEY": "UQ1"}))
        _, _, offset = decode_offset_msg_id(resp.ext_fields["msgId"])
        view = await client.invoke(addr, req(33, offset=str(offset)))
        assert view.code == 0 and decode_records(view.body_bytes())[0].body == b"findme"
        missing = await client.invoke(addr, req(33, offset="999999999"))
        assert missing.code == 1
        now = int(time.time() * 1000)
        found = await client.invoke(addr, req(12, topic="LookT", key="order-2", maxNum=32,
                                              beginTimestamp="0", endTimestamp=str(now + 10000)))
        assert found.code == 0 and decode_records(found.body_bytes())[0].body == b"findme"
        by_uniq = await client.invoke(addr, req(12, topic="LookT", key="UQ1", maxNum=32,
                                                beginTimestamp="0", endTimestamp=str(now + 10000),
                                                _UNIQUE_KEY_QUERY="true"))
        assert by_uniq.code == 0
        none = await client.invoke(addr, req(12, topic="LookT", key="nope", maxNum=32,
                                             beginTimestamp="0", endTimestamp=str(now + 10000)))
        assert none.code == 22

    run_embedded(body, tmp_path)


def test_topic_admin_and_registration(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        ns = server.namesrv_addr
        create = req(17, topic="AdminT", defaultTopic="TBW102", readQueueNums=2,
                     writeQueueNums=2, perm=6, topicFilterType="SINGLE_TAG")
        assert (await client.invoke(addr, create)).code == 0
        route = await client.invoke(ns, req(105, topic="AdminT"))
        assert route.code == 0, route.remark
        data = json.loads(route.body_bytes())
        assert data["queueDatas"][0]["writeQueueNums"] == 2
        assert data["brokerDatas"][0]["brokerAddrs"]["0"] == addr
        for bad in (dict(topic="SCHEDULE_TOPIC_XXXX"), dict(topic="%LMQ%x"),
                    dict(topic="AdminT2", readQueueNums=0)):
            fields = dict(defaultTopic="TBW102", readQueueNums=2, writeQueueNums=2, perm=6,
                          topicFilterType="SINGLE_TAG")
            fields.update(bad)
            assert (await client.invoke(addr, req(17, **fields))).code == 1, bad
        all_cfg = json.loads((await client.invoke(addr, req(21))).body_bytes())
        admin_t = all_cfg["topicConfigTable"]["AdminT"]
        assert (admin_t["readQueueNums"], admin_t["writeQueueNums"], admin_t["perm"]) == (2, 2, 6)
        assert "AdminT2" not in all_cfg["topicConfigTable"]  # refused above: not created
        version = all_cfg["dataVersion"]
        # auto-created topics reach the name server without waiting 30 s
        assert (await client.invoke(addr, send_request("AutoT"))).code == 0
        # ... and a new topic is a new data version (what the name server compares)
        after = json.loads((await client.invoke(addr, req(21))).body_bytes())
        assert "AutoT" in after["topicConfigTable"]
        assert after["dataVersion"]["counter"] > version["counter"]
        with trio.fail_after(5):
            while (await client.invoke(ns, req(105, topic="AutoT"))).code != 0:
                await trio.sleep(0.05)
        assert (await client.invoke(addr, req(215, topic="AdminT"))).code == 0
        assert server.broker.topic_config_manager.get("AdminT") is None

    run_embedded(body, tmp_path)


def test_stats_and_runtime_info(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        for _ in range(2):
            await client.invoke(addr, send_request("StatT", queue_id=1))
        hb = heartbeat_request("c1", consumers=[cpp_consumer_data("CID_ST", "StatT")])
        await client.invoke(addr, hb)
        await client.invoke(addr, req(15, consumerGroup="CID_ST", topic="StatT", queueId=1,
                                      commitOffset="1"))
        stats = await client.invoke(addr, req(202, topic="StatT"))
        assert stats.code == 0
        table = decode_mq_map(stats.body_bytes().decode()[len('{"offsetTable":'):])
        by_q = {mq["queueId"]: v for mq, v in table}
        assert by_q[1]["maxOffset"] == 2 and by_q[0]["maxOffset"] == 0
        cs = await client.invoke(addr, req(208, consumerGroup="CID_ST", topic="StatT"))
        text = cs.body_bytes().decode()
        table = decode_mq_map(text[text.index('"offsetTable":') + len('"offsetTable":'):])
        by_q = {mq["queueId"]: v for mq, v in table}
        assert by_q[1] == {"brokerOffset": 2, "consumerOffset": 1,
                           "lastTimestamp": by_q[1]["lastTimestamp"]}
        conns = json.loads((await client.invoke(addr, req(203, consumerGroup="CID_ST"))).body_bytes())
        assert conns["connectionSet"][0]["clientId"] == "c1"
        assert (await client.invoke(addr, req(203, consumerGroup="NoOne"))).code == 206
        info = json.loads((await client.invoke(addr, req(28))).body_bytes())["table"]
        assert info["brokerAddr"] == addr and all(isinstance(v, str) for v in info.values())
        assert (await client.invoke(addr, req(26))).code == 0
        unsupported = await client.invoke(addr, req(9999))
        assert unsupported.code == 3

    run_embedded(body, tmp_path)
