"""The gateway's periodic passes over all connections and sessions (read deadlines, the
expiry tick, the state flush) hold the event loop for a bounded slice at a time (gateway/mqtt/sweep.py):
with 10,000 idle clients a whole pass in one step delayed every message behind it."""

from __future__ import annotations

import collections

import trio

import gateway.mqtt.server as server_mod
import gateway.mqtt.sweep as sweep_mod
from gateway.mqtt.packets import Disconnect
from gateway.mqtt.registry import SessionRegistry
from gateway.mqtt.sweep import sweep
from tests.gateway.mqtt.server_harness import GatewayServer, RawClient


class _VisitsPerStep(trio.abc.Instrument):
    """The largest number of visits one task made within one step of the loop."""

    def __init__(self) -> None:
        self.current = collections.Counter()
        self.total = collections.Counter()
        self.most = collections.Counter()

    def count(self, what: str) -> None:
        self.total[what] += 1
        self.current[what] += 1

    def before_task_step(self, task) -> None:
        self.current = collections.Counter()

    def after_task_step(self, task) -> None:
        for what, n in self.current.items():
            self.most[what] = max(self.most[what], n)
        self.current = collections.Counter()


def test_sweep_visits_a_snapshot_a_slice_per_step():
    inst = _VisitsPerStep()
    visited: list[int] = []
    expected: list[int] = []

    def visit(item: int) -> None:
        inst.count("sweep")
        visited.append(item)

    async def main():
        items = set(range(10))

        async def other():
            while True:
                items.add(len(items) + 100)  # the live set changes meanwhile
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)
            await trio.lowlevel.checkpoint()
            expected.extend(sorted(items))
            await sweep(items, visit, slice_size=4)
            nursery.cancel_scope.cancel()

    trio.run(main, instruments=[inst])
    assert len(expected) >= 10 and sorted(visited) == expected  # the snapshot, each once
    assert inst.most["sweep"] == 4  # never more than a slice in one step


def test_deadline_sweep_and_expiry_tick_visit_a_slice_per_step(monkeypatch):
    inst = _VisitsPerStep()
    end_read, tick_one = server_mod._end_read_if_due, SessionRegistry._tick_one
    persist_dirty = SessionRegistry._persist_dirty

    def counted_end_read(now, conn):
        inst.count("deadline")
        return end_read(now, conn)

    def counted_tick(self, now, sess):
        inst.count("tick")
        return tick_one(self, now, sess)

    def counted_flush(self, sess):
        inst.count("flush")
        return persist_dirty(self, sess)

    monkeypatch.setattr(server_mod, "_end_read_if_due", counted_end_read)
    monkeypatch.setattr(SessionRegistry, "_persist_dirty", counted_flush)
    monkeypatch.setattr(SessionRegistry, "_tick_one", counted_tick)
    monkeypatch.setattr(sweep_mod, "SWEEP_SLICE", 2)
    clients = []
    with GatewayServer() as srv:
        srv.call(trio.lowlevel.add_instrument, inst)
        for i in range(7):
            raw = RawClient(srv.port, 5)
            assert raw.connect(f"idle-{i}", keepalive=1).reason_code == 0
            clients.append(raw)
        # silent past 1.5 x keep alive: every one is cut, the last slices' ones too
        for raw in clients:
            p = raw.recv(10)
            assert isinstance(p, Disconnect) and p.reason_code == 0x8D
            raw.close()
        srv.call(trio.lowlevel.remove_instrument, inst)
    for what in ("deadline", "tick", "flush"):
        assert inst.total[what] >= 7 and inst.most[what] <= 2, what
