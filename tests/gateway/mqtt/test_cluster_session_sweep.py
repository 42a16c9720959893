"""Persistent sessions whose gateway vanished expire by their Session Expiry Interval
even when no client resumes them (docs/stateless-gateways.md, "Failure behaviour"): the
MQTT gateway with the smallest id ends them (routes removed, delete record written), and
publishes a will whose Will Delay Interval ran out, once.
Real broker (apache_strict), real RouteLogs and session records over TCP."""

from __future__ import annotations

import time
from functools import partial
from types import SimpleNamespace

import trio

from gateway.mqtt import cluster_sessions
from gateway.mqtt.cluster_sessions import ClusterSessions, will_record
from gateway.mqtt.packets import Properties, Will
from gateway.routing.route_table import Route
from tests.gateway.routing.test_route_log import run
from tests.gateway.routing.test_route_sweep import start_skewed


def _session(cid: str, exp: int | None, gone: int | None) -> SimpleNamespace:
    return SimpleNamespace(client_id=cid, cluster_stamp=-1, record=lambda: {
        "v": 5, "exp": exp, "subs": [[f"{cid}/#", 1, False, False, 0, None, f"L-{cid}"]],
        "gone": gone})


async def _sessions(nursery, on, name: str, swept_by=None) -> ClusterSessions:
    """The ClusterSessions of gateway `name`, running over the client and broker of the
    route log `on`; with `swept_by` (a route log), swept in that log's rounds."""
    link = SimpleNamespace(client=on.client, brokers={on.broker_name: on.addr},
                           addr=lambda _b: on.addr)
    cs = ClusterSessions(link, on.addr, on.broker_name, name)
    await nursery.start(cs.run)
    if swept_by is not None:
        swept_by.sweepers.append(partial(cs.sweep_sessions, swept_by))
    return cs


def test_sessions_of_a_vanished_gateway_expire_without_a_client(tmp_path):
    timeout = 60.0

    async def fn(gateway):
        skew = [0.0]
        async with trio.open_nursery() as nursery:
            a = await start_skewed(nursery, gateway, "mqtt-a", timeout, skew)
            b = await start_skewed(nursery, gateway, "mqtt-b", timeout, skew)
            sweeper = {"mqtt-x": None, "mqtt-a": a, "mqtt-b": b}
            sessions = {gw: await _sessions(nursery, a, gw, swept_by)
                        for gw, swept_by in sweeper.items()}
            long_ago = int(time.time() * 1000) - 3_600_000
            written = {  # client id -> (writer, expiry, gone)
                "dev-exp": ("mqtt-x", 2, long_ago),      # disconnected long ago: expires
                "dev-crash": ("mqtt-x", 2, None),        # lost with its gateway: expires
                "dev-never": ("mqtt-x", None, long_ago),  # 3.1.1 persistent: never
                "dev-long": ("mqtt-x", 10**7, long_ago),  # not yet
                "dev-live": ("mqtt-b", 2, long_ago),     # its gateway is live: it decides
            }
            for cid, (writer, exp, gone) in written.items():
                await sessions[writer].post_record(_session(cid, exp, gone)).wait()
                await a.add_route(Route("mqtt", f"{cid}/#", f"L-{cid}", owner=f"p:{cid}"))
            assert await sessions["mqtt-b"].sweep_sessions(b) == 0  # not the sweeper

            async def sweep_round() -> None:
                await a.sweep()

            await sweep_round()  # reads the records: the gateways they name are watched
            await sweep_round()  # mqtt-x found out of the group now
            skew[0] += timeout / 2
            await sweep_round()
            assert all(Route("mqtt", f"{c}/#", f"L-{c}", owner=f"p:{c}") in a.table
                       for c in written), "ended before orphan_timeout_s"
            skew[0] += timeout
            await sweep_round()  # found expired ...
            await sweep_round()  # ... and still the same record: ended
            ended = {"dev-exp", "dev-crash"}
            with trio.fail_after(10):
                while any(Route("mqtt", f"{c}/#", f"L-{c}", owner=f"p:{c}") in b.table
                          for c in ended):
                    await trio.sleep(0.05)
            for cid in set(written) - ended:
                assert Route("mqtt", f"{cid}/#", f"L-{cid}", owner=f"p:{cid}") in b.table
            await sessions["mqtt-a"].settled()
            for cid in ended:
                stored = await sessions["mqtt-a"].fetch(cid)
                assert stored is not None and stored.record is None
            assert (await sessions["mqtt-a"].fetch("dev-long")).record is not None
            nursery.cancel_scope.cancel()

    run(tmp_path, fn, allow_inner_properties_without_acl=True)


