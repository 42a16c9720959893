"""Which topics a send or an administrator may create: name checks over a real socket,
autoCreateTopicEnable and the cap on topics created by sends."""

from __future__ import annotations

import os

from core.remoting.codec import RemotingCommand
from tests.core.broker.harness import pull_request, run_embedded, send_request

# Wire codes (docs/protocol.md §2): requests and responses are written out, not imported.
UPDATE_AND_CREATE_TOPIC = 17
DELETE_TOPIC_IN_BROKER = 215
SUCCESS = 0
SYSTEM_ERROR = 1
TOPIC_NOT_EXIST = 17


def create_topic(topic: str, queues: int = 4) -> RemotingCommand:
    return RemotingCommand.request(UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "defaultTopic": "TBW102", "readQueueNums": str(queues),
        "writeQueueNums": str(queues), "perm": "6", "topicFilterType": "SINGLE_TAG",
    })


def all_names_under(root: str) -> list[str]:
    found = []
    for _, dirs, files in os.walk(root):
        found += dirs + files
    return found


# --- names -----------------------------------------------------------------------------


def test_trailing_newline_names_are_refused(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        for topic in ("evil\n", "evil\r\n", "ok\nevil", "%LMQ%x\n"):
            resp = await client.invoke(addr, send_request(topic))
            assert resp.code == SYSTEM_ERROR and "illegal characters" in resp.remark, topic
            resp = await client.invoke(addr, create_topic(topic))
            assert resp.code != SUCCESS and "illegal characters" in resp.remark, topic
        assert (await client.invoke(addr, send_request("fine"))).code == SUCCESS
        resp = await client.invoke(addr, pull_request("CID\n", "fine"))
        assert resp.code != SUCCESS and "illegal characters" in resp.remark
        tcm = server.broker.topic_config_manager
        assert not [t for t in tcm.topics() if "\n" in t or "\r" in t]
        assert "fine" in tcm.topics()

    run_embedded(body, tmp_path)
    assert not [n for n in all_names_under(str(tmp_path / "data")) if "\n" in n or "\r" in n]


# --- auto-creation ---------------------------------------------------------------------


def test_embedded_default_auto_creates(tmp_path):
    async def body(server, client):
        resp = await client.invoke(server.broker.broker_addr, send_request("Fresh"))
        assert resp.code == SUCCESS, resp.remark
        assert "Fresh" in server.broker.topic_config_manager.topics()

    run_embedded(body, tmp_path)


def test_disabled_auto_create_refuses_every_template(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        config = server.broker.config
        # The cluster- and broker-name topics carry the INHERIT bit (RocketMQ lets them
        # serve as templates); switched off must still mean off.
        for template in ("TBW102", config.cluster_name, config.broker_name):
            resp = await client.invoke(addr, send_request("NoAuto", default_topic=template))
            assert resp.code == TOPIC_NOT_EXIST and "not exist" in resp.remark, template
        assert "NoAuto" not in server.broker.topic_config_manager.topics()
        # An administrator's topic works.
        assert (await client.invoke(addr, create_topic("Made"))).code == SUCCESS
        assert (await client.invoke(addr, send_request("Made"))).code == SUCCESS

    run_embedded(body, tmp_path, auto_create_topic_enable=False)


def test_cap_on_auto_created_topics(tmp_path):
    cap = 5

    async def body(server, client):
        addr = server.broker.broker_addr
        for i in range(cap):
            resp = await client.invoke(addr, send_request(f"Auto{i}"))
            assert resp.code == SUCCESS, resp.remark
        resp = await client.invoke(addr, send_request("OneTooMany"))
        assert resp.code == TOPIC_NOT_EXIST and "not exist" in resp.remark
        # %RETRY% names created by a send count too.
        resp = await client.invoke(addr, send_request("%RETRY%Nobody"))
        assert resp.code == TOPIC_NOT_EXIST
        # Existing topics keep working; administrators still create topics.
        assert (await client.invoke(addr, send_request("Auto0"))).code == SUCCESS
        assert (await client.invoke(addr, create_topic("Admin1"))).code == SUCCESS
        assert (await client.invoke(addr, send_request("Admin1"))).code == SUCCESS
        # Deleting an auto-created topic frees its place.
        delete = RemotingCommand.request(DELETE_TOPIC_IN_BROKER, {"topic": "Auto1"})
        assert (await client.invoke(addr, delete)).code == SUCCESS
        assert (await client.invoke(addr, send_request("Replacement"))).code == SUCCESS
        assert (await client.invoke(addr, send_request("OneTooMany"))).code == TOPIC_NOT_EXIST
        # Re-creating an auto-created topic by hand adopts it: it no longer counts.
        assert (await client.invoke(addr, create_topic("Auto2", 8))).code == SUCCESS
        assert (await client.invoke(addr, send_request("NowFits"))).code == SUCCESS
        topics = server.broker.topic_config_manager.topics()
        assert "OneTooMany" not in topics and "%RETRY%Nobody" not in topics

    run_embedded(body, tmp_path, max_auto_created_topics=cap)

    async def after_restart(server, client):
        # The count survives a restart (kept in topics.json).
        resp = await client.invoke(server.broker.broker_addr, send_request("StillTooMany"))
        assert resp.code == TOPIC_NOT_EXIST
        assert (await client.invoke(server.broker.broker_addr, send_request("Auto3"))).code == 0

    run_embedded(after_restart, tmp_path, max_auto_created_topics=cap)


def test_default_cap_is_enforced(tmp_path):
    # Not the number itself (a documented default), only that a default cap exists and
    # stops sends well before "every send makes a topic".
    async def body(server, client):
        addr = server.broker.broker_addr
        refused = 0
        for i in range(2000):
            resp = await client.invoke(addr, send_request(f"Flood{i}"))
            if resp.code == TOPIC_NOT_EXIST:
                refused += 1
                if refused == 20:
                    break
            else:
                assert resp.code == SUCCESS
        assert refused == 20
        assert len(server.broker.topic_config_manager.topics()) < 2000

    run_embedded(body, tmp_path)


def test_older_setting_name_still_works(tmp_path):
    async def body(server, client):
        resp = await client.invoke(server.broker.broker_addr, send_request("NoAutoOld"))
        assert resp.code == TOPIC_NOT_EXIST

    run_embedded(body, tmp_path, auto_create_topic=False)
