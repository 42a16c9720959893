"""RouteLog over a real broker: two gateways' tables kept in step through system topics."""

from __future__ import annotations

import statistics
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

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
        async with AsyncExitStack() as stack:
            # One client (one connection) per gateway, as in a deployment: the broker
            # keeps one member of a consumer group per connection.
            clients = [await stack.enter_async_context(
                ClientInstance(namesrv_addr=server.namesrv_addr)) for _ in range(3)]

            def gateway(name: str, config: RouteLogConfig | None = None,
                        on: ClientInstance | None = None) -> RouteLog:
                client = on or clients.pop(0)
                return RouteLog(client, b.broker_addr, b.config.broker_name, name,
                                config or cfg())
            gateway.namesrv_addr = server.namesrv_addr
            await fn(gateway)

    run_embedded(body, tmp_path, **broker_kw)


async def start(nursery, rl: RouteLog) -> RouteLog:
    await nursery.start(rl.run)
    return rl


async def until_live(rl: RouteLog, names: set[str]) -> None:
    while not names <= set(rl.live_gateways()):
        await trio.sleep(0.05)
        await rl.refresh_members()


@asynccontextmanager
async def stuck_member(gateway, seen_by: RouteLog, name: str) -> AsyncIterator[RouteLog]:
    """A gateway `name` on a connection of its own that joins the group and never applies
    anything, once `seen_by` counts it live. (A connection holds one member of the group:
    the broker keys it by channel.) Leaving the block closes its connection."""
    async with ClientInstance(namesrv_addr=gateway.namesrv_addr) as other:
        member = gateway(name, on=other)
        await member.ensure_topics()
        await member.join()
        await until_live(seen_by, {name})
        yield member


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


def test_dead_gateway_stops_blocking_at_once(tmp_path):
    """A gateway is live while it is a member of the route log's consumer group: one whose
    connection closed (killed) drops out at once, long before ack_timeout_s."""
    async def fn(gateway):
        async with trio.open_nursery() as nursery:
            a = await start(nursery, gateway("gw-a", cfg(ack_timeout_s=30.0)))
            async with stuck_member(gateway, a, "gw-ghost"):
                pass  # a member that will never apply anything, live until the block ends
            # Its connection is closed now: the broker dropped the member.
            t0 = trio.current_time()
            version, complete = await a.add_route(Route("mqtt", "x/#", "LX"))
            assert complete and trio.current_time() - t0 < 15
            assert "gw-ghost" not in a.live_gateways()
            nursery.cancel_scope.cancel()

    run(tmp_path, fn)


def test_ack_wait_is_bounded_when_a_live_gateway_lags(tmp_path):
    async def fn(gateway):
        async with trio.open_nursery() as nursery:
            a = await start(nursery, gateway("gw-a", cfg(ack_timeout_s=0.5)))
            # A member stuck at version 0: its connection is up, it never applies.
            async with stuck_member(gateway, a, "gw-stuck"):
                version, complete = await a.add_route(Route("mqtt", "y/#", "LY"))
                assert not complete and a.table.mqtt_lmqs("y/1") == {"LY"}
                assert a.lagging(version) == ["gw-stuck"]
            nursery.cancel_scope.cancel()

    run(tmp_path, fn)


def test_idle_gateways_store_nothing(tmp_path):
    """Two gateways with nothing changing write nothing: no periodic reports (liveness is
    the group membership, kept in the broker's memory)."""
    async def fn(gateway):
        config = cfg(heartbeat_interval_s=0.1, pull_suspend_ms=100)
        async with trio.open_nursery() as nursery:
            a = await start(nursery, gateway("gw-a", config))
            b = await start(nursery, gateway("gw-b", config))
            await a.add_route(Route("mqtt", "idle/#", "LI"))
            await until_live(a, {"gw-a", "gw-b"})
            api = a.client.api

            async def ends() -> list[int]:
                return [await api.get_max_offset(a.addr, t, 0)
                        for t in (config.log_topic, config.ack_topic, config.snap_topic)]

            before = await ends()
            await trio.sleep(1.0)  # 10 heartbeats and 10 pull rounds of each
            assert await ends() == before
            assert set(b.live_gateways()) >= {"gw-a", "gw-b"}
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