def test_delayed_will_of_a_vanished_gateway_is_published_once(tmp_path):
    timeout = 60.0

    async def fn(gateway):
        skew = [0.0]
        async with trio.open_nursery() as nursery:
            a = await start_skewed(nursery, gateway, "mqtt-a", timeout, skew)
            cs = await _sessions(nursery, a, "mqtt-a", swept_by=a)
            sent = []
            cs.on_will = lambda cid, will: sent.append((cid, will))
            now = int(time.time() * 1000)
            props = Properties(will_delay_interval=30, content_type="text/plain",
                               user_properties=(("k", "v"),))
            will = Will("wills/dev-w", b"\x00gone", 1, True, props)
            wills = {"dev-later": now + 3_600_000}  # due in an hour: not yet
            for cid, due in wills.items():
                rec = _session(cid, 10**6, now - 5000).record()
                cs.post_raw({"c": cid, "g": "mqtt-x", "r": rec, "w": will_record(will, due)})
                await a.add_route(Route("mqtt", f"{cid}/#", f"L-{cid}", owner=f"p:{cid}"))
            # What a gateway writes on a disconnect with a delayed will (trio clock due).
            x = await _sessions(nursery, a, "mqtt-x")
            sess = _session("dev-w", 10**6, now - 5000)
            sess.will, sess.will_due = will, trio.current_time() - 1.0
            sess.offsets_record, sess.inflight_record = dict, list
            sess.inbound_qos2 = {7}
            await x.post_record(sess, state=True).wait()
            await a.add_route(Route("mqtt", "dev-w/#", "L-dev-w", owner="p:dev-w"))
            written = await cs.fetch("dev-w")
            assert written.state == {"pos": {}, "inf": [], "q2": [7]}
            assert abs(written.will["due"] - (now - 1000)) < 60_000
            await cs.settled()
            await a.sweep()  # records read, mqtt-x watched
            await a.sweep()  # mqtt-x found gone
            skew[0] += timeout + 1
            await a.sweep()  # will found due ...
            assert sent == []
            await a.sweep()  # ... confirmed: published
            assert [(cid, w.topic, w.payload, w.qos, w.retain, w.properties.content_type,
                     w.properties.user_properties) for cid, w in sent] == [
                ("dev-w", "wills/dev-w", b"\x00gone", 1, True, "text/plain", (("k", "v"),))]
            await cs.settled()
            for _ in range(3):
                await a.sweep()
            assert len(sent) == 1  # once: the record was written again without it
            stored = await cs.fetch("dev-w")
            assert stored.will is None and stored.record is not None  # session kept
            assert (await cs.fetch("dev-later")).will is not None
            nursery.cancel_scope.cancel()

    run(tmp_path, fn, allow_inner_properties_without_acl=True)


def test_sessions_that_never_expire_do_not_starve_the_read_budget(tmp_path, monkeypatch):
    """Records read lately and not due are not read again each round: with a budget of
    two reads per round, a session listed after three never-expiring ones is still ended."""
    monkeypatch.setattr(cluster_sessions, "SWEEP_READS", 2)
    timeout = 60.0

    async def fn(gateway):
        skew = [0.0]
        async with trio.open_nursery() as nursery:
            a = await start_skewed(nursery, gateway, "mqtt-a", timeout, skew)
            await _sessions(nursery, a, "mqtt-a", swept_by=a)
            x = await _sessions(nursery, a, "mqtt-x")
            gone = int(time.time() * 1000) - 3_600_000
            cids = ["n0", "n1", "n2", "last"]
            for cid in cids:
                await x.post_record(_session(cid, None if cid != "last" else 2, gone)).wait()
                await a.add_route(Route("mqtt", f"{cid}/#", f"L-{cid}", owner=f"p:{cid}"))
            await a.sweep()
            await a.sweep()  # mqtt-x seen gone
            skew[0] += timeout + 1
            last = Route("mqtt", "last/#", "L-last", owner="p:last")
            for _ in range(8):
                await a.sweep()
                if last not in a.table:
                    break
                await trio.sleep(0.05)  # the remove posted in this round is applied
            assert last not in a.table
            assert all(Route("mqtt", f"{c}/#", f"L-{c}", owner=f"p:{c}") in a.table
                       for c in cids[:3])
            nursery.cancel_scope.cancel()

    run(tmp_path, fn, allow_inner_properties_without_acl=True)
