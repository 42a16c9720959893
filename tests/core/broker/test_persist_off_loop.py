"""Topic and group metadata is written off the event loop (core/broker/persister.py).

The metadata writer is replaced by one that blocks in its thread until the test opens a
gate: while it is blocked the broker keeps answering (the write does not hold the loop),
changes made meanwhile are written by the next write, and an administrator's change is
answered only once it is on disk. With the write on the loop these tests fail: the loop
stops until the gate's timeout and every answer comes after the write.
"""

from __future__ import annotations

import json
import os
import threading

import pytest
import trio

import core.broker.metadata as metadata
import core.broker.persister as persister_module
from core.broker.persister import FilePersister
from core.remoting.client import RemotingClient
from core.remoting.codec import RemotingCommand
from tests.core.broker.harness import heartbeat_request, run_embedded, send_request

SUCCESS = 0
UPDATE_AND_CREATE_TOPIC = 17
GET_ALL_TOPIC_CONFIG = 21
UPDATE_AND_CREATE_SUBSCRIPTION_GROUP = 200
# Only reached when the write holds the loop (the bug): the test then fails, not hangs.
GATE_TIMEOUT_S = 10.0
METADATA_FILES = ("topics.json", "subscriptionGroup.json")


class GatedWriter:
    """Stands in for atomic_write_bytes: once armed, a metadata write waits for `release`."""

    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.finished = 0
        self.real = metadata.atomic_write_bytes

    def __call__(self, path: str, payload: bytes) -> None:
        if self.armed and os.path.basename(path) in METADATA_FILES:
            self.entered.set()
            self.gate.wait(GATE_TIMEOUT_S)
            self.finished += 1
        self.real(path, payload)

    async def wait_entered(self) -> None:
        await trio.to_thread.run_sync(self.entered.wait, GATE_TIMEOUT_S)
        assert self.entered.is_set()

    def release(self) -> None:
        self.gate.set()


@pytest.fixture
def writer(monkeypatch) -> GatedWriter:
    gated = GatedWriter()
    monkeypatch.setattr(persister_module, "atomic_write_bytes", gated)
    monkeypatch.setattr(metadata, "atomic_write_bytes", gated)  # any other writer path
    return gated


async def wait_until(predicate) -> None:
    """Let the broker's tasks run until `predicate()` holds (no wall-clock threshold)."""
    with trio.fail_after(GATE_TIMEOUT_S):
        while not predicate():
            await trio.sleep(0.01)


def _on_disk(server, name: str) -> dict:
    with open(os.path.join(server.broker.config_dir, name), "rb") as f:
        return json.loads(f.read())


def test_auto_created_topics_do_not_hold_the_loop_and_survive_a_restart(tmp_path, writer):
    async def body(server, client):
        addr = server.broker.broker_addr
        answered = []

        async def send(topic):
            async with RemotingClient(request_timeout=GATE_TIMEOUT_S * 2) as own:
                answered.append((topic, (await own.invoke(addr, send_request(topic))).code))

        writer.armed = True
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, "AutoOne")
            await writer.wait_entered()
            # The write of AutoOne is blocked in its thread; the broker still serves...
            resp = await client.invoke(addr, RemotingCommand.request(GET_ALL_TOPIC_CONFIG, {}))
            assert resp.code == SUCCESS
            assert "AutoOne" in json.loads(resp.body)["topicConfigTable"]
            # ...a topic created now is written by the next write...
            nursery.start_soon(send, "AutoTwo")
            await wait_until(lambda: server.broker.topic_config_manager.get("AutoTwo"))
            # ...and a send is acknowledged only once its new topic is on disk.
            assert answered == [] and writer.finished == 0
            writer.release()
        assert sorted(answered) == [("AutoOne", SUCCESS), ("AutoTwo", SUCCESS)]
        table = _on_disk(server, "topics.json")["topicConfigTable"]
        assert {"AutoOne", "AutoTwo"} <= set(table)
        writer.armed = False

    run_embedded(body, tmp_path)

    async def after_restart(server, client):
        tcm = server.broker.topic_config_manager
        assert {"AutoOne", "AutoTwo"} <= tcm.auto_created

    run_embedded(after_restart, tmp_path)


def test_heartbeat_group_creation_does_not_hold_the_loop(tmp_path, writer):
    async def body(server, client):
        addr = server.broker.broker_addr
        writer.armed = True
        hb = heartbeat_request("c1", producers=["PG_X"], consumers=[{
            "groupName": "CG_OFFLOOP", "consumeType": "CONSUME_PASSIVELY",
            "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
            "subscriptionDataSet": [{"topic": "TBW102", "subString": "*"}],
        }])
        assert (await client.invoke(addr, hb)).code == SUCCESS
        await writer.wait_entered()
        resp = await client.invoke(addr, RemotingCommand.request(GET_ALL_TOPIC_CONFIG, {}))
        assert resp.code == SUCCESS
        assert writer.finished == 0
        writer.release()
        await server.broker.subscription_group_manager.flush()
        on_disk = _on_disk(server, "subscriptionGroup.json")
        assert "CG_OFFLOOP" in on_disk["subscriptionGroupTable"]
        assert "CG_OFFLOOP" in on_disk["autoCreatedGroups"]
        writer.armed = False

    run_embedded(body, tmp_path)


