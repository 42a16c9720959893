"""The POP client against a SYNC_MASTER whose slave does not confirm (stopped, or stalled):
an ack, batch ack or release the master made is reported as made, counted and warned about
once, not raised (docs/client.md, "POP acks under SYNC_MASTER")."""

from __future__ import annotations

import logging

import pytest
import trio

from core.broker.ha import pop_sync
from core.client import pop_consumer
from core.client.pop_consumer import PopClient, UnconfirmedAcks
from core.remoting.codes import ResponseCode
from tests.core.ha.test_pop_sync_acks import GROUP, _acked_on
from tests.core.ha.test_replication import TOPIC, cluster, send, wait_for

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def unconfirmed(monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="core.client.pop_consumer")
    fresh = UnconfirmedAcks()  # no warning of an earlier test holds this one back
    monkeypatch.setattr(pop_consumer, "UNCONFIRMED", fresh)
    return fresh


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "not confirmed by a slave" in
            r.getMessage()]


async def _popped(client, master, n: int):
    for i in range(n):
        assert (await send(client, master, b"m%d" % i)).code == ResponseCode.SUCCESS
    pc = PopClient(client, master.broker_addr, "bk", GROUP)
    got = (await pc.pop(TOPIC, queue_id=0, max_nums=n, invisible_ms=600_000)).messages
    assert len(got) == n
    return pc, got


def test_acks_of_a_master_whose_slave_stopped_are_made(tmp_path, unconfirmed, caplog):
    async def main():
        async with cluster(tmp_path) as (client, master, slave, _ns, _n):
            await wait_for(lambda: master.ha_master.slaves)
            pc, got = await _popped(client, master, 5)
            slave.stop()
            await wait_for(lambda: not master.ha_master.slaves)
            assert await pc.ack(got[0])
            await pc.batch_ack(got[1:3])
            assert await pc.nack(got[3])  # visible again at once
            # A change with a deadline: the SLAVE_NOT_AVAILABLE answer carries the new
            # handle, so it is made and counted too.
            old_handle = got[4].handle
            assert await pc.change_invisible(got[4], 600_000)
            assert got[4].handle != old_handle
            acked = {m.queue_offset for m in got[:3]}
            assert acked <= _acked_on(master)
            # Not delivered again: only the released message comes back.
            again = (await pc.pop(TOPIC, queue_id=0, max_nums=8, invisible_ms=60_000,
                                  poll_ms=500)).messages
            assert [m.body for m in again] == [b"m3"]

    trio.run(main)
    assert unconfirmed.count == 4
    [line] = _warnings(caplog)
    assert "SLAVE_NOT_AVAILABLE" in line


def test_acks_of_a_master_whose_slave_stalls_are_made(tmp_path, unconfirmed, caplog):
    async def main():
        async with cluster(tmp_path, master_kw={"sync_slave_timeout_s": 0.3}) as (
                client, master, slave, _ns, _n):
            await wait_for(lambda: master.ha_master.slaves)
            pc, got = await _popped(client, master, 3)
            replica = slave.ha_pop_replica
            apply, gate = replica.apply, trio.Event()

            async def stalled(kind, data):
                if kind == pop_sync.POP_APPEND:
                    await gate.wait()
                await apply(kind, data)

            replica.apply = stalled
            assert await pc.ack(got[0])
            await pc.batch_ack(got[1:])
            gate.set()
            assert {m.queue_offset for m in got} <= _acked_on(master)

    trio.run(main)
    assert unconfirmed.count == 2
    [line] = _warnings(caplog)
    assert "FLUSH_SLAVE_TIMEOUT" in line
