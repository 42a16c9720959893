"""RouteLog over a real broker: two gateways' tables kept in step through system topics."""

from __future__ import annotations

import statistics
import time

import trio

from core.client import ClientInstance
from gateway.routing.route_log import AckTracker, RouteLog, RouteLogConfig
from gateway.routing.route_table import LogEntry, Route
from tests.core.broker.harness import run_embedded


def cfg(**kw) -> RouteLogConfig:
    kw.setdefault("pull_suspend_ms", 500)
    kw.setdefault("heartbeat_interval_s", 0.2)
    kw.setdefault("gateway_timeout_s", 2.0)
    kw.setdefault("ack_timeout_s", 10.0)
    return RouteLogConfig(**kw)


def run(tmp_path, fn, **broker_kw):
    # Against a broker in Apache-only strict mode: the route log needs nothing Apache lacks.
    broker_kw.setdefault("apache_strict", True)
    async def body(server, _remoting):
        b = server.broker
        async with ClientInstance(namesrv_addr=server.namesrv_addr) as client:
            def gateway(name: str, config: RouteLogConfig | None = None) -> RouteLog:
                return RouteLog(client, b.broker_addr, b.config.broker_name, name, config or cfg())
            await fn(gateway)

    run_embedded(body, tmp_path, **broker_kw)


async def start(nursery, rl: RouteLog) -> RouteLog:
    await nursery.start(rl.run)
    return rl


async def until_live(rl: RouteLog, names: set[str]) -> None:
    while not names <= set(rl.acks.live(rl.clock())):
        await trio.sleep(0.05)


def test_route_added_on_a_is_applied_by_b_before_add_returns(tmp_path, capsys):
    async def fn(gateway):
        async with trio.open_nursery() as nursery:
            a = await start(nursery, gateway("gw-a"))
            b = await start(nursery, gateway("gw-b"))
            await until_live(a, {"gw-a", "gw-b"})
            waits = []
            for i in range(20):
                route = Route("mqtt", f"room/{i}/+", f"L{i}")
                t0 = time.perf_counter()
                version, complete = await a.add_route(route)
                waits.append(time.perf_counter() - t0)
                assert complete
                # B has it the moment A's add returns: no waiting here.
                assert b.table.version >= version and b.table.mqtt_lmqs(f"room/{i}/x") == {f"L{i}"}
            # B slow to apply (a loaded gateway): A's add still returns only after B has it.
            fast_apply = b._apply_log

            async def slow_apply(suspend_ms):
                await trio.sleep(0.3)
                return await fast_apply(suspend_ms)

            b._apply_log = slow_apply
            version, complete = await a.add_route(Route("mqtt", "slow/#", "LS"))
            assert complete and b.table.mqtt_lmqs("slow/1") == {"LS"}
            b._apply_log = fast_apply
            version, complete = await b.remove_route(Route("mqtt", "room/3/+", "L3"))
            assert complete and a.table.mqtt_lmqs("room/3/x") == set()
            assert b.table.mqtt_lmqs("room/4/x") == {"L4"}
            # What the acknowledgement wait adds on top of appending the entry.
            appends, acks = [], []
            for i in range(20):
                entry = LogEntry("add", Route("mqtt", f"m/{i}", f"M{i}"))
                t0 = time.perf_counter()
                version = await a._send(a.config.log_topic, entry.encode()) + 1
                t1 = time.perf_counter()
                assert await a.wait_applied(version)
                appends.append(t1 - t0)
                acks.append(time.perf_counter() - t1)
            nursery.cancel_scope.cancel()
        ms = lambda xs: statistics.median(xs) * 1000  # noqa: E731
        with capsys.disabled():
            print(f"\n[bench] add_route, 2 live gateways, 1 broker, one process: median "
                  f"{ms(waits):.2f} ms (append {ms(appends):.2f} ms + ack wait {ms(acks):.2f} ms)")

    run(tmp_path, fn)


