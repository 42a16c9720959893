"""What one client may make the broker register: expression lengths in heartbeats, groups
and retry topics auto-created by clients, heartbeat size and entries, groups per
connection. Every case runs against a real broker over TCP."""

from __future__ import annotations

import json

from core.broker.filter import DEFAULT_MAX_EXPRESSION_LENGTH, DEFAULT_MAX_TAG_EXPRESSION_LENGTH
from core.remoting.codec import RemotingCommand
from core.remoting.codes import ResponseCode
from tests.core.broker.harness import heartbeat_request, pull_request, run_embedded


def consumer(group: str, sub: str = "*", topic: str = "T", etype: str | None = None) -> dict:
    entry = {"topic": topic, "subString": sub, "subVersion": 1}
    if etype:
        entry["expressionType"] = etype
    return {"groupName": group, "consumeType": 1, "messageModel": 1, "consumeFromWhere": 0,
            "subscriptionDataSet": [entry]}


def test_over_long_expressions_in_heartbeats_are_refused(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        cm = server.broker.consumer_manager
        fits = ("T||" * DEFAULT_MAX_TAG_EXPRESSION_LENGTH)[:DEFAULT_MAX_TAG_EXPRESSION_LENGTH]
        resp = await client.invoke(addr, heartbeat_request("c1", [consumer("CID_FITS", fits)]))
        assert resp.code == 0, resp.remark
        assert cm.find_subscription("CID_FITS", "T").sub_string == fits
        # One character more: SUBSCRIPTION_PARSE_FAILED, and nothing of the heartbeat
        # (not even its valid first entry) is registered.
        hb = heartbeat_request("c2", [consumer("CID_OK", "a"), consumer("CID_LONG", fits + "X")],
                               producers=["PID_X"])
        resp = await client.invoke(addr, hb)
        assert resp.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED, resp.remark
        assert "CID_LONG" in resp.remark
        assert cm.get("CID_OK") is None and cm.get("CID_LONG") is None
        assert server.broker.producer_manager.channels_of_group("PID_X") == []
        assert server.broker.subscription_group_manager.get("CID_LONG") is None
        sql = "a > 1 AND " * (DEFAULT_MAX_EXPRESSION_LENGTH // 10 + 1)
        resp = await client.invoke(addr, heartbeat_request(
            "c3", [consumer("CID_SQL", sql, etype="SQL92")]))
        assert resp.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED, resp.remark
        assert cm.get("CID_SQL") is None
        # CHECK_CLIENT_CONFIG with values of the wrong type: an answer, not a crash.
        check = RemotingCommand.request(46, {}, json.dumps({"subscriptionData": {
            "expressionType": {"x": 1}, "subString": 5}}).encode())
        assert (await client.invoke(addr, check)).code == 0

    run_embedded(body, tmp_path)


def test_auto_created_groups_are_capped(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        sgm = server.broker.subscription_group_manager
        cm = server.broker.consumer_manager
        hb = heartbeat_request("c1", [consumer(f"CID_{i}") for i in range(3)])
        assert (await client.invoke(addr, hb)).code == 0
        assert sorted(sgm.auto_created) == ["CID_0", "CID_1", "CID_2"]
        # Retry topics of auto-created groups count against max_auto_created_topics (2).
        tcm = server.broker.topic_config_manager
        retry = [g for g in ("CID_0", "CID_1", "CID_2") if tcm.get(f"%RETRY%{g}") is not None]
        assert len(retry) == 2
        # The group cap (4): one more is created, the rest refused with 26 and not
        # registered; groups that exist keep working in the same heartbeat.
        hb = heartbeat_request("c1", [consumer(f"CID_{i}") for i in range(7)])
        resp = await client.invoke(addr, hb)
        assert resp.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, resp.remark
        assert "and 2 more" in resp.remark
        assert len(sgm.auto_created) == 4
        assert [g for g in (f"CID_{i}" for i in range(7)) if cm.get(g)] == [
            "CID_0", "CID_1", "CID_2", "CID_3"]
        # A pull naming a new group is refused the same way, and creates nothing.
        resp = await client.invoke(addr, pull_request("CID_PULL", "T"))
        assert resp.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
        assert sgm.get("CID_PULL") is None
        # Deleting an auto-created group frees its place.
        delete = RemotingCommand.request(207, {"groupName": "CID_0"})
        assert (await client.invoke(addr, delete)).code == 0
        hb = heartbeat_request("c1", [consumer("CID_NEW")])
        assert (await client.invoke(addr, hb)).code == 0
        assert "CID_NEW" in sgm.auto_created

    run_embedded(body, tmp_path, max_auto_created_groups=4, max_auto_created_topics=2)


def test_unknown_group_without_auto_creation(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        resp = await client.invoke(addr, heartbeat_request("c1", [consumer("CID_UNKNOWN")]))
        assert resp.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, resp.remark
        assert server.broker.consumer_manager.get("CID_UNKNOWN") is None
        assert server.broker.topic_config_manager.get("%RETRY%CID_UNKNOWN") is None
        # Groups that exist (the built-in tools group) still register.
        resp = await client.invoke(addr, heartbeat_request("c1", [consumer("TOOLS_CONSUMER")]))
        assert resp.code == 0, resp.remark

    run_embedded(body, tmp_path, auto_create_subscription_group=False)


def test_heartbeat_size_and_entries_are_bounded(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        config = server.broker.config
        pm = server.broker.producer_manager
        cm = server.broker.consumer_manager
        # Too many entries: refused, nothing registered.
        many = [f"PID_{i}" for i in range(config.max_heartbeat_groups + 1)]
        resp = await client.invoke(addr, heartbeat_request("c1", producers=many))
        assert resp.code == ResponseCode.SYSTEM_ERROR and "max_heartbeat_groups" in resp.remark
        assert pm.channels_of_group("PID_0") == []
        # Too many subscriptions over all consumer entries.
        per_group = config.max_heartbeat_subscriptions // 2 + 1
        entries = [{"groupName": f"CID_S{g}", "subscriptionDataSet": [
            {"topic": f"T{i}", "subString": "*"} for i in range(per_group)]} for g in range(2)]
        resp = await client.invoke(addr, heartbeat_request("c1", entries))
        assert resp.code == ResponseCode.SYSTEM_ERROR
        assert "max_heartbeat_subscriptions" in resp.remark
        assert cm.get("CID_S0") is None
        # A body over max_heartbeat_body_bytes is refused before it is parsed.
        pad = "x" * config.max_heartbeat_body_bytes
        raw = json.dumps({"clientID": "c1", "producerDataSet": [{"groupName": "PID_BIG"}],
                          "pad": pad}).encode()
        resp = await client.invoke(addr, RemotingCommand.request(34, {}, raw))
        assert resp.code == ResponseCode.SYSTEM_ERROR and "limit" in resp.remark
        assert pm.channels_of_group("PID_BIG") == []
        # Groups per connection: heartbeats that each name new groups stop at the cap.
        batch = config.max_heartbeat_groups
        registered = 0
        for round_ in range(config.max_groups_per_connection // batch + 2):
            names = [f"PID_R{round_}_{i}" for i in range(batch)]
            resp = await client.invoke(addr, heartbeat_request("c1", producers=names))
            if resp.code != 0:
                assert "max_groups_per_connection" in resp.remark
                break
            registered += batch
        else:
            raise AssertionError("no heartbeat was refused")
        assert registered <= config.max_groups_per_connection
        assert sum(1 for g in pm.groups if g.startswith("PID_R")) == registered
        # Re-sending groups the connection already has is always fine.
        again = [f"PID_R0_{i}" for i in range(batch)]
        resp = await client.invoke(addr, heartbeat_request("c1", producers=again))
        assert resp.code == 0, resp.remark

    run_embedded(body, tmp_path, max_heartbeat_groups=16, max_heartbeat_subscriptions=40,
                 max_groups_per_connection=40, max_heartbeat_body_bytes=4096)


def test_auto_created_groups_survive_a_restart(tmp_path):
    from core.broker.subscription_group import SubscriptionGroupConfig, SubscriptionGroupManager

    def manager() -> SubscriptionGroupManager:
        m = SubscriptionGroupManager(str(tmp_path), max_auto_created=2)
        m.load()
        return m

    m = manager()
    assert m.find_or_create("CID_A") is not None and m.find_or_create("CID_B") is not None
    assert m.find_or_create("CID_C") is None
    m.persist()
    m = manager()
    assert m.find_or_create("CID_C") is None  # the count came back from the file
    m.update(SubscriptionGroupConfig("CID_A", retry_queue_nums=4))  # adopted by an admin
    assert m.find_or_create("CID_C") is not None
    assert m.auto_created == {"CID_B", "CID_C"}
    assert m.find_or_create("%LMQ%anything") is not None  # never stored, never counted
