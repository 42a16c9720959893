"""Producer failover: a topic on two brokers, one of them killed (SIGKILL) mid-stream."""

from __future__ import annotations

import pytest
import trio
from trio.testing import trio_test

from core.client import AdminClient, ClientInstance, Message, Producer, SendStatus
from tests.core.client.cluster import BrokerProcess, cluster, wait_for


@pytest.mark.slow
@pytest.mark.parametrize("latency_fault", [False, True])
@trio_test
async def test_sends_fail_over_when_a_broker_is_killed(latency_fault):
    async with cluster() as c:
        b = BrokerProcess(c.namesrv_addr, "broker-b")
        try:
            await b.wait_ready()
            async with ClientInstance(namesrv_addr=c.namesrv_addr) as client:
                admin = AdminClient(client)

                async def both_registered():
                    return len((await admin.cluster_info()).brokers) == 2
                await wait_for(both_registered)
                await admin.topic_create("FailT", read_queue_nums=4, write_queue_nums=4)

                async with Producer(client, "PG_FAIL", send_latency_fault_enable=latency_fault,
                                    send_timeout=10) as p:
                    used = set()
                    for i in range(16):
                        r = await p.send(Message("FailT", b"before %d" % i))
                        used.add(r.message_queue.broker_name)
                    assert used == {"broker-a", "broker-b"}

                    b.kill()
                    after = []
                    for i in range(30):
                        r = await p.send(Message("FailT", b"after %d" % i))
                        assert r.status is SendStatus.SEND_OK
                        after.append(r.message_queue.broker_name)
                    assert set(after) == {"broker-a"}
                    if latency_fault:
                        # The dead broker is kept out of the rotation, not retried each time.
                        assert not p.fault.tolerance.is_available("broker-b")
        finally:
            b.cleanup()
        await trio.sleep(0)
