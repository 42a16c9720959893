"""RouteTable (sans-IO): LMQ sets of MQTT topics and AMQP publishes, log entries."""

from __future__ import annotations

import time

import pytest

from gateway.routing.route_table import LogEntry, Route, RouteError, RouteTable


def mqtt(pattern, dest):
    return Route("mqtt", pattern, dest)


def test_mqtt_filters():
    t = RouteTable()
    t.add(mqtt("a/+/c", "L1"))
    t.add(mqtt("a/#", "L2"))
    t.add(mqtt("a/b/c", "L3"))
    t.add(mqtt("#", "L4"))
    assert t.mqtt_lmqs("a/b/c") == {"L1", "L2", "L3", "L4"}
    assert t.mqtt_lmqs("a") == {"L2", "L4"}
    assert t.mqtt_lmqs("$SYS/x") == set()
    assert t.remove(mqtt("a/#", "L2")) and not t.remove(mqtt("a/#", "L2"))
    assert t.mqtt_lmqs("a/b/c") == {"L1", "L3", "L4"}
    with pytest.raises(RouteError):
        mqtt("a/#/b", "L")


def test_amqp_direct_fanout_topic():
    t = RouteTable()
    t.add(Route("direct", "k1", "Qd", "ex.d"))
    t.add(Route("fanout", "", "Qf1", "ex.f"))
    t.add(Route("fanout", "", "Qf2", "ex.f"))
    t.add(Route("topic", "stock.*.nyse", "Q1", "amq.topic"))
    t.add(Route("topic", "stock.#", "Q2", "amq.topic"))
    t.add(Route("topic", "#", "Q3", "other"))
    assert t.amqp_lmqs("ex.d", "k1") == {"Qd"}
    assert t.amqp_lmqs("ex.d", "k2") == set()
    assert t.amqp_lmqs("ex.f", "anything") == {"Qf1", "Qf2"}
    assert t.amqp_lmqs("amq.topic", "stock.ibm.nyse") == {"Q1", "Q2"}
    assert t.amqp_lmqs("amq.topic", "stock") == {"Q2"}
    assert t.amqp_lmqs("amq.topic", "stock.a.b.nyse") == {"Q2"}
    assert t.amqp_lmqs("amq.topic", "bond.x.nyse") == set()
    # `#` of one exchange never leaks into another; `$` keys are ordinary in AMQP.
    assert t.amqp_lmqs("other", "$x.y") == {"Q3"}
    # Words with MQTT wildcard characters or `/` are literal in AMQP.
    t.add(Route("topic", "a/b.+.#x", "Q4", "e"))
    assert t.amqp_lmqs("e", "a/b.+.#x") == {"Q4"}
    assert t.amqp_lmqs("e", "a.b.+.#x") == set() and t.amqp_lmqs("e", "a/b.z.#x") == set()


def test_amqp_headers_all_any():
    t = RouteTable()
    t.add(Route.headers_route("h", {"format": "pdf", "type": "report", "x-match": "all"}, "Qall"))
    t.add(Route.headers_route("h", {"format": "pdf", "type": "log"}, "Qany", x_match="any"))
    t.add(Route.headers_route("h", {"urgent": None}, "Qhas"))
    assert t.amqp_lmqs("h", "", {"format": "pdf", "type": "report"}) == {"Qall", "Qany"}
    assert t.amqp_lmqs("h", "", {"format": "doc", "type": "log"}) == {"Qany"}
    assert t.amqp_lmqs("h", "", {"urgent": 0}) == {"Qhas"}
    assert t.amqp_lmqs("h", "", None) == set()


def test_exchange_to_exchange_with_cycle():
    t = RouteTable()
    t.add(Route("fanout", "", "B", "A", dest_exchange=True))
    t.add(Route("direct", "k", "C", "B", dest_exchange=True))
    t.add(Route("fanout", "", "A", "C", dest_exchange=True))  # cycle back to A
    t.add(Route("fanout", "", "QB", "B"))
    t.add(Route("direct", "k", "QC", "C"))
    assert t.amqp_lmqs("A", "k") == {"QB", "QC"}
    assert t.amqp_lmqs("A", "other") == {"QB"}


def test_log_entries_apply_in_order_and_replay_is_harmless():
    t = RouteTable()
    r = mqtt("s/+", "L")
    e1 = LogEntry.decode(LogEntry("add", r).encode(), 1)
    e2 = LogEntry.decode(LogEntry("remove", r).encode(), 2)
    assert t.apply(e1) and t.mqtt_lmqs("s/1") == {"L"}
    assert t.apply(e2) and t.mqtt_lmqs("s/1") == set()
    assert not t.apply(e1) and t.version == 2  # replayed over a newer state: ignored
    for bad in (b"{", b'{"op":"drop","r":{"k":"mqtt","p":"a","d":"L"}}', b'{"op":"add","r":{"k":"x"}}'):
        with pytest.raises(RouteError):
            LogEntry.decode(bad, 3)


def test_snapshot_roundtrip_and_limit():
    t = RouteTable(max_routes=3)
    t.add(mqtt("a", "L"))
    t.add(Route("topic", "x.*", "Q", "amq.topic"))
    t.add(Route.headers_route("h", {"a": 1}, "QH", x_match="any"))
    with pytest.raises(RouteError):
        t.add(mqtt("b", "L"))
    t.version = 7
    u = RouteTable()
    u.load(*t.snapshot())
    assert u.version == 7 and set(u.routes()) == set(t.routes())
    assert u.amqp_lmqs("h", "", {"a": 1}) == {"QH"} and u.amqp_lmqs("amq.topic", "x.y") == {"Q"}


def test_benchmark_100k_routes(capsys):
    """A benchmark figure, not a timed assertion."""
    t = RouteTable()
    n = 100_000
    for i in range(n):
        t.add(mqtt(f"devices/{i}/cmd/#", f"Ld{i}"))
    for i in range(0, n, 1000):
        t.add(mqtt(f"devices/+/cmd/{i}", f"Lw{i}"))
    assert len(t) == n + n // 1000
    topics = [f"devices/{i * 37 % n}/cmd/{i % 1000 * 1000}" for i in range(20_000)]
    start = time.perf_counter()
    for topic in topics:
        t.mqtt_lmqs(topic)
    per = (time.perf_counter() - start) / len(topics)
    assert t.mqtt_lmqs("devices/5/cmd/0") == {"Ld5", "Lw0"}
    with capsys.disabled():
        print(f"\n[bench] RouteTable {len(t)} MQTT routes: {per * 1e6:.1f} us per LMQ-set lookup")
