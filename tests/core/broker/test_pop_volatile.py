"""Volatile POP states (docs/pop.md "Volatile states"): pops that say `volatile` (a
non-durable AMQP queue) keep the whole acknowledgement state in memory and write nothing to
`<data_dir>/pop/journal`; a durable pop of the same state makes it durable for good (its
live state journaled at once); a broker restart starts a volatile state from the committed
offset (at least once)."""

from __future__ import annotations

import os

import trio

from core.broker.pop.journal import PopJournal, state_lines
from core.broker.pop.local import LocalPop
from core.client.pop_consumer import PopClient, PopStatus
from tests.core.broker.harness import ServerProcess, run_embedded, send_request
from tests.core.broker.test_pop_durability import run


def journal_bytes(server) -> bytes:
    try:
        with open(server.broker.pop_service.journal.path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""


def records(path) -> list[tuple]:
    return list(PopJournal(os.path.dirname(path)).replay())


async def send(client, addr: str, topic: str, count: int, prefix: str = "m") -> None:
    for i in range(count):
        r = await client.invoke(addr, send_request(topic, f"{prefix}{i}".encode(), queue_id=0))
        assert r.code == 0, r.remark


async def every_operation(pc: PopClient, topic: str, volatile: bool) -> None:
    """Pop, ack, batch ack, nack, change invisible, redelivery, a holder's release, and the
    in-process pop and ack: each of them writes journal records for a durable state."""
    r = await pc.pop(topic, queue_id=0, max_nums=4, invisible_ms=60_000, volatile=volatile)
    m = r.messages
    assert [x.body for x in m] == [b"m0", b"m1", b"m2", b"m3"]
    assert await pc.ack(m[0])
    await pc.batch_ack([m[1]])
    assert await pc.nack(m[2])
    assert await pc.change_invisible(m[3], 120_000)
    again = await pc.pop(topic, queue_id=0, max_nums=2, invisible_ms=60_000, volatile=volatile)
    assert [(x.body, x.delivery_count) for x in again.messages] == [(b"m2", 2), (b"m4", 1)]
    held = PopClient(pc.client, pc.broker_addr, pc.broker_name, pc.group, holder_id="gw-v")
    r = await held.pop(topic, queue_id=0, max_nums=1, invisible_ms=60_000, volatile=volatile)
    assert [x.body for x in r.messages] == [b"m5"]
    assert await pc.release_holder("gw-v") == 1


def test_volatile_pops_and_acks_write_nothing_durable_ones_do(tmp_path):
    async def body(server, client):
        b = server.broker
        addr, name = b.broker_addr, b.config.broker_name
        await send(client, addr, "PVol", 8)
        await send(client, addr, "PDur", 8)
        before = journal_bytes(server)
        await every_operation(PopClient(client, addr, name, "GID_V"), "PVol", True)
        local = LocalPop.of(b)  # the in-process path of `lmq serve`'s gateway
        batch, _ = await local.pop("GID_V", "PVol", 2, 60_000, 0, 0, 0, None, volatile=True)
        assert batch.placed == [(0, 5), (0, 6)]  # m5 released, then m6
        assert local.ack([("GID_V", "PVol", 0, batch.pop_time, [5, 6])]) == 2
        assert journal_bytes(server) == before
        # Everything else holds: the consumed offset moved past the acked prefix (m0, m1),
        # m2..m4 are in flight, and none of it is snapshotted.
        assert b.offset_manager.query("GID_V", "PVol", 0) == 2
        assert sorted(b.pop_service.state.get("GID_V", "PVol", 0).inflight) == [2, 3, 4]
        assert state_lines(b.pop_service.state.queues.items()) == []

        await every_operation(PopClient(client, addr, name, "GID_D"), "PDur", False)
        batch, _ = await local.pop("GID_D", "PDur", 2, 60_000, 0, 0, 0, None)
        assert local.ack([("GID_D", "PDur", 0, batch.pop_time, [5, 6])]) == 2
        written = journal_bytes(server)[len(before):].decode()
        kinds = [line[0] for line in written.splitlines()]
        assert {"C", "P", "A", "B", "H"} <= set(kinds), written
        assert "GID_V" not in written
        # Replayed, the durable group's journal gives its state back.
        inflight = {r[4] for r in records(b.pop_service.journal.path) if r[0] == "H"}
        gone = {r[4] for r in records(b.pop_service.journal.path) if r[0] == "A"}
        assert inflight - gone == {2, 3, 4}

    run_embedded(body, tmp_path)


def test_a_durable_pop_makes_a_volatile_state_durable(tmp_path):
    """Durable wins: the volatile state's cursor and in-flight messages are journaled
    when the first durable pop meets it, and every change after is journaled."""

    async def body(server, client):
        b = server.broker
        addr, name = b.broker_addr, b.config.broker_name
        await send(client, addr, "PMix", 6)
        pc = PopClient(client, addr, name, "GID_MIX")
        before = len(journal_bytes(server))
        r = await pc.pop("PMix", queue_id=0, max_nums=3, invisible_ms=60_000, volatile=True)
        assert await pc.ack(r.messages[0])
        assert len(journal_bytes(server)) == before
        d = await pc.pop("PMix", queue_id=0, max_nums=1, invisible_ms=60_000)
        assert [m.body for m in d.messages] == [b"m3"]
        assert await pc.ack(r.messages[1])  # a volatile pop's handle, acked once durable
        v = await pc.pop("PMix", queue_id=0, max_nums=1, invisible_ms=60_000, volatile=True)
        assert [m.body for m in v.messages] == [b"m4"]  # still journaled: durable wins
        recs = records(b.pop_service.journal.path)
        live: dict[int, tuple] = {}
        for rec in recs:
            if rec[1:4] == ("GID_MIX", "PMix", 0):
                if rec[0] == "H":
                    live[rec[4]] = rec
                elif rec[0] == "A":
                    live.pop(rec[4], None)
        assert sorted(live) == [2, 3, 4]
        assert live[2][5] == r.pop_time  # the volatile pop's handle and deadline
        assert ("C", "GID_MIX", "PMix", 0, 3) in recs

    run_embedded(body, tmp_path)


def test_apache_strict_broker_ignores_the_volatile_field(tmp_path):
    async def body(server, client):
        b = server.broker
        await send(client, b.broker_addr, "PStrict", 1)
        before = len(journal_bytes(server))
        pc = PopClient(client, b.broker_addr, b.config.broker_name, "GID_S")
        r = await pc.pop("PStrict", queue_id=0, invisible_ms=60_000, volatile=True)
        assert len(r.messages) == 1
        assert len(journal_bytes(server)) > before

    run_embedded(body, tmp_path, apache_strict=True)


def test_kill_9_volatile_state_restarts_from_the_committed_offset(tmp_path):
    """After kill -9 a volatile state is gone: its unacknowledged messages come back at
    once (not after their deadline), as first deliveries; acked ones may come back too
    (the periodic offset file: at least once); nothing is lost. A state made durable by a
    durable pop keeps the volatile phase's deliveries in flight across the restart."""

    async def before(client, server):
        pv = PopClient(client, server.broker_addr, server.broker_name, "GID_KV")
        await send(client, server.broker_addr, "PKill", 4)
        r = await pv.pop("PKill", queue_id=0, max_nums=4, invisible_ms=600_000, volatile=True)
        assert len(r.messages) == 4
        await pv.batch_ack(r.messages[:2])
        pm = PopClient(client, server.broker_addr, server.broker_name, "GID_KM")
        r = await pm.pop("PKill", queue_id=0, max_nums=2, invisible_ms=4_000, volatile=True)
        d = await pm.pop("PKill", queue_id=0, max_nums=1, invisible_ms=600_000)
        assert [m.body for m in r.messages + d.messages] == [b"m0", b"m1", b"m2"]
        assert await pm.ack(d.messages[0])

    async def after(client, again):
        pv = PopClient(client, again.broker_addr, again.broker_name, "GID_KV")
        got = []
        with trio.fail_after(20):
            while b"m3" not in got:
                r = await pv.pop("PKill", queue_id=0, max_nums=4, invisible_ms=600_000,
                                 poll_ms=1_000, volatile=True)
                got += [m.body for m in r.messages]
                assert all(m.delivery_count == 1 for m in r.messages)
        assert got[-2:] == [b"m2", b"m3"] and set(got) <= {b"m0", b"m1", b"m2", b"m3"}
        # The mixed group: m2 acked; m0, m1 (the volatile phase) were journaled in
        # flight, so they come back when their deadline passes, redelivered.
        pm = PopClient(client, again.broker_addr, again.broker_name, "GID_KM")
        got = {}
        with trio.fail_after(20):
            while len(got) < 3:
                r = await pm.pop("PKill", queue_id=0, max_nums=4, invisible_ms=600_000,
                                 poll_ms=1_000)
                got.update((m.body, m.delivery_count) for m in r.messages)
        assert got == {b"m0": 2, b"m1": 2, b"m3": 1}
        assert (await pm.pop("PKill", queue_id=0)).status == PopStatus.NO_NEW_MSG

    data = tmp_path / "data"
    with ServerProcess(data) as server:  # killed with -9 at the end of the block
        run(before, server)
        with open(data / "pop" / "journal", "rb") as f:
            assert b"GID_KV" not in f.read()
    with ServerProcess(data, namesrv_port=server.namesrv_port,
                       broker_port=server.broker_port) as again:
        run(after, again)


def test_purge_with_the_volatile_field_writes_nothing(tmp_path):
    from core.remoting.codec import RemotingCommand
    from core.remoting.codes import RequestCode

    async def body(server, client):
        b = server.broker
        await send(client, b.broker_addr, "PPurge", 3)

        async def purge(group: str, **extra: str) -> int:
            ext = {"consumerGroup": group, "topic": "PPurge", "queueId": "0", **extra}
            r = await client.invoke(b.broker_addr,
                                    RemotingCommand.request(RequestCode.POP_PURGE, ext))
            assert r.code == 0, r.remark
            return int(r.ext_fields["purged"])

        before = journal_bytes(server)
        assert await purge("GID_PV", volatile="true") == 3
        assert journal_bytes(server) == before
        assert await purge("GID_PD") == 3
        assert journal_bytes(server)[len(before):].startswith(b"C GID_PD PPurge 0 ")
        # The volatile purge holds in memory: nothing left to pop.
        pc = PopClient(client, b.broker_addr, b.config.broker_name, "GID_PV")
        r = await pc.pop("PPurge", queue_id=0, invisible_ms=60_000, volatile=True)
        assert r.status == PopStatus.NO_NEW_MSG
        # A purge without the field (AMQP Queue.Purge, Queue.Delete) keeps the state
        # volatile: only pops decide.
        await send(client, b.broker_addr, "PPurge", 2)
        size = len(journal_bytes(server))
        assert await purge("GID_PV") == 2
        assert await purge("GID_PV", all="true") == 0
        assert len(journal_bytes(server)) == size

    run_embedded(body, tmp_path)


def test_sync_master_answers_volatile_acks_without_waiting_for_a_slave(tmp_path, monkeypatch):
    """SYNC_MASTER acks wait for the slave to hold the journal flush of the request; a
    volatile state's acks and changes flush nothing, so they are answered at once (here: a
    master with no slave connected answers them SUCCESS, not SLAVE_NOT_AVAILABLE). A
    stale batch-ack entry (a retry) still waits, as before."""
    from core.client import pop_consumer
    from core.client.pop_consumer import UnconfirmedAcks
    from tests.core.ha.test_replication import TOPIC, cluster
    from tests.core.ha.test_replication import send as ha_send

    unconfirmed = UnconfirmedAcks()
    monkeypatch.setattr(pop_consumer, "UNCONFIRMED", unconfirmed)

    async def main():
        async with cluster(tmp_path, slave=False) as (client, master, _sl, _ns, _n):
            for i in range(6):
                await ha_send(client, master, b"m%d" % i)  # SLAVE_NOT_AVAILABLE: stored
            pv = PopClient(client, master.broker_addr, "bk", "GID_HAV")
            got = (await pv.pop(TOPIC, queue_id=0, max_nums=3, invisible_ms=600_000,
                                volatile=True)).messages
            assert len(got) == 3
            assert await pv.ack(got[0])
            await pv.batch_ack([got[1]])
            assert await pv.change_invisible(got[2], 1_000)
            assert unconfirmed.count == 0
            await pv.batch_ack([got[1]])  # stale: waits (no slave: SLAVE_NOT_AVAILABLE)
            assert unconfirmed.count == 1
            pd = PopClient(client, master.broker_addr, "bk", "GID_HAD")
            got = (await pd.pop(TOPIC, queue_id=0, max_nums=1, invisible_ms=600_000)).messages
            assert await pd.ack(got[0])  # durable: journaled, no slave to confirm it
            assert unconfirmed.count == 2

    trio.run(main)


def test_orderly_volatile_pops_write_nothing(tmp_path):
    """FIFO groups on a volatile state: the order rules hold (held-back messages kept in
    memory), and nothing is journaled."""
    from tests.core.broker.test_pop_orderly import TOPIC, bodies, fifo_group, send_groups

    async def body(server, client):
        addr = server.broker.broker_addr
        await fifo_group(client, addr, "GID_FIFO_V")
        await send_groups(client, addr, ["A1", "B1", "A2", "B2"])
        before = journal_bytes(server)
        pc = PopClient(client, addr, server.broker.config.broker_name, "GID_FIFO_V")
        first = await pc.pop(TOPIC, queue_id=0, invisible_ms=60_000, volatile=True)
        assert bodies(first) == ["A1", "B1"]  # A2, B2 held back
        assert await pc.ack(first.messages[1])
        r = await pc.pop(TOPIC, queue_id=0, invisible_ms=60_000, volatile=True)
        assert bodies(r) == ["B2"]
        assert await pc.nack(first.messages[0])
        r = await pc.pop(TOPIC, queue_id=0, invisible_ms=60_000, volatile=True)
        assert [(m.body, m.delivery_count) for m in r.messages] == [(b"A1", 2)]
        assert journal_bytes(server) == before

    run_embedded(body, tmp_path)
