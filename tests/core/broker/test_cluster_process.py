"""Whole processes: kill -9 and restart on the same data dir; two brokers behind one name
server; clean shutdown on SIGTERM."""

from __future__ import annotations

import json
import signal
import time

import pytest

from core.common.codec import decode_records
from core.remoting.codec import RemotingCommand
from tests.core.broker.harness import (
    Driver,
    ServerProcess,
    create_topic,
    route_of,
    run_driver,
    sync_invoke,
    wait_until,
)

pytestmark = pytest.mark.slow

FAST_OFFSETS = "flush_consumer_offset_interval_s = 0.3\n"
# Brokers re-register every second; the name server forgets one silent for 3 s.
FAST_EXPIRY = (
    "register_interval_s = 1.0\n[namesrv]\nbroker_expiry_s = 3.0\nscan_interval_s = 0.5\n"
)


def req(code, **ext):
    return RemotingCommand.request(code, {k: str(v) for k, v in ext.items()})


def produce(namesrv, topic, count, prefix="m"):
    events = run_driver("producer.py", "--namesrv", namesrv, "--topic", topic,
                        "--count", str(count), "--prefix", prefix)
    errors = [e for e in events if e["event"] == "error"]
    assert not errors, errors
    return [e for e in events if e["event"] == "sent"]


def bodies_in(addr, topic, queues=4):
    out = []
    for q in range(queues):
        r = sync_invoke(addr, RemotingCommand.request(11, {
            "consumerGroup": "CID_CHECK", "topic": topic, "queueId": q, "queueOffset": "0",
            "maxMsgNums": 32, "sysFlag": 4, "commitOffset": "-1",
            "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0"}))
        if r.code == 0:
            out += [m.body.decode() for m in decode_records(r.body_bytes())]
    return out


def test_kill_9_and_restart_keeps_messages_offsets_topics(tmp_path):
    data = tmp_path / "data"
    server = ServerProcess(data, config_text=FAST_OFFSETS).start()
    try:
        create_topic(server.broker_addr, "Durable", 4)
        sent = produce(server.namesrv_addr, "Durable", 20)
        assert sync_invoke(server.broker_addr, req(
            15, consumerGroup="CID_D", topic="Durable", queueId=1, commitOffset=3)).code == 0
        offsets_file = data / "config" / "consumerOffset.json"
        wait_until(lambda: offsets_file.exists() and "Durable@CID_D" in offsets_file.read_text(),
                   10, what="offsets persisted")
    finally:
        server.kill()

    again = ServerProcess(data, namesrv_port=server.namesrv_port, broker_port=server.broker_port,
                          config_text=FAST_OFFSETS).start()
    try:
        topics = json.loads(sync_invoke(again.broker_addr, req(21)).body_bytes())
        assert topics["topicConfigTable"]["Durable"]["writeQueueNums"] == 4
        q = sync_invoke(again.broker_addr, req(14, consumerGroup="CID_D", topic="Durable",
                                               queueId=1))
        assert q.code == 0 and q.ext_fields["offset"] == "3"
        assert sorted(bodies_in(again.broker_addr, "Durable")) == sorted(e["body"] for e in sent)
        # and the C++ client sees them too, and can keep sending
        more = produce(again.namesrv_addr, "Durable", 4, prefix="after")
        assert len(more) == 4
        assert len(bodies_in(again.broker_addr, "Durable")) == 24
    finally:
        assert again.stop() == 0, again.log()


def test_sigterm_unregisters_and_persists(tmp_path):
    data = tmp_path / "data"
    ns = ServerProcess(data / "ns", broker_name="broker-a",
                       config_text="[namesrv]\nbroker_expiry_s = 120.0\n").start()
    b = ServerProcess(data / "b", namesrv_addr=ns.namesrv_addr, broker_name="broker-b").start()
    try:
        assert sync_invoke(b.broker_addr, req(
            15, consumerGroup="CID_T", topic="T", queueId=0, commitOffset=9)).code == 0
        assert b.stop() == 0, b.log()
        # UNREGISTER_BROKER: gone at once, not after the 120 s expiry
        assert route_of(ns.namesrv_addr, "broker-b") is None
        saved = json.loads((data / "b" / "config" / "consumerOffset.json").read_text())
        assert saved["offsetTable"]["T@CID_T"] == {"0": 9}
    finally:
        b.kill()
        ns.kill()


def _brokers_a_and_b(tmp_path) -> tuple[ServerProcess, ServerProcess]:
    """broker-a with its name server (routes expire fast) and broker-b registered there."""
    a = ServerProcess(tmp_path / "a", broker_name="broker-a", config_text=FAST_EXPIRY).start()
    b = ServerProcess(tmp_path / "b", namesrv_addr=a.namesrv_addr, broker_name="broker-b",
                      config_text="register_interval_s = 1.0\n").start()
    return a, b


def _only_on_broker_a(namesrv: str, topic: str) -> bool:
    r = route_of(namesrv, topic)
    return r is not None and {q["brokerName"] for q in r["queueDatas"]} == {"broker-a"}


def test_two_brokers_failover_and_route_expiry(tmp_path):
    a, b = _brokers_a_and_b(tmp_path)
    try:
        for broker in (a, b):
            create_topic(broker.broker_addr, "Spread", 4)
        route = route_of(a.namesrv_addr, "Spread")
        assert {q["brokerName"] for q in route["queueDatas"]} == {"broker-a", "broker-b"}
        # A producer with both brokers in its route loses broker-b mid-run: sends that pick
        # a broker-b queue fail over to broker-a (client-side fault avoidance, seed 002).
        producer = Driver("producer.py", "--namesrv", a.namesrv_addr, "--topic", "Spread",
                          "--count", "40", "--interval-ms", "40", "--prefix", "mid")
        producer.wait_for(lambda ev: len([e for e in ev if e["event"] == "sent"]) >= 12, 60,
                          "first sends")
        on_b = len(bodies_in(b.broker_addr, "Spread"))
        assert on_b > 0, "nothing went to broker-b before it died"
        b.kill()
        killed_ms = int(time.time() * 1000)
        producer.proc.wait(120)
        producer.close()
        assert not producer.of("error"), producer.of("error")
        assert len(producer.of("sent")) == 40
        after_kill = [e["body"] for e in producer.of("sent") if e["t_ms"] > killed_ms]
        on_a = set(bodies_in(a.broker_addr, "Spread"))
        assert after_kill and set(after_kill) <= on_a
        produce(a.namesrv_addr, "Spread", 12, prefix="after")  # a fresh producer: all on a
        wait_until(lambda: _only_on_broker_a(a.namesrv_addr, "Spread"), 20,
                   what="broker-b's route to expire")
    finally:
        b.kill()
        assert a.stop() == 0, a.log()


def test_silent_broker_expires_from_routes(tmp_path):
    """A broker that stops answering without closing its connection (SIGSTOP) is dropped
    by the name server after `broker_expiry_s`; producers then only see the live one."""
    a, b = _brokers_a_and_b(tmp_path)
    try:
        for broker in (a, b):
            create_topic(broker.broker_addr, "Frozen", 2)
        b.proc.send_signal(signal.SIGSTOP)
        wait_until(lambda: _only_on_broker_a(a.namesrv_addr, "Frozen"), 20,
                   what="broker-b to expire")
        produce(a.namesrv_addr, "Frozen", 6, prefix="live")
        assert len(bodies_in(a.broker_addr, "Frozen", queues=2)) == 6
    finally:
        b.proc.send_signal(signal.SIGCONT)
        b.kill()
        assert a.stop() == 0, a.log()
