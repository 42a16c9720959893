"""`lmq amqp` and `lmq proxy` with `--metrics-port`: /healthz, /readyz (503 with the reason
until their listener is up), /metrics accepted by the reference parser, AMQP counters that
move with traffic, and a SIGTERM that ends them (real processes, real AMQP client)."""

from __future__ import annotations

import pika
import pytest

from tests.gateway.mqtt.e2e_support import BROKER_TEST_CONFIG, free_port, write_toml
from tests.ops.test_metrics import TIMEOUT, Proc, _dir, until

pytestmark = pytest.mark.timeout(180)


def test_amqp_and_proxy_metrics_port(tmp_path):
    ns_port, amqp_port = free_port(), free_port()
    procs = []
    try:
        # Started before the cluster: alive, not ready, and saying why.
        amqp = Proc(["amqp", "--namesrv-addr", f"127.0.0.1:{ns_port}", "--amqp-port",
                     str(amqp_port), "--metrics-port", "0"], _dir(tmp_path / "amqp"))
        procs.append(amqp)
        assert amqp.get("/healthz") == (200, "ok\n")
        assert amqp.get("/readyz") == (
            503, "AMQP gateway not started (waiting for a master broker)\n")
        assert amqp.scrape()["lmq_ready"] == 0

        cfg = tmp_path / "broker.toml"
        # a stand-alone gateway multi-dispatches into LMQs: a right the broker must grant
        write_toml(cfg, {"broker": {**BROKER_TEST_CONFIG,
                                    "allow_inner_properties_without_acl": True}})
        procs.append(Proc(["serve", "--no-grpc", "--no-mqtt", "--no-amqp", "--data-dir",
                           str(tmp_path / "data"), "--config", str(cfg), "--namesrv-port",
                           str(ns_port), "--broker-port", str(free_port()),
                           "--metrics-port", "0"], _dir(tmp_path / "serve")))
        procs[-1].wait_ready()
        amqp.wait_ready()
        proxy = Proc(["proxy", "--namesrv-addr", f"127.0.0.1:{ns_port}", "--grpc-port", "0",
                      "--metrics-port", "0"], _dir(tmp_path / "proxy"))
        procs.append(proxy)
        proxy.wait_ready()

        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
        try:
            ch = conn.channel()
            ch.queue_declare("metered", durable=True)
            for i in range(3):
                ch.basic_publish("", "metered", b"m%d" % i)
            ch.basic_publish("amq.direct", "nobody-bound", b"lost")
            m = until(lambda: (s := amqp.scrape())["lmq_amqp_stored_messages_total"] >= 3
                       and s, "the AMQP publishes in the metrics")
            assert m["lmq_amqp_connections"] == 1
            assert m["lmq_amqp_queues"] >= 1 and m["lmq_amqp_exchanges"] >= 1
            assert m["lmq_ready"] == 1 and m["process_resident_memory_bytes"] > 0
            assert until(lambda: amqp.scrape()["lmq_amqp_unroutable_messages_total"] >= 1,
                          "the unroutable publish")
            # One message held unacknowledged by a consumer: in-flight, consumers, bytes.
            ch.basic_qos(prefetch_count=1)
            got = []
            ch.basic_consume("metered", lambda c, meth, props, body: got.append(meth))
            while not got:
                conn.process_data_events(time_limit=0.2)
            m = until(lambda: (s := amqp.scrape())["lmq_amqp_unacked_messages"] == 1 and s,
                       "the unacknowledged delivery")
            assert m["lmq_amqp_consumers"] == 1 and m["lmq_amqp_channels"] == 1
            # at least the three bodies in, and the delivered body out
            assert m["lmq_amqp_received_bytes_total"] > 3 * len(b"m0")
            assert m["lmq_amqp_sent_bytes_total"] > len(b"m0")
        finally:
            conn.close()
        assert until(lambda: amqp.scrape()["lmq_amqp_connections"] == 0, "the close")

        p = proxy.scrape()
        assert p["lmq_ready"] == 1 and "lmq_event_loop_lag_seconds" in p
        assert proxy.get("/dashboard/")[0] == 404   # no broker data: no dashboard
        for proc in (proxy, amqp):
            proc.proc.terminate()
            assert proc.proc.wait(TIMEOUT) == 0
    finally:
        for proc in reversed(procs):
            proc.stop()


@pytest.mark.parametrize("command", [["amqp", "--amqp-port", "0"], ["proxy", "--grpc-port", "0"]])
def test_taken_metrics_port_is_one_line(command):
    import socket
    import subprocess
    import sys

    from tests.ops.test_metrics import REPO

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "lmq", *command, "--namesrv-addr",
                            f"127.0.0.1:{free_port()}", "--metrics-port", str(port)],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"port {port} (metrics) on 127.0.0.1 is already in use" in lines[0]


@pytest.mark.parametrize("command", ["amqp", "proxy"])
def test_unknown_log_level_refused(command):
    import subprocess
    import sys

    from tests.ops.test_metrics import REPO

    r = subprocess.run([sys.executable, "-m", "lmq", command, "--log-level", "verbose"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown level 'verbose'" in r.stderr, r.stderr


@pytest.mark.parametrize("command", [["amqp", "--amqp-port", "0"], ["proxy", "--grpc-port", "0"]])
def test_started_before_its_cluster_stops_at_once_on_sigterm(tmp_path, command):
    """No name server answers: the AMQP gateway says it waits and /readyz says 503 (the
    proxy resolves routes per request: it listens at once, but its /readyz says 503 until a
    name server answers); a SIGTERM ends either at once with exit code 0 (not after the
    AMQP gateway's start-up wait)."""
    proc = Proc([*command, "--namesrv-addr", f"127.0.0.1:{free_port()}", "--metrics-port",
                 "0"], _dir(tmp_path / command[0]))
    try:
        if command[0] == "amqp":
            assert proc.get("/readyz")[0] == 503
            assert "waiting for a master broker registered with 127.0.0.1:" in \
                proc.log.read_text()
        else:
            assert until(lambda: "name server" in (r := proc.get("/readyz"))[1] and r,
                          "the name-server reason")[0] == 503
        proc.proc.terminate()
        assert proc.proc.wait(10) == 0
        assert "Traceback" not in proc.log.read_text()
    finally:
        proc.stop()
