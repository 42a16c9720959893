"""SYNC_MASTER POP acks between real processes (docs/ha.md, "POP state"): `lmq namesrv
--controller`, two `lmq broker` of one broker name. An ack is not answered while the
slave is stopped (SIGSTOP) and is answered once it runs again (SIGCONT); the master is
then killed -9 right after that answer, and the new master never delivers an
acknowledged message again."""

from __future__ import annotations

import os
import signal

import pytest
import trio

from core.remoting.client import RemotingClient
from tests.core.broker.harness import wait_until
from tests.core.ha.process_cluster import CONFIG, pop_the_rest, send_and_pop, started

pytestmark = pytest.mark.slow

GROUP = "GID_POP_SYNC_ACK"
N, POPPED = 10, 6


def test_sync_ack_waits_for_a_stopped_slave_and_survives_kill_9(tmp_path):
    c = started(tmp_path, CONFIG + "sync_slave_timeout_s = 60.0\n")
    try:
        old, slave = c.master_and_slave()

        async def before():
            async with RemotingClient(request_timeout=30.0) as client:
                pc, got = await send_and_pop(client, old.broker_addr, GROUP, N, POPPED)
                for m in got[:-1]:
                    assert await pc.ack(m)
                answers: list[bool] = []

                async def ack_last():
                    answers.append(await pc.ack(got[-1]))

                os.kill(slave.proc.pid, signal.SIGSTOP)
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(ack_last)
                        await trio.sleep(1.5)  # the slave cannot hold it: no answer yet
                        assert answers == []
                        os.kill(slave.proc.pid, signal.SIGCONT)
                        with trio.fail_after(20):
                            while not answers:
                                await trio.sleep(0.01)
                finally:
                    os.kill(slave.proc.pid, signal.SIGCONT)
                assert answers == [True]

        trio.run(before)
        old.kill()  # -9, right after the last ack was answered
        wait_until(lambda: c.master() is slave, 30, what="the slave promoted")

        bodies = pop_the_rest(slave.broker_addr, GROUP, N - POPPED)
        assert sorted(bodies) == [b"m%02d" % i for i in range(POPPED, N)]
    finally:
        c.close()
