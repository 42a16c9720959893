"""The gateways' shared state follows a broker name's new master after a kill -9 (issue 14;
docs/stateless-gateways.md, "When a broker fails"): real processes, a controller-mode
pair (`lmq namesrv --controller`, two brokers of one name), route logs and client
registries of two gateways in this process.

After the master dies and the controller elects the other broker, a route added on one
gateway (what a SUBSCRIBE does) is stored and reaches the other gateway, and a client
taken over on one gateway is seen by the other: none of them keeps trying the dead
address.
"""

from __future__ import annotations

import json
import time

import pytest
import trio

from core.client import ClientInstance
from core.client.errors import MQClientError
from core.remoting.codec import RemotingCommand
from core.remoting.errors import RemotingError
from gateway.routing.client_log import ClientLog
from gateway.routing.route_log import RouteLog, RouteLogConfig
from gateway.routing.route_table import Route
from tests.core.broker.harness import sync_invoke, wait_until
from tests.core.ha.process_cluster import Cluster

pytestmark = pytest.mark.slow

SYSTEM_TOPICS = {"LMQ_GW_ROUTE_LOG", "LMQ_GW_ROUTE_ACK", "LMQ_GW_CLIENTS"}


def _topics(addr: str) -> set[str]:
    resp = sync_invoke(addr, RemotingCommand.request(21, {}))  # GET_ALL_TOPIC_CONFIG
    return set(json.loads(resp.body_bytes())["topicConfigTable"])


def test_route_log_and_client_registry_follow_the_new_master(tmp_path):
    c = Cluster(tmp_path)
    try:
        c.start_pair()
        old, slave = c.master_and_slave()
        cfg = RouteLogConfig(pull_suspend_ms=500, heartbeat_interval_s=1.0,
                             ack_timeout_s=10.0, retry_delay_s=0.3)
        taken: list[str] = []

        async def main():
            async with ClientInstance(namesrv_addr=c.ns_addr) as ca, \
                    ClientInstance(namesrv_addr=c.ns_addr) as cb:
                a = RouteLog(ca, old.broker_addr, "bk", "gw-a", cfg)
                b = RouteLog(cb, old.broker_addr, "bk", "gw-b", cfg)
                la = ClientLog(ca, old.broker_addr, "bk", "gw-a", lambda *a: None,
                               pull_suspend_ms=500, retry_delay_s=0.3)
                lb = ClientLog(cb, old.broker_addr, "bk", "gw-b",
                               lambda cid, off, clean: taken.append(cid),
                               pull_suspend_ms=500, retry_delay_s=0.3)
                async with trio.open_nursery() as nursery:
                    for part in (a, b, la, lb):
                        await nursery.start(part.run)
                    _, complete = await a.add_route(Route("mqtt", "before/+", "L1"))
                    assert complete and b.table.mqtt_lmqs("before/x") == {"L1"}
                    await trio.to_thread.run_sync(lambda: wait_until(
                        lambda: SYSTEM_TOPICS <= _topics(slave.broker_addr), 30,
                        what="system topics on the slave"))
                    killed = time.monotonic()
                    await trio.to_thread.run_sync(old.kill)
                    await trio.to_thread.run_sync(lambda: wait_until(
                        lambda: c.master() is slave, 30, what="the slave elected"))
                    # What a SUBSCRIBE does after the failover: one failed attempt is
                    # allowed (the request that finds the old master gone).
                    with trio.fail_after(30):
                        while True:
                            try:
                                await a.add_route(Route("mqtt", "after/+", "L2"))
                                break
                            except (MQClientError, RemotingError, OSError):
                                await trio.sleep(0.5)
                        while b.table.mqtt_lmqs("after/x") != {"L2"}:
                            await b.changed()
                        print(f"route stored and propagated {time.monotonic() - killed:.1f} s "
                              "after the kill -9")
                        await la.announce("dev-1", True)
                        while "dev-1" not in taken:
                            await trio.sleep(0.1)
                    for part in (a, b, la, lb):
                        assert part.addr == slave.broker_addr
                    nursery.cancel_scope.cancel()

        trio.run(main)
    finally:
        c.close()
