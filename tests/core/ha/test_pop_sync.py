"""POP acknowledgement state replicated to the slave (core/broker/ha/pop_sync.py,
docs/ha.md "POP state"): real brokers in one process, TCP on free ports."""

from __future__ import annotations

import pytest
import trio

from core.broker.ha import pop_sync
from core.broker.ha.pop_sync import PopSyncError, check_lines, reload_pop_state
from core.broker.pop.journal import snapshot_line
from core.client.pop_consumer import PopClient
from tests.core.ha.test_replication import TOPIC, cluster, send, start_slave, wait_for

GROUP = "GID_HA_POP"


def _inflight(broker) -> set[int] | None:
    """The in-flight offsets the broker's journal holds for queue 0 (as a promoted slave
    would load them)."""
    reload_pop_state(broker)
    qs = broker.pop_service.state.get(GROUP, TOPIC, 0)
    return None if qs is None else set(qs.inflight)


def test_pop_acks_reach_the_slave_before_and_after_it_connects(tmp_path):
    async def main():
        async with cluster(tmp_path, role="ASYNC_MASTER", slave=False) as (
                client, master, _sl, ns_addr, nursery):
            for i in range(8):
                assert (await send(client, master, b"m%d" % i)).code == 0
            pc = PopClient(client, master.broker_addr, "bk", GROUP)
            got = (await pc.pop(TOPIC, queue_id=0, max_nums=4, invisible_ms=600_000)).messages
            assert len(got) == 4
            for m in got[:2]:
                assert await pc.ack(m)
            # A slave that connects now gets the state as a snapshot...
            slave = await start_slave(nursery, tmp_path, master, ns_addr)
            await wait_for(lambda: slave.ha_pop_replica.snapshots >= 1)
            assert _inflight(slave) == {2, 3}
            # ...and later changes as they are journaled.
            more = (await pc.pop(TOPIC, queue_id=0, max_nums=4, invisible_ms=600_000)).messages
            for m in [got[3], *more[1:]]:
                assert await pc.ack(m)
            await wait_for(lambda: _inflight(slave) == {2, 4})
            slave.stop()

    trio.run(main)


def test_outbox_replaces_a_long_backlog_by_a_snapshot(monkeypatch):
    class Feed:
        frame_bytes = 4096
        pop = None
        seq = 0

    monkeypatch.setattr(pop_sync, "POP_RESNAPSHOT_BYTES", 1000)
    box = pop_sync.PopOutbox(Feed())
    assert [k for k, _ in box.take()] == [pop_sync.POP_SNAPSHOT, pop_sync.POP_SNAPSHOT_END]
    line = snapshot_line("A", GROUP, TOPIC, 0, 1)
    for _ in range(60):
        box.append(line)
    sent = box.take()
    # Past the threshold the queue restarted with a snapshot: the slave's file is bounded.
    assert (pop_sync.POP_SNAPSHOT, b"") in sent and len(sent) < 60
    assert sent[-1] == (pop_sync.POP_APPEND, line)


@pytest.mark.parametrize("data", [b"C g t 0 5 00000000\n", b"no newline", b"x zz\n"])
def test_corrupt_journal_lines_are_refused(data):
    with pytest.raises(PopSyncError):
        check_lines(data)
    check_lines(snapshot_line("C", "g", "t", 0, 5))