def test_restart_rebuilds_from_snapshot_and_log(tmp_path):
    async def fn(gateway):
        async with trio.open_nursery() as nursery:
            a = await start(nursery, gateway("gw-a"))
            for i in range(7):
                await a.add_route(Route("topic", f"s.{i}.#", f"Q{i}", "amq.topic"))
            snap = await a.write_snapshot()
            await a.remove_route(Route("topic", "s.0.#", "Q0", "amq.topic"))
            await a.add_route(Route("fanout", "", "QF", "logs"))
            # A restarted gateway: a fresh table from snapshot + the log after it.
            c = await start(nursery, gateway("gw-c"))
            assert c.snapshot_version == snap > 0
            assert set(c.table.routes()) == set(a.table.routes())
            assert c.table.version == a.table.version
            assert c.table.amqp_lmqs("amq.topic", "s.1.x") == {"Q1"}
            assert c.table.amqp_lmqs("amq.topic", "s.0.x") == set()
            assert c.table.amqp_lmqs("logs", "k") == {"QF"}
            nursery.cancel_scope.cancel()

    run(tmp_path, fn)


def test_malformed_snapshot_falls_back_to_the_log(tmp_path):
    async def fn(gateway):
        async with trio.open_nursery() as nursery:
            a = await start(nursery, gateway("gw-a"))
            await a.add_route(Route("direct", "k", "QD", "ex"))
            await a.write_snapshot()
            await a.add_route(Route("direct", "k2", "QD2", "ex"))
            await a._send(a.config.snap_topic, b'{"v": "x"')  # a broken newest snapshot
            c = await start(nursery, gateway("gw-c"))
            assert c.snapshot_version == 0 and set(c.table.routes()) == set(a.table.routes())
            nursery.cancel_scope.cancel()

    run(tmp_path, fn)


def test_silent_gateway_stops_blocking_after_timeout(tmp_path):
    async def fn(gateway):
        async with trio.open_nursery() as nursery:
            a = await start(nursery, gateway("gw-a", cfg(gateway_timeout_s=1.0, ack_timeout_s=30.0)))
            # A gateway that reported once, then went silent (killed): it applied nothing.
            ghost = gateway("gw-ghost")
            await ghost.ensure_topics()
            await ghost.report()
            await until_live(a, {"gw-ghost"})
            t0 = trio.current_time()
            version, complete = await a.add_route(Route("mqtt", "x/#", "LX"))
            # Returned because the ghost dropped out (1 s), well before ack_timeout_s (30 s),
            # and as a complete acknowledgement: only live gateways count.
            assert complete and trio.current_time() - t0 < 20
            assert "gw-ghost" not in a.acks.live(a.clock())
            nursery.cancel_scope.cancel()

    run(tmp_path, fn)


def test_ack_wait_is_bounded_when_a_live_gateway_lags(tmp_path):
    async def fn(gateway):
        async with trio.open_nursery() as nursery:
            a = await start(nursery, gateway("gw-a", cfg(ack_timeout_s=0.5)))
            # A live gateway stuck at version 0: heartbeats keep it live, it never applies.
            stuck = gateway("gw-stuck")
            await stuck.ensure_topics()

            async def heartbeats():
                while True:
                    await stuck.report()
                    await trio.sleep(0.2)

            nursery.start_soon(heartbeats)
            await until_live(a, {"gw-stuck"})
            version, complete = await a.add_route(Route("mqtt", "y/#", "LY"))
            assert not complete and a.table.mqtt_lmqs("y/1") == {"LY"}
            nursery.cancel_scope.cancel()

    run(tmp_path, fn)


def test_ack_tracker_liveness():
    t = AckTracker(timeout_s=5.0)
    t.record("a", 3, now=0.0)
    t.record("b", 1, now=4.0)
    t.record("a", 2, now=4.5)  # an older report never lowers the version
    assert t.live(now=5.0) == {"a": 3, "b": 1}
    assert t.lagging(2, now=5.0) == ["b"]
    assert t.lagging(2, now=9.6) == []  # b silent past the timeout: dropped
