"""AckWaiters: a report wakes only the waits it covers; None wakes all; a wait times out."""

from __future__ import annotations

import trio
from trio.testing import MockClock, wait_all_tasks_blocked

from core.broker.ha.ack_waiters import AckWaiters


def test_release_wakes_the_covered_waits_and_none_wakes_every_one():
    async def main():
        waiters, woken = AckWaiters(), []

        async def wait(pos):
            await waiters.wait(pos, 60)
            woken.append((pos, trio.current_time()))

        async with trio.open_nursery() as nursery:
            for pos in (30, 10, 20):
                nursery.start_soon(wait, pos)
            await wait_all_tasks_blocked()
            waiters.release(20)
            await wait_all_tasks_blocked()
            assert sorted(p for p, _t in woken) == [10, 20]
            waiters.release(None)
        assert sorted(p for p, _t in woken) == [10, 20, 30]
        assert all(t == 0 for _p, t in woken)  # none waited out its timeout

    trio.run(main, clock=MockClock(autojump_threshold=0))


def test_an_uncovered_wait_ends_at_its_timeout():
    async def main():
        waiters = AckWaiters()
        waiters.release(5)  # below the position: does not count
        await waiters.wait(7, 3.0)
        assert trio.current_time() == 3.0

    trio.run(main, clock=MockClock(autojump_threshold=0))
