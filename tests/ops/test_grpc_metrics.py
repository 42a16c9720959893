"""The gRPC front end's metrics, scraped from a real `lmq proxy` in front of a real
`lmq serve` (and from `lmq serve`'s own gRPC port), driven with raw gRPC stubs; and the
proxy's /readyz, which needs a name server that answers."""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
import uuid

import grpc
import pytest

from gateway.grpc5.proto import messaging_pb2 as pb
from gateway.grpc5.proto import messaging_pb2_grpc as pbg
from tests.gateway.mqtt.e2e_support import BROKER_TEST_CONFIG, free_port, write_toml
from tests.ops.test_metrics import REPO, Proc, _dir, until

pytestmark = pytest.mark.timeout(180)
DASHBOARD = REPO / "docs" / "grafana" / "lmq-gateway.json"

META = (("x-mq-client-id", "metrics-test-client"),)


def _message(topic: str, body: bytes) -> pb.Message:
    m = pb.Message(body=body)
    m.topic.name = topic
    m.system_properties.message_id = uuid.uuid4().hex
    m.system_properties.message_type = pb.NORMAL
    return m


def _receive(stub, group: str, topic: str, poll_ms: int, **kw) -> list:
    req = pb.ReceiveMessageRequest(batch_size=8, **kw)
    req.group.name = group
    req.message_queue.topic.name = topic
    if "auto_renew" not in kw:
        req.invisible_duration.FromSeconds(30)
    req.long_polling_timeout.FromMilliseconds(poll_ms)
    return list(stub.ReceiveMessage(req, metadata=META, timeout=poll_ms / 1000 + 15))


