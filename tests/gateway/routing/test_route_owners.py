"""Routes with owners (one MQTT route per session) and the ordered, self-applied changes of
one gateway's route log (issue 12: MQTT on the shared routing table)."""

from __future__ import annotations

import trio

from gateway.routing.route_table import LogEntry, Route, RouteTable
from tests.gateway.routing.test_route_log import cfg, run, start


def test_equal_routes_of_two_owners_are_counted_apart() -> None:
    t = RouteTable()
    r1 = Route("mqtt", "dev/+/cmd", "L1", owner="client-1")
    r2 = Route("mqtt", "dev/+/cmd", "L1", owner="client-2")
    assert t.add(r1) and t.add(r2) and len(t) == 2
    assert t.mqtt_lmqs_sorted("dev/7/cmd") == ("L1",)
    t.remove(r1)  # one session unsubscribes: the other's route still matches
    assert t.mqtt_lmqs_sorted("dev/7/cmd") == ("L1",)
    t.remove(r2)
    assert t.mqtt_lmqs_sorted("dev/7/cmd") == ()


def test_owner_survives_the_log_and_old_entries_decode() -> None:
    route = Route("mqtt", "a/#", "L", owner="c@gw")
    assert LogEntry.decode(LogEntry("add", route).encode(), 3).route == route
    old = LogEntry.decode(b'{"op":"add","r":{"k":"mqtt","p":"a/#","d":"L"}}', 4)
    assert old.route.owner == "" and old.route == Route("mqtt", "a/#", "L")


def test_a_lone_gateway_applies_its_own_change_at_once(tmp_path):
    """One gateway: add_route returns once the entry is appended (applied on the spot, its
    own version known without reading its report back), even while its log tail is
    stalled (a pull that takes 60 s)."""
    async def fn(gateway):
        config = cfg(heartbeat_interval_s=3600, pull_suspend_ms=50, ack_timeout_s=20)
        async with trio.open_nursery() as nursery:
            a = await start(nursery, gateway("gw-a", config))
            fast_apply = a._apply_log

            async def stalled(suspend_ms):
                await trio.sleep(60)
                return await fast_apply(suspend_ms)

            a._apply_log = stalled
            await trio.sleep(0.3)  # the log loop is in the stalled pull now
            with trio.fail_after(5):  # far below ack_timeout_s
                for i in range(10):
                    version, complete = await a.add_route(Route("mqtt", f"x/{i}", f"L{i}"))
                    assert complete and a.table.version == version
            assert a.table.mqtt_lmqs("x/3") == {"L3"}
            nursery.cancel_scope.cancel()

    run(tmp_path, fn)


def test_posted_changes_keep_their_order(tmp_path):
    """A session's remove posted before its next add (same route) must not overtake it:
    the route stays, on this gateway and on another one."""
    async def fn(gateway):
        async with trio.open_nursery() as nursery:
            a = await start(nursery, gateway("gw-a"))
            b = await start(nursery, gateway("gw-b"))
            route = Route("mqtt", "s/#", "LS", owner="c1")
            await a.add_route(route)
            for _ in range(5):
                a.post("remove", route)
                await a.add_route(route)
            a.post("remove", Route("mqtt", "other", "LO", owner="c1"))
            version, _ = await a.add_route(Route("mqtt", "last", "LL", owner="c1"))
            with trio.fail_after(10):
                while b.table.version < version:
                    await b.changed()
            for t in (a.table, b.table):
                assert t.mqtt_lmqs("s/1") == {"LS"} and route in t
            nursery.cancel_scope.cancel()

    run(tmp_path, fn)


def test_wait_only_for_the_gateways_a_route_matters_to(tmp_path):
    """An MQTT route waits for the MQTT gateways only: a stuck AMQP gateway (a member that
    never applies) holds an add for all gateways until ack_timeout_s, not one for
    `mqtt-` gateways."""
    from tests.gateway.routing.test_route_log import stuck_member

    async def fn(gateway):
        async with trio.open_nursery() as nursery:
            a = await start(nursery, gateway("mqtt-a", cfg(ack_timeout_s=1.0)))
            async with stuck_member(gateway, a, "amqp-stuck"):
                _, complete = await a.add_route(Route("mqtt", "m/1", "L1"), wait_for="mqtt-")
                assert complete
                _, complete = await a.add_route(Route("mqtt", "m/2", "L2"))
                assert not complete  # waited for amqp-stuck until ack_timeout_s
            nursery.cancel_scope.cancel()

    run(tmp_path, fn)
