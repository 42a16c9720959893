"""The HA controller's rules on their own (docs/ha.md, "Failover"), on trio's MockClock:
leases, elections only from the in-sync set and only after the old lease, versioned
in-sync set changes, epochs never reused after a restart, and the CommitLog cut a
deposed master makes."""

from __future__ import annotations

import trio
import trio.testing

from core.common.message import InnerMessage
from core.namesrv.config import NamesrvConfig
from core.namesrv.controller import Controller
from core.store import MessageStore, StoreConfig
from core.store.ha.truncate import truncate_commitlog


def _controller(tmp_path) -> Controller:
    cfg = NamesrvConfig(controller_enable=True, controller_dir=str(tmp_path / "ctl"),
                        controller_lease_s=3.0, controller_lease_margin_s=1.0)
    c = Controller(cfg)
    c.load()
    return c


def _beat(c, bid, epoch=0, offset=0, start=None):
    return c.heartbeat("bk", bid, f"127.0.0.1:{1000 + bid}", f"127.0.0.1:{2000 + bid}", epoch,
                       offset, start, {})


def _master_1_with_slave_2(tmp_path, in_sync: bool = True) -> tuple[Controller, int]:
    """A controller where broker 1 holds the lease and broker 2 reported (in the in-sync
    set when `in_sync`): the controller and the in-sync set's version before that."""
    c = _controller(tmp_path)
    _beat(c, 1)
    v = _beat(c, 1, epoch=1, start=0)["syncVersion"]
    _beat(c, 2)
    if in_sync:
        assert c.alter_sync_set("bk", 1, 1, v, {1, 2})[0]
    return c, v


def run(fn):
    clock = trio.testing.MockClock(autojump_threshold=0)
    trio.run(fn, clock=clock)


def test_lease_only_after_epoch_start_and_election_only_after_lease(tmp_path):
    async def main():
        c = _controller(tmp_path)
        st = _beat(c, 1)
        assert (st["masterId"], st["epoch"], st["leaseMs"]) == (1, 1, 0)  # no start yet
        st = _beat(c, 1, epoch=1, offset=0, start=0)
        assert st["leaseMs"] == 3000
        assert _beat(c, 2)["masterId"] == 1
        ok, st = c.alter_sync_set("bk", 1, 1, st["syncVersion"], {1, 2})
        assert ok and st["syncStateSet"] == [1, 2]
        _beat(c, 1, epoch=1, offset=100, start=0)  # lease renewed at t
        t = trio.current_time()
        # The master goes silent; the slave keeps reporting.
        while trio.current_time() < t + 3.0 + 1.0:
            _beat(c, 2, epoch=1, offset=100)
            c.check()
            assert c.groups["bk"].master == 1, "elected before lease + margin"
            await trio.sleep(0.25)
        await trio.sleep(0.25)
        _beat(c, 2, epoch=1, offset=100)
        c.check()
        g = c.groups["bk"]
        assert (g.master, g.epoch, g.sync) == (2, 2, {2})
        assert g.history == [[1, 0], [2, None]]
        # The old master comes back: it is told who writes now and gets no lease.
        st = _beat(c, 1, epoch=1, offset=150, start=0)
        assert (st["masterId"], st["leaseMs"]) == (2, 0)
    run(main)


def test_only_in_sync_slaves_are_elected(tmp_path):
    async def main():
        c = _controller(tmp_path)
        _beat(c, 1)
        _beat(c, 1, epoch=1, start=0)
        _beat(c, 3, offset=10**9)  # far ahead, but never in the in-sync set
        await trio.sleep(10)
        _beat(c, 3, offset=10**9)
        c.check()
        assert c.groups["bk"].master == 1  # nobody to elect: stays put (no unclean election)
        assert c.groups["bk"].epoch == 1
    run(main)


def test_sync_set_changes_need_the_current_version_and_lease(tmp_path):
    async def main():
        c, v = _master_1_with_slave_2(tmp_path, in_sync=False)
        assert not c.alter_sync_set("bk", 2, 1, v, {1, 2})[0]  # not the master
        assert not c.alter_sync_set("bk", 1, 1, v - 1, {1, 2})[0]  # stale version
        assert not c.alter_sync_set("bk", 1, 0, v, {1, 2})[0]  # old epoch
        assert not c.alter_sync_set("bk", 1, 1, v, {2})[0]  # without the master
        await trio.sleep(3.5)  # lease over
        assert not c.alter_sync_set("bk", 1, 1, v, {1, 2})[0]
        _beat(c, 1, epoch=1, start=0)
        ok, st = c.alter_sync_set("bk", 1, 1, v, {1, 2})
        assert ok and st["syncVersion"] == v + 1
    run(main)


def test_restarted_controller_keeps_epochs_and_waits_a_lease(tmp_path):
    async def main():
        c, _v = _master_1_with_slave_2(tmp_path)
        await c._persist()
        c2 = _controller(tmp_path)
        async with trio.open_nursery() as nursery:
            await nursery.start(c2.run)
            g = c2.groups["bk"]
            assert (g.epoch, g.master, g.sync) == (1, 1, {1, 2})
            _beat(c2, 2, epoch=1)
            await trio.sleep(3.9)  # within the lease the old master may still hold
            _beat(c2, 2, epoch=1)
            assert g.master == 1
            await trio.sleep(1.5)
            _beat(c2, 2, epoch=1)
            await trio.sleep(0.5)
            assert (g.master, g.epoch) == (2, 2)  # a new epoch, never 1 again
            nursery.cancel_scope.cancel()
    run(main)


def test_manual_switch_waits_for_the_lease_then_elects_the_target(tmp_path):
    async def main():
        c, _v = _master_1_with_slave_2(tmp_path)
        assert c.request_switch("bk", 3) is not None  # not in sync
        assert c.request_switch("bk", 2) is None
        assert _beat(c, 1, epoch=1, start=0)["leaseMs"] == 0  # no more renewals
        for _ in range(30):
            await trio.sleep(0.2)
            _beat(c, 1, epoch=1, start=0)
            _beat(c, 2, epoch=1)
            c.check()
        assert c.groups["bk"].master == 2
    run(main)


def test_truncate_commitlog_cuts_records_and_their_queue_units(tmp_path):
    cfg = StoreConfig(store_dir=str(tmp_path / "s"), commitlog_file_size=1 << 20,
                      consume_queue_units_per_file=1000, preallocate_files=False)
    store = MessageStore(cfg)
    store.start()
    cut = None
    for i in range(10):
        if i == 6:
            cut = store.max_physical_offset
        r = store.put(InnerMessage(topic="T", queue_id=0, body=b"m%d" % i))
        assert r.status.name == "OK"
    store.shutdown()
    assert truncate_commitlog(cfg.store_dir, cfg.commitlog_file_size, cut) > 0
    store = MessageStore(cfg)
    store.start()
    try:
        assert store.max_physical_offset == cut
        assert store.max_offset("T", 0) == 6
        r = store.put(InnerMessage(topic="T", queue_id=0, body=b"new"))
        assert r.physical_offset == cut and r.queue_offset == 6
    finally:
        store.shutdown()