def test_grpc_metrics_and_proxy_readiness(tmp_path):
    ns_port, grpc_port = free_port(), free_port()
    procs = []
    try:
        # The proxy first: its gRPC port is up, but no name server answers yet.
        proxy = Proc(["proxy", "--namesrv-addr", f"127.0.0.1:{ns_port}", "--grpc-port",
                      str(grpc_port), "--metrics-port", "0"], _dir(tmp_path / "proxy"))
        procs.append(proxy)
        status, reason = until(lambda: (r := proxy.get("/readyz"))[1].startswith(
            ("name server unreachable", "no name server answered")) and r,
            "the proxy's name-server reason")
        assert status == 503 and f"127.0.0.1:{ns_port}" in reason, reason
        assert proxy.scrape()["lmq_ready"] == 0

        cfg = tmp_path / "broker.toml"
        write_toml(cfg, {"broker": BROKER_TEST_CONFIG})
        serve_grpc = free_port()
        serve = Proc(["serve", "--no-mqtt", "--no-amqp", "--grpc-port", str(serve_grpc),
                      "--data-dir", str(tmp_path / "data"), "--config", str(cfg),
                      "--namesrv-port", str(ns_port), "--broker-port", str(free_port()),
                      "--metrics-port", "0"], _dir(tmp_path / "serve"))
        procs.append(serve)
        serve.wait_ready()
        proxy.wait_ready()  # the name server answers now
        subprocess.run([sys.executable, "-m", "lmq", "admin", "topic", "create", "GM", "-n",
                        f"127.0.0.1:{ns_port}", "-r", "2", "-w", "2"], cwd=REPO, check=True,
                       capture_output=True, timeout=60)

        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        stub = pbg.MessagingServiceStub(channel)
        until(lambda: stub.QueryRoute(pb.QueryRouteRequest(topic=pb.Resource(name="GM")),
                                       metadata=META, timeout=10).status.code == pb.OK,
               "the topic's route")

        # An open Telemetry stream: one stream, one known client.
        commands: queue.Queue = queue.Queue()
        hello = pb.TelemetryCommand()
        hello.settings.client_type = pb.PRODUCER
        hello.settings.publishing.topics.add(name="GM")
        commands.put(hello)
        telemetry = stub.Telemetry(iter(commands.get, None), metadata=META, timeout=60)
        assert next(telemetry).status.code == pb.OK
        m = proxy.scrape()
        assert m["lmq_grpc_telemetry_streams"] == 1 and m["lmq_grpc_clients"] == 1

        # The groups start at the end; then a long poll waits until a message comes.
        assert _receive(stub, "G_metrics", "GM", 0)[0].status.code == pb.MESSAGE_NOT_FOUND
        assert _receive(stub, "G_push", "GM", 0, auto_renew=True)[0].status.code == \
            pb.MESSAGE_NOT_FOUND
        got: list = []
        poller = threading.Thread(target=lambda: got.extend(
            _receive(stub, "G_metrics", "GM", 20_000)))
        poller.start()
        until(lambda: proxy.scrape()["lmq_grpc_receives_waiting"] == 1, "the long poll")
        bodies = [b"a" * 100, b"b" * 250]
        for body in bodies:
            resp = stub.SendMessage(pb.SendMessageRequest(messages=[_message("GM", body)]),
                                    metadata=META, timeout=10)
            assert resp.status.code == pb.OK
        bad = stub.SendMessage(pb.SendMessageRequest(messages=[_message("GM", b"x")] * 2),
                               metadata=META, timeout=10)
        assert bad.status.code == pb.BAD_REQUEST
        poller.join(30)
        delivered = [f.message.body for f in got if f.WhichOneof("content") == "message"]
        assert delivered, got
        more = [f.message.body for f in _receive(stub, "G_metrics", "GM", 0)
                if f.WhichOneof("content") == "message"]
        delivered += more

        # A push consumer's receive: its messages are kept invisible by auto-renew.
        pushed = [f.message.body for f in _receive(stub, "G_push", "GM", 5000,
                                                   auto_renew=True)
                  if f.WhichOneof("content") == "message"]
        assert pushed

        m = proxy.scrape()
        req = "lmq_grpc_requests_total{code=%s,method=%s}"
        assert m[req % ("OK", "SendMessage")] == 2
        assert m[req % ("BAD_REQUEST", "SendMessage")] == 1
        assert m[req % ("MESSAGE_NOT_FOUND", "ReceiveMessage")] >= 2
        assert m[req % ("OK", "ReceiveMessage")] >= 2
        assert m["lmq_grpc_messages_received_total"] == 2
        assert m["lmq_grpc_received_bytes_total"] == sum(map(len, bodies))
        assert sorted(delivered) == bodies  # G_metrics got both, exactly once
        assert m["lmq_grpc_messages_sent_total"] == len(delivered) + len(pushed)
        assert m["lmq_grpc_sent_bytes_total"] == sum(map(len, delivered + pushed))
        assert m["lmq_grpc_receives_waiting"] == 0
        assert m["lmq_grpc_auto_renew_messages"] == len(pushed)

        commands.put(None)  # the client ends its stream
        telemetry.cancel()
        until(lambda: proxy.scrape()["lmq_grpc_telemetry_streams"] == 0, "the stream's end")
        channel.close()

        # `lmq serve`'s gRPC front end exports the same families.
        with grpc.insecure_channel(f"127.0.0.1:{serve_grpc}") as ch:
            pbg.MessagingServiceStub(ch).Heartbeat(pb.HeartbeatRequest(), metadata=META,
                                                  timeout=10)
        s = serve.scrape()
        assert s[req % ("OK", "Heartbeat")] == 1 and s["lmq_grpc_clients"] == 0
        # Every gRPC series the Grafana dashboard queries exists, in both processes.
        names = set(re.findall(r"\b(lmq_grpc_[a-z_]+)\{", DASHBOARD.read_text()))
        assert len(names) >= 8, names
        for scrape in (m, s):
            missing = [n for n in names if not any(k == n or k.startswith(n + "{")
                                                   for k in scrape)]
            assert not missing, missing
    finally:
        for proc in reversed(procs):
            proc.stop()
