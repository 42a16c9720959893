"""SYNC_MASTER POP acks wait for the slave (docs/ha.md, "POP state"): real brokers in
one process, TCP on free ports; the outbox's bookkeeping of what the slave confirmed."""

from __future__ import annotations

import trio

from core.broker.ha import pop_sync
from core.broker.pop.journal import snapshot_line
from core.client.pop_consumer import PopClient
from core.remoting.codes import ResponseCode
from tests.core.ha.test_replication import TOPIC, cluster, send

GROUP = "GID_HA_POP_SYNC"


def _acked_on(broker) -> set[int]:
    """Offsets the broker's POP journal file records as acknowledged (queue 0)."""
    return {rec[4] for rec in broker.pop_service.journal.replay()
            if rec[0] == "A" and rec[1:4] == (GROUP, TOPIC, 0)}


def test_sync_master_answers_an_ack_once_the_slave_holds_it(tmp_path):
    async def main():
        async with cluster(tmp_path) as (client, master, slave, _ns, _n):
            for i in range(6):
                assert (await send(client, master, b"m%d" % i)).code == 0
            pc = PopClient(client, master.broker_addr, "bk", GROUP)
            got = (await pc.pop(TOPIC, queue_id=0, max_nums=6, invisible_ms=600_000)).messages
            assert len(got) == 6
            # The slave holds back POP appends until `gate` opens (a stalled slave).
            replica = slave.ha_pop_replica
            apply, gate, arrived = replica.apply, trio.Event(), trio.Event()

            async def held(kind, data):
                if kind == pop_sync.POP_APPEND:
                    arrived.set()
                    await gate.wait()
                await apply(kind, data)

            replica.apply = held
            answers: list[bool] = []

            async def ack(m):
                answers.append(await pc.ack(m))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(ack, got[0])
                await arrived.wait()  # the master flushed the ack and sent it on
                await trio.sleep(0.3)  # room for a (wrong) early answer
                assert answers == []
                assert got[0].queue_offset not in _acked_on(slave)
                gate.set()
            assert answers == [True]
            assert got[0].queue_offset in _acked_on(slave)
            replica.apply = apply
            for m in got[1:4]:
                assert await pc.ack(m)
                # Answered: the slave's journal already has it.
                assert m.queue_offset in _acked_on(slave)
            assert await pc.change_invisible(got[4], 1000)

    trio.run(main)


def test_sync_master_without_a_slave_answers_acks_slave_not_available(tmp_path):
    async def main():
        async with cluster(tmp_path, slave=False) as (client, master, _sl, _ns, _n):
            # ha_master exists (ha_secret set) but no slave is connected.
            r = await send(client, master, b"m")
            assert r.code == ResponseCode.SLAVE_NOT_AVAILABLE
            pc = PopClient(client, master.broker_addr, "bk", GROUP)
            got = (await pc.pop(TOPIC, queue_id=0, max_nums=1, invisible_ms=600_000)).messages
            assert len(got) == 1
            # SLAVE_NOT_AVAILABLE: the POP client reports the ack as made (counted in
            # UNCONFIRMED, tests/core/ha/test_pop_unconfirmed.py)...
            assert await pc.ack(got[0])
            # ...and the ack was made on the master.
            assert got[0].queue_offset in _acked_on(master)

    trio.run(main)


def test_async_master_acks_do_not_wait(tmp_path):
    async def main():
        async with cluster(tmp_path, role="ASYNC_MASTER", slave=False) as (
                client, master, _sl, _ns, _n):
            assert (await send(client, master, b"m")).code == 0
            pc = PopClient(client, master.broker_addr, "bk", GROUP)
            got = (await pc.pop(TOPIC, queue_id=0, max_nums=1, invisible_ms=600_000)).messages
            assert await pc.ack(got[0])

    trio.run(main)


class _Feed:
    frame_bytes = 4096
    pop = None
    seq = 0


def test_outbox_confirms_flushes_by_frames_applied(monkeypatch):
    feed = _Feed()
    box = pop_sync.PopOutbox(feed)  # snapshot: 2 frames, covers seq 0
    line = snapshot_line("A", GROUP, TOPIC, 0, 1)
    for _ in range(3):
        feed.seq += 1
        box.append(line)  # frames 3, 4, 5 complete flushes 1, 2, 3
    assert not box.confirm(2)  # the snapshot: nothing newer than seq 0
    assert box.confirm(4) and box.confirmed == 2
    assert not box.confirm(4)
    assert box.confirm(5) and box.confirmed == 3


def test_outbox_snapshot_replacing_unsent_frames_covers_their_flushes(monkeypatch):
    monkeypatch.setattr(pop_sync, "POP_RESNAPSHOT_BYTES", 100)
    feed = _Feed()
    box = pop_sync.PopOutbox(feed)
    sent = len(box.take())  # the first snapshot went out
    line = snapshot_line("A", GROUP, TOPIC, 0, 1)
    while True:
        feed.seq += 1
        box.append(line)
        if box.frames[0][0] == pop_sync.POP_SNAPSHOT:
            break  # the queued appends were replaced by a snapshot
    frames = box.take()
    # The slave applies exactly what was sent; the last frame completes the last flush.
    applied = sent + len(frames)
    assert box.confirm(applied) and box.confirmed == feed.seq
