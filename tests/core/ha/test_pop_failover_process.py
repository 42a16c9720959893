"""POP state across a failover between real processes (docs/ha.md, "POP state"): `lmq
namesrv --controller`, two `lmq broker` of one broker name (SYNC_MASTER). Messages are
popped and some acknowledged on the master; once the slave's journal holds them the
master is killed -9: the new master delivers neither the acknowledged messages nor the
ones still invisible, only those never popped."""

from __future__ import annotations

import pytest
import trio

from core.broker.pop.journal import PopJournal
from core.remoting.client import RemotingClient
from tests.core.broker.harness import wait_until
from tests.core.ha.process_cluster import TOPIC, pop_the_rest, send_and_pop, started

pytestmark = pytest.mark.slow

GROUP = "GID_POP_FAILOVER"
N, POPPED = 40, 30


def _journal_state(data_dir) -> tuple[int, set[int]]:
    """(cursor, in-flight offsets) of queue 0 in a broker's POP journal, as load() reads it."""
    cursor, inflight = 0, set()
    for rec in PopJournal(str(data_dir / "pop")).replay():
        if rec[1:4] != (GROUP, TOPIC, 0):
            continue
        if rec[0] == "C":
            cursor = rec[4]
        elif rec[0] == "H":
            inflight.add(rec[4])
        else:
            inflight.discard(rec[4])
    return cursor, inflight


def test_pop_acks_survive_master_kill_9(tmp_path):
    c = started(tmp_path)
    try:
        old, slave = c.master_and_slave()

        async def before():
            async with RemotingClient(request_timeout=10.0) as client:
                pc, got = await send_and_pop(client, old.broker_addr, GROUP, N, POPPED)
                for m in got:
                    if int(m.body[1:]) % 2 == 0:  # even offsets acked, odd ones in flight
                        assert await pc.ack(m)

        trio.run(before)
        odd = {i for i in range(POPPED) if i % 2}
        wait_until(lambda: _journal_state(slave.data_dir) == (POPPED, odd), 30,
                   what="the POP state on the slave")
        old.kill()
        wait_until(lambda: c.master() is slave, 30, what="the slave promoted")

        bodies = pop_the_rest(slave.broker_addr, GROUP, N - POPPED)
        assert sorted(bodies) == [b"m%02d" % i for i in range(POPPED, N)]
    finally:
        c.close()
