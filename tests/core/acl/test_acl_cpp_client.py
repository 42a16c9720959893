"""The Apache C++ client's session credentials against our broker with ACL on.

The wheel runs in a child process (its native threads must not live in pytest); the
name server and broker run here, on free ports.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from trio.testing import trio_test

from tests.core.acl.acl_cluster import USER, acl_cluster

pytest.importorskip("rocketmq.client")
pytestmark = pytest.mark.slow

DRIVER = Path(__file__).with_name("cpp_acl_client.py")


async def run_client(*args: str) -> list[dict]:
    result = await trio.run_process(
        [sys.executable, str(DRIVER), *args], capture_stdout=True,
        stderr=subprocess.DEVNULL, check=False,
    )
    return [json.loads(line) for line in result.stdout.decode().splitlines()
            if line.startswith("{")]


@trio_test
async def test_cpp_producer_and_push_consumer_with_right_credentials():
    async with acl_cluster() as srv:
        with trio.fail_after(120):
            events = await run_client(
                "--namesrv", srv.namesrv_addr, "--topic", "AclTopic", "--ak", USER[0],
                "--sk", USER[1], "--count", "3", "--consume-group", "CG_CPP_ACL")
        assert [e for e in events if e["event"] == "error"] == []
        assert len([e for e in events if e["event"] == "sent"]) == 3
        bodies = sorted(e["body"] for e in events if e["event"] == "msg")
        assert bodies == ["acl-0", "acl-1", "acl-2"]
        assert events[-1]["event"] == "done"
        # The guard checked (and passed) the C++ client's signatures.
        assert srv.broker.table.guard.refused == 0


@trio_test
async def test_cpp_producer_with_wrong_secret_is_refused():
    async with acl_cluster() as srv:
        with trio.fail_after(120):
            events = await run_client(
                "--namesrv", srv.namesrv_addr, "--topic", "AclTopic", "--ak", USER[0],
                "--sk", "wrong-secret", "--count", "2")
        assert len([e for e in events if e["event"] == "error"]) == 2
        assert not [e for e in events if e["event"] == "sent"]
        assert srv.namesrv.table.guard.refused > 0
        queues = range(8)
        assert all(srv.broker.store.max_offset("AclTopic", q) == 0 for q in queues)
