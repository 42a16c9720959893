"""The sweep of abandoned routes (docs/stateless-gateways.md, "Failure behaviour"): the
clean-session routes of a gateway that left the gateways' group and stayed away for
`orphan_timeout_s` are removed by one surviving gateway (the smallest id); persistent
sessions' routes and live gateways' routes stay. Real broker (apache_strict), real
RouteLogs over TCP."""

from __future__ import annotations

import time

import trio

from core.client import ClientInstance
from gateway.routing.route_table import Route, clean_owner_gateway
from tests.gateway.routing.test_route_log import cfg, run, start, until_live


async def start_skewed(nursery, gateway, name: str, orphan_timeout_s: float,
                       skew: list[float]):
    """Gateway `name` started with `orphan_timeout_s` and no sweep of its own (the test
    calls sweep()), its clock moved forward by the test through `skew` (instead of
    sleeping out the timeout)."""
    rl = await start(nursery, gateway(name, cfg(orphan_timeout_s=orphan_timeout_s,
                                                sweep_interval_s=3600.0)))
    rl.clock = lambda: time.monotonic() + skew[0]
    return rl


def test_clean_routes_of_a_vanished_gateway_are_swept_by_one_survivor(tmp_path):
    timeout = 120.0

    async def fn(gateway):
        skew = [0.0]
        async with trio.open_nursery() as nursery:
            a = await start_skewed(nursery, gateway, "gw-a", timeout, skew)
            b = await start_skewed(nursery, gateway, "gw-b", timeout, skew)
            gone = Route("mqtt", "dev/1/#", "L1", owner="c:gw-c:dev1")
            kept = [Route("mqtt", "dev/2/#", "L2", owner="p:dev2"),
                    Route("mqtt", "dev/3/#", "L3", owner="c:gw-b:dev3")]
            for r in [gone, *kept]:  # gw-c's route written for it (the table is shared)
                await a.add_route(r)
            async with ClientInstance(namesrv_addr=gateway.namesrv_addr) as other:
                ghost = gateway("gw-c", on=other)
                await ghost.join()
                await until_live(a, {"gw-a", "gw-b", "gw-c"})
                skew[0] += 10 * timeout
                assert await a.sweep() == 0  # gw-c is a member: nothing to sweep
            # gw-c's connection closed: it left the group. First seen absent now.
            with trio.fail_after(10):
                while "gw-c" in a.members:
                    await trio.sleep(0.05)
                    await a.refresh_members()
            assert await a.sweep() == 0 and await b.sweep() == 0
            skew[0] += timeout / 2
            assert await a.sweep() == 0  # not away long enough yet
            skew[0] += timeout
            assert await b.sweep() == 0  # not the sweeper: gw-a has the smallest id
            assert await a.sweep() == 1
            with trio.fail_after(10):
                while gone in b.table or gone in a.table:
                    await trio.sleep(0.05)
            for r in kept:
                assert r in a.table and r in b.table
            assert a.table.clean_gateways() == ["gw-b"]
            nursery.cancel_scope.cancel()

    run(tmp_path, fn)


def test_clean_owner_gateway():
    assert clean_owner_gateway("c:mqtt-0a1b:dev:1") == "mqtt-0a1b"
    assert clean_owner_gateway("p:dev") is None
    assert clean_owner_gateway("c::x") is None
    assert clean_owner_gateway("") is None
