"""`lmq amqp` as a process in front of a real broker (started in this process)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pika
import pytest
import trio

from tests.core.broker.harness import run_embedded
from tests.gateway.amqp.broker_harness import params
from tests.ports import free_port as _free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def _wait_port(proc: subprocess.Popen, port: int, log_path: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"lmq amqp exited: {open(log_path).read()[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("lmq amqp did not open its port")


def test_lmq_amqp_serves_pika_and_stops_on_sigterm(tmp_path):
    def client(namesrv_addr: str):
        port = _free_port()
        log_path = str(tmp_path / "amqp.log")
        # The port and a broker setting come from --amqp-config (flags would win over it).
        config = tmp_path / "amqp.toml"
        config.write_text(f"[amqp]\nport = {port}\nmax_queues = 1\n")
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "lmq", "amqp", "--namesrv-addr", namesrv_addr,
                 "--amqp-config", str(config)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_port(proc, port, log_path)
            conn = pika.BlockingConnection(params(port))
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("cmd-q")
            ch.queue_bind("cmd-q", "amq.topic", "a.#")
            ch.basic_publish("amq.topic", "a.b.c", b"through lmq amqp")
            method, _, body = ch.basic_get("cmd-q", auto_ack=True)
            with pytest.raises(pika.exceptions.ChannelClosedByBroker):
                ch.queue_declare("cmd-q2")  # max_queues = 1, from the file
            conn.close()
            proc.send_signal(signal.SIGTERM)
            return body, proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)

    got = []

    async def body(server, _remoting):
        got.append(await trio.to_thread.run_sync(client, server.namesrv_addr))

    run_embedded(body, tmp_path, timeout=100.0, allow_inner_properties_without_acl=True)
    assert got == [(b"through lmq amqp", 0)]


def test_lmq_amqp_config_file_errors_are_named(tmp_path):
    config = tmp_path / "amqp.toml"
    config.write_text("[amqp]\nmax_queues = 'many'\nno_such_key = 1\n")
    run = subprocess.run([sys.executable, "-m", "lmq", "amqp", "--amqp-config", str(config)],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "no_such_key" in run.stderr
