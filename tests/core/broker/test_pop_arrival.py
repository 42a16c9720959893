"""Delivery at arrival (docs/pop.md, core/broker/pop/handoff.py): a pop parked in process
with a hand-off gets what arrives through it when the store call that dispatched the
message ends (never inside the put), its task left asleep; a put outside any deferral
window wakes the task as before; a window ends at the store call's first suspension, so a
hand-off never comes later than the woken task would have. A real embedded broker,
LocalSend for the stores and LocalPop for the pops."""

from __future__ import annotations

import trio
import trio.testing

from core.broker.local_send import LOCAL_REMOTE, LocalSend
from core.broker.pop.handoff import PARK, RETURN, WAKE, deferring
from core.broker.pop.local import LocalPop
from core.broker.processors.send import decode_send_header
from core.common.properties import MessageConst
from core.remoting.codec import SERVER_VERSION
from tests.core.broker.harness import run_embedded, send_request

LMQ = "%LMQ%arrival"
GROUP = "GID_ARRIVAL"
INVISIBLE_MS = 60_000


def header(body: bytes):
    cmd = send_request("ArrivalT", body, code=310,
                       properties={MessageConst.INNER_MULTI_DISPATCH: LMQ})
    return decode_send_header(cmd)


async def send(broker, body: bytes) -> None:
    await LocalSend.of(broker).send(header(body), body)


def bodies(batch) -> list[bytes]:
    """The bodies of a PopBatch's records (the stored v1 layout: body after its length)."""
    from core.common.codec import decode_records

    return [m.body for buf in batch.buffers for m in decode_records(bytes(buf))]


class Parker:
    """A held LocalPop with a hand-off that records what it got and answers `outcome`."""

    def __init__(self, broker, outcome: int = PARK, take: bool = True) -> None:
        self.local = LocalPop(broker)
        self.outcome = outcome
        self.take = take
        self.handed: list[bytes] = []
        self.calls = 0
        self.returned: list = []  # what the held pop answered (its task woke)
        self.log: list[str] = []

    def hand_off(self, parked, after) -> int:
        self.calls += 1
        self.log.append("hand-off")
        if self.take:
            self.handed += bodies(parked.pop(32))
        return self.outcome

    async def hold(self, hold_ms: int = 20_000) -> None:
        batch, _ = await self.local.pop(GROUP, LMQ, 32, INVISIBLE_MS, hold_ms, -1, 0, None,
                                        hand_off=self.hand_off)
        self.returned.append(bodies(batch))

    async def parked(self, service) -> None:
        with trio.fail_after(10):
            while service.polling != 1:
                await trio.testing.wait_all_tasks_blocked(0.01)


    async def park(self, nursery, service) -> Parker:
        nursery.start_soon(self.hold)
        await self.parked(service)
        return self

    async def woke(self, times: int = 1) -> None:
        """Until the held pop answered `times` times in all (its task woke)."""
        with trio.fail_after(10):
            while len(self.returned) < times:
                await trio.testing.wait_all_tasks_blocked(0.01)


def scenario(tmp_path, fn, **broker_kw) -> None:
    """`await fn(broker, service, nursery)` on an embedded broker whose LMQ and group
    cursor exist (m0 stored and taken); the nursery is cancelled after it."""
    async def body(server, _client):
        broker = server.broker
        await send(broker, b"m0")
        batch, _ = await LocalPop(broker).pop(GROUP, LMQ, 32, INVISIBLE_MS, 0, -1, 0, None)
        assert bodies(batch) == [b"m0"]
        async with trio.open_nursery() as nursery:
            await fn(broker, broker.pop_service, nursery)
            nursery.cancel_scope.cancel()

    run_embedded(body, tmp_path, **broker_kw)


