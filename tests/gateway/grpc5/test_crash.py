"""kill -9 of `lmq serve` while the official 5.x client produces and consumes over gRPC:
nothing sent and receipted is lost, nothing acknowledged comes back (docs/grpc.md)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from core.client import ClientInstance
from tests.core.broker.harness import SMALL_FILES_TOML, free_port
from tests.gateway.grpc5.harness import drive, wait_port
from tests.procs import stop_process

ROOT = Path(__file__).resolve().parents[3]


class Serve:
    def __init__(self, tmp_path: Path) -> None:
        self.ports = {k: free_port() for k in ("namesrv", "broker", "grpc")}
        self.data = tmp_path / "data"
        self.config = tmp_path / "lmq.toml"
        self.config.write_text(SMALL_FILES_TOML)
        self.log = open(tmp_path / "serve.log", "ab")  # noqa: SIM115
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lmq", "serve", "--data-dir", str(self.data), "--config",
             str(self.config), "--namesrv-port", str(self.ports["namesrv"]), "--broker-port",
             str(self.ports["broker"]), "--grpc-port", str(self.ports["grpc"]), "--no-mqtt",
             "--no-amqp"], cwd=ROOT, stdout=self.log, stderr=self.log)
        wait_port(self.ports["grpc"], proc=self.proc)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        stop_process(self.proc, 30)
        self.log.close()

    def create_topic(self, topic: str) -> None:
        async def create() -> None:
            ns = f"127.0.0.1:{self.ports['namesrv']}"
            async with ClientInstance(namesrv_addr=ns) as client:
                await client.api.create_topic(f"127.0.0.1:{self.ports['broker']}", topic, 4, 4)
                with trio.fail_after(30):
                    while await client.api.get_route(topic) is None:
                        await trio.sleep(0.1)

        trio.run(create)


@pytest.mark.slow
def test_broker_killed_with_9_loses_nothing_and_redelivers_no_ack(rmq5_python, tmp_path):
    serve = Serve(tmp_path)
    try:
        serve.start()
        serve.create_topic("K")
        drive(rmq5_python, endpoint=serve.endpoint, op="simple", topic="K", group="GK",
              want=0, await_s=1, then_empty=True)
        sent = drive(rmq5_python, endpoint=serve.endpoint, op="produce", topic="K",
                     bodies=[f"k{i}" for i in range(20)])
        serve.kill9()  # every send above was receipted
        serve.start()
        got = drive(rmq5_python, endpoint=serve.endpoint, op="simple", topic="K",
                    group="GK", want=20, await_s=2, deadline_s=60, invisible_s=30)
        assert sorted(m["id"] for m in got["messages"]) == sorted(sent["ids"])
        serve.kill9()  # every ack above was answered
        serve.start()
        again = drive(rmq5_python, endpoint=serve.endpoint, op="simple", topic="K",
                      group="GK", want=0, await_s=2, then_empty=True)
        assert again["events"] == ["extra:0"]
    finally:
        serve.stop()