def test_admin_change_answers_once_durable_without_holding_the_loop(tmp_path, writer):
    async def body(server, client):
        addr = server.broker.broker_addr
        answered = trio.Event()
        responses = []

        async def admin(cmd):
            responses.append(await client.invoke(addr, cmd))
            answered.set()

        assert (await client.invoke(addr, send_request("Bystander"))).code == SUCCESS
        writer.armed = True
        async with trio.open_nursery() as nursery:
            nursery.start_soon(admin, RemotingCommand.request(UPDATE_AND_CREATE_TOPIC, {
                "topic": "AdminTopic", "defaultTopic": "TBW102", "readQueueNums": 2,
                "writeQueueNums": 2, "perm": 6, "topicFilterType": "SINGLE_TAG"}))
            await writer.wait_entered()
            # The loop serves other connections while the admin's write runs (a send to
            # a topic that exists does not wait for it)...
            async with RemotingClient(request_timeout=GATE_TIMEOUT_S) as other:
                resp = await other.invoke(addr, send_request("Bystander"))
            assert resp.code == SUCCESS
            # ...but the admin is not answered before its change is on disk.
            assert not answered.is_set()
            writer.release()
        assert responses[0].code == SUCCESS, responses[0].remark
        assert writer.finished >= 1
        assert "AdminTopic" in _on_disk(server, "topics.json")["topicConfigTable"]

        # A group update too: answered after the write, which includes it.
        writer.entered.clear()
        body = json.dumps({"groupName": "CG_ADMIN", "retryMaxTimes": 3}).encode()
        resp = await client.invoke(
            addr, RemotingCommand.request(UPDATE_AND_CREATE_SUBSCRIPTION_GROUP, {}, body))
        assert resp.code == SUCCESS
        group = _on_disk(server, "subscriptionGroup.json")["subscriptionGroupTable"]["CG_ADMIN"]
        assert group["retryMaxTimes"] == 3
        writer.armed = False

    run_embedded(body, tmp_path)


def test_failed_write_is_retried_and_reported_to_a_waiter(tmp_path, monkeypatch):
    monkeypatch.setattr(persister_module, "RETRY_DELAY_S", 0)
    path = str(tmp_path / "meta.json")
    state = {"n": 0, "fail": 1}
    attempts = []

    def encode() -> bytes:
        return json.dumps(state).encode()

    def flaky(p, payload):
        attempts.append(payload)
        if len(attempts) <= state["fail"]:
            raise OSError(28, "No space left on device")
        metadata.atomic_write_bytes(p, payload)

    monkeypatch.setattr(persister_module, "atomic_write_bytes", flaky)
    persister = FilePersister(path, encode)

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(persister.run)
            state["n"] = 1
            persister.mark_dirty()
            with pytest.raises(OSError):
                await persister.flush()
            # The persister tries again on its own; the change reaches the disk.
            await persister.flush()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert len(attempts) >= 2
    with open(path) as f:
        assert json.load(f)["n"] == 1


def test_sync_callers_still_write_at_once(tmp_path):
    from core.broker.topic_config import TopicConfigManager

    tcm = TopicConfigManager(str(tmp_path), broker_name="b", cluster_name="c")
    tcm.load()
    tcm.create_topic_in_send_back_method("%RETRY%G", 1, 6)
    with open(tcm.path) as f:
        assert "%RETRY%G" in json.load(f)["topicConfigTable"]


def test_admin_change_that_cannot_be_written_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(persister_module, "RETRY_DELAY_S", 0.05)
    real = metadata.atomic_write_bytes
    disk = {"full": False}

    def writer(path, payload):
        if disk["full"] and os.path.basename(path) == "topics.json":
            raise OSError(28, "No space left on device")
        real(path, payload)

    monkeypatch.setattr(persister_module, "atomic_write_bytes", writer)

    async def body(server, client):
        addr = server.broker.broker_addr
        disk["full"] = True
        resp = await client.invoke(addr, RemotingCommand.request(UPDATE_AND_CREATE_TOPIC, {
            "topic": "NoSpace", "defaultTopic": "TBW102", "readQueueNums": 1,
            "writeQueueNums": 1, "perm": 6, "topicFilterType": "SINGLE_TAG"}))
        assert resp.code == 1 and "No space left" in resp.remark
        # The persister keeps trying; once the disk has room the change is written.
        disk["full"] = False
        await server.broker.topic_config_manager.flush()
        assert "NoSpace" in _on_disk(server, "topics.json")["topicConfigTable"]

    run_embedded(body, tmp_path)