def test_parked_pop_takes_arrivals_when_the_store_ends_and_its_task_sleeps(tmp_path):
    async def fn(broker, service, nursery):
        p = Parker(broker)
        # The put's dispatch, seen from inside: the hand-off must not run there.
        listeners = broker.arrivals.lmq_listeners
        real = listeners[listeners.index(service.on_dispatch_lmqs)]

        def dispatch(names, offsets):
            p.log.append("dispatch")
            real(names, offsets)
            p.log.append("dispatched")

        listeners[listeners.index(real)] = dispatch
        await p.park(nursery, service)
        await send(broker, b"m1")
        p.log.append("returned")
        assert p.log == ["dispatch", "dispatched", "hand-off", "returned"]
        assert p.handed == [b"m1"]
        await send(broker, b"m2")  # parked again after the first: taken the same way
        assert p.handed == [b"m1", b"m2"]
        await trio.testing.wait_all_tasks_blocked()
        assert p.returned == []  # its task never woke: no pop of its own since
        assert p.local.pops == 1 and service.polling == 1
        # Handed out by the POP rules: in flight under the deadline, journaled.
        qs = service.state.get(GROUP, LMQ, 0)
        assert sorted(qs.inflight) == [0, 1, 2]  # (m0 not acknowledged)
        assert all(e.deadline > 0 for e in qs.inflight.values())
        assert service.handoffs.parked == 2

    scenario(tmp_path, fn)


def test_put_outside_any_window_or_a_requeue_wakes_the_parked_task(tmp_path):
    async def fn(broker, service, nursery):
        p = await Parker(broker).park(nursery, service)
        # The send processor's store without a window (as a revive or delayed put).
        await LocalSend.of(broker)._processor.store(header(b"m1"), b"m1", LOCAL_REMOTE,
                                                    True, SERVER_VERSION)
        await p.woke()
        assert p.returned == [[b"m1"]] and p.calls == 0
        # A requeue (nack): visible again at once, the parked task woken.
        await p.park(nursery, service)
        entry = service.state.get(GROUP, LMQ, 0).inflight[1]
        assert service.change_invisible(GROUP, LMQ, 0, 1, entry.pop_time, 0) is not None
        await p.woke(2)
        assert p.returned[1] == [b"m1"] and p.calls == 0

    scenario(tmp_path, fn)


def test_window_ends_at_the_store_calls_first_suspension(tmp_path):
    """A store that waits (a SYNC_FLUSH put waiting for its flush) runs the hand-offs its
    put queued before it waits: other tasks would have run the woken consumer then."""
    async def fn(broker, service, nursery):
        p = await Parker(broker).park(nursery, service)
        processor = LocalSend.of(broker)._processor

        async def store_then_wait() -> str:
            await processor.store(header(b"m1"), b"m1", LOCAL_REMOTE, True, SERVER_VERSION)
            p.log.append("stored")
            await trio.lowlevel.checkpoint()
            p.log.append("resumed")
            return "done"

        assert await deferring(broker, store_then_wait()) == "done"
        assert p.log == ["stored", "hand-off", "resumed"]

    scenario(tmp_path, fn)


def test_sync_flush_store_hands_off_while_it_waits_for_the_flush(tmp_path):
    async def fn(broker, service, nursery):
        p = await Parker(broker).park(nursery, service)

        async def store() -> None:
            await send(broker, b"m1")
            p.log.append("returned")

        nursery.start_soon(store)
        with trio.fail_after(10):
            while not p.handed:
                await trio.sleep(0)  # one scheduler pass at a time
        p.log.append("handed")
        with trio.fail_after(10):
            while "returned" not in p.log:
                await trio.sleep(0.01)
        assert p.log == ["hand-off", "handed", "returned"]

    scenario(tmp_path, fn, flush="sync")


def test_hand_off_outcomes_and_a_failing_hand_off_wake_the_task(tmp_path):
    async def fn(broker, service, nursery):
        # RETURN before popping: the held pop ends with nothing, at once.
        p = await Parker(broker, RETURN, take=False).park(nursery, service)
        await send(broker, b"m1")
        await p.woke()
        assert p.returned == [[]] and p.calls == 1
        # WAKE: the woken task pops as a woken long poll does (m1 is still there).
        p = Parker(broker, WAKE, take=False)
        nursery.start_soon(p.hold)
        await p.woke()
        assert p.returned == [[b"m1"]]  # found at once: it never parked
        await p.park(nursery, service)
        await send(broker, b"m2")
        await p.woke(2)
        assert p.returned[1] == [b"m2"] and p.calls == 1
        # A hand-off that raises: logged, the task woken (RETURN), nothing lost.
        p = Parker(broker)

        def broken(parked, after):
            raise RuntimeError("bug")

        p.hand_off = broken
        await p.park(nursery, service)
        await send(broker, b"m3")
        await p.woke()
        assert p.returned == [[]]
        batch, _ = await p.local.pop(GROUP, LMQ, 32, INVISIBLE_MS, 0, -1, 0, None)
        assert bodies(batch) == [b"m3"]

    scenario(tmp_path, fn)
