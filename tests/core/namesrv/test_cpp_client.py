"""The real C++ client (rocketmq==0.4.4 wheel) against our name server.

The client runs in a subprocess so its native threads stay out of pytest.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio
from trio.testing import trio_test

from core.namesrv import DataVersion, NameServer, NamesrvConfig, TopicConfigData
from core.namesrv.bodies import encode_register_body
from core.remoting import (
    ProcessorTable,
    RemotingClient,
    RemotingCommand,
    RemotingServer,
    RequestCode,
    RequestContext,
)

pytest.importorskip("rocketmq.client")

PRODUCER_SCRIPT = """
import sys
from rocketmq.client import Message, Producer

namesrv, topic, timeout_ms = sys.argv[1], sys.argv[2], int(sys.argv[3])
producer = Producer("PID_LMQ_TEST", timeout=timeout_ms)
producer.set_namesrv_addr(namesrv)
producer.start()
msg = Message(topic)
msg.set_tags("TagA")
msg.set_keys("key-1")
msg.set_body("hello from C++")
try:
    result = producer.send_sync(msg)
    print("SENT", int(result.status), result.msg_id, result.offset, flush=True)
except Exception as exc:
    print("SEND_FAILED", type(exc).__name__, flush=True)
producer.shutdown()
"""


async def run_producer(tmp_path: Path, namesrv: str, topic: str) -> str:
    script = tmp_path / "producer.py"
    script.write_text(PRODUCER_SCRIPT)
    # The C++ client writes its logs under $HOME/logs: keep them in the test directory.
    env = dict(os.environ, HOME=str(tmp_path))
    with trio.fail_after(60):
        result = await trio.run_process(
            [sys.executable, str(script), namesrv, topic, "2000"],
            capture_stdout=True,
            capture_stderr=True,
            cwd=tmp_path,
            env=env,
            check=False,
        )
    out = result.stdout.decode()
    assert result.returncode == 0, (out, result.stderr.decode()[-2000:])
    return out


@trio_test
async def test_cpp_producer_asks_route_and_gets_topic_not_exist(tmp_path: Path) -> None:
    ns = NameServer(NamesrvConfig(host="127.0.0.1", port=0))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(ns.serve)
        out = await run_producer(tmp_path, f"127.0.0.1:{port}", "NoRouteTopic")
        ns.close()
    assert "SEND_FAILED" in out
    queries = list(ns.processors.stats.recent_route_queries)
    assert ("NoRouteTopic", False) in queries
    # No route: the C++ producer falls back to the auto-create template topic (docs/protocol.md §4.1).
    assert ("TBW102", False) in queries


@trio_test
async def test_cpp_producer_uses_our_route_to_reach_the_broker(tmp_path: Path) -> None:
    sends: list[RemotingCommand] = []
    broker_table = ProcessorTable()

    async def send_message(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        sends.append(cmd)
        return cmd.make_response(
            0,
            ext_fields={
                "msgId": "7F00000100002A9F0000000000000000",
                "queueId": cmd.ext_str("queueId"),
                "queueOffset": str(len(sends) - 1),
            },
        )

    broker_table.register(RequestCode.SEND_MESSAGE, send_message)
    ns = NameServer(NamesrvConfig(host="127.0.0.1", port=0))
    broker = RemotingServer(broker_table, "127.0.0.1", 0)
    async with trio.open_nursery() as nursery:
        ns_port = await nursery.start(ns.serve)
        broker_port = await nursery.start(broker.serve)
        broker_addr = f"127.0.0.1:{broker_port}"
        async with RemotingClient() as client:
            body = encode_register_body(
                [TopicConfigData("RoutedTopic", 4, 4, 6)], DataVersion(1700000000000, 1)
            )
            ext = {
                "brokerName": "broker-a",
                "brokerAddr": broker_addr,
                "clusterName": "DefaultCluster",
                "haServerAddr": "127.0.0.1:10912",
                "brokerId": "0",
            }
            resp = await client.invoke(
                f"127.0.0.1:{ns_port}",
                RemotingCommand.request(RequestCode.REGISTER_BROKER, ext, body),
            )
            assert resp.code == 0
            # Keep the registering connection open while the C++ client runs.
            out = await run_producer(tmp_path, f"127.0.0.1:{ns_port}", "RoutedTopic")
        ns.close()
        broker.close()
    assert out.startswith("SENT 0 "), out
    assert ("RoutedTopic", True) in ns.processors.stats.recent_route_queries
    assert len(sends) == 1
    sent = sends[0]
    assert sent.language == "CPP"
    assert sent.ext_str("topic") == "RoutedTopic"
    assert 0 <= sent.ext_int("queueId") < 4
    assert sent.body_bytes() == b"hello from C++"
