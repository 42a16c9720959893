"""`lmq admin` with ACL credentials against a name server and broker with ACL on."""

from __future__ import annotations

import threading

import pytest
import trio

from lmq.cli import main
from tests.core.acl.acl_cluster import ADMIN, USER, acl_cluster


@pytest.fixture(scope="module")
def acl_server():
    """An ACL cluster served from a background thread (lmq admin blocks)."""
    ready = threading.Event()
    box: dict = {}

    async def serve():
        async with acl_cluster() as srv:
            box.update(srv=srv, token=trio.lowlevel.current_trio_token(), stop=trio.Event())
            ready.set()
            await box["stop"].wait()

    thread = threading.Thread(target=trio.run, args=(serve,), daemon=True)
    thread.start()
    assert ready.wait(30), "cluster did not start"
    yield box["srv"]
    trio.from_thread.run_sync(box["stop"].set, trio_token=box["token"])
    thread.join(30)


def admin(capsys, *argv: str) -> tuple[int, str]:
    code = main(["admin", *argv])
    out, err = capsys.readouterr()
    return code, out + err


def test_topic_create_needs_admin_credentials(acl_server, capsys, monkeypatch):
    monkeypatch.delenv("LMQ_ACCESS_KEY", raising=False)
    monkeypatch.delenv("LMQ_SECRET_KEY", raising=False)
    ns = acl_server.namesrv_addr
    code, text = admin(capsys, "topic", "create", "CliTopic", "-n", ns, "-r", "1", "-w", "1")
    assert code != 0 and "AclException" in text
    code, text = admin(capsys, "topic", "create", "CliTopic", "-n", ns, "-r", "1", "-w", "1",
                       "--access-key", USER[0], "--secret-key", USER[1])
    assert code != 0 and "Need admin permission" in text
    assert acl_server.broker.topic_config_manager.get("CliTopic") is None
    code, text = admin(capsys, "topic", "create", "CliTopic", "-n", ns, "-r", "1", "-w", "1",
                       "--access-key", ADMIN[0], "--secret-key", ADMIN[1])
    assert code == 0, text
    assert acl_server.broker.topic_config_manager.get("CliTopic") is not None


def test_credentials_from_the_environment(acl_server, capsys, monkeypatch):
    monkeypatch.setenv("LMQ_ACCESS_KEY", ADMIN[0])
    monkeypatch.setenv("LMQ_SECRET_KEY", ADMIN[1])
    code, text = admin(capsys, "topic", "create", "EnvTopic", "-n", acl_server.namesrv_addr,
                       "-r", "1", "-w", "1")
    assert code == 0, text
    code, text = admin(capsys, "clusterList", "-n", acl_server.namesrv_addr, "--secret-key", "")
    assert code == 2 and "--access-key" in text
