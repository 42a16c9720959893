"""Failover of writes in one process: a name server running the HA controller, two real
brokers of one broker name, TCP on free ports (docs/ha.md, "Failover")."""

from __future__ import annotations

import contextlib
import json

import trio

from core.broker.config import BrokerConfig
from core.broker.controller import BrokerController
from core.namesrv import NameServer, NamesrvConfig
from core.remoting.client import RemotingClient
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode, ResponseCode
from tests.core.broker.harness import SMALL_FILES, send_request
from tests.core.ha.test_replication import TOPIC, pull_all, wait_for

SECRET = "failover-secret"


@contextlib.asynccontextmanager
async def controlled(tmp_path):
    async with trio.open_nursery() as nursery:
        ns = NameServer(NamesrvConfig(
            host="127.0.0.1", port=0, controller_enable=True,
            controller_dir=str(tmp_path / "ctl"), controller_lease_s=1.0,
            controller_lease_margin_s=0.3, controller_check_s=0.05))
        await nursery.start(ns.serve)
        ns_addr = f"127.0.0.1:{ns.port}"

        async def broker(bid: int) -> BrokerController:
            b = BrokerController(BrokerConfig(
                host="127.0.0.1", port=0, data_dir=str(tmp_path / f"b{bid}"), broker_name="bk",
                broker_id=bid, broker_role="SYNC_MASTER", ha_secret=SECRET, ha_listen_port=0,
                namesrv_addrs=[ns_addr], controller_addr=ns_addr, controller_heartbeat_s=0.1,
                ha_config_sync_s=0.2, **SMALL_FILES))
            b.restart_hook = lambda: restarts.append(bid)
            await nursery.start(b.serve)
            return b

        restarts: list[int] = []
        async with RemotingClient(request_timeout=10.0) as client:
            yield client, ns, ns_addr, broker, restarts
        nursery.cancel_scope.deadline = trio.current_time() + 20
        ns.close()
        nursery.cancel_scope.cancel()


async def _topic(client, broker):
    resp = await client.invoke(broker.broker_addr, RemotingCommand.request(
        RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": TOPIC, "defaultTopic": "TBW102", "readQueueNums": 1,
            "writeQueueNums": 1, "perm": 6, "topicFilterType": "SINGLE_TAG"}))
    assert resp.code == 0, resp.remark


async def _master_1_slave_2(client, broker):
    """Broker 1 as master with a lease, broker 2 in its in-sync set, TOPIC created."""
    b1 = await broker(1)
    await wait_for(b1.ha_link.can_write)
    b2 = await broker(2)
    await wait_for(lambda: 2 in b1.ha_link.sync_set)
    await _topic(client, b1)
    return b1, b2


def test_lease_lapses_then_an_in_sync_slave_takes_over_with_every_acked_message(tmp_path):
    async def main():
        async with controlled(tmp_path) as (client, ns, ns_addr, broker, restarts):
            b1, b2 = await _master_1_slave_2(client, broker)
            # b2 refuses writes: it has no lease
            resp = await client.invoke(b2.broker_addr, send_request(TOPIC, b"no"))
            assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE
            acked = []
            for i in range(30):
                resp = await client.invoke(b1.broker_addr, send_request(TOPIC, b"m%d" % i))
                assert resp.code == ResponseCode.SUCCESS, resp.remark
                acked.append(b"m%d" % i)
            # b1 loses the controller (a partition): its lease runs out, then b2 is elected.
            async def unreachable(cmd):
                return None
            b1.ha_link._invoke = unreachable
            old_lease = b1.ha_link.lease_until
            await wait_for(b2.ha_link.can_write, timeout=10)
            # The rule: b2 got its lease only after b1's had run out.
            assert trio.current_time() > old_lease
            assert not b1.ha_link.can_write()
            resp = await client.invoke(b1.broker_addr, send_request(TOPIC, b"late"))
            assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE
            # The new master serves every acknowledged message, and takes writes (no
            # slave yet: stored, answered SLAVE_NOT_AVAILABLE as a SYNC_MASTER does).
            await b2.ha_slave.sync_config() if b2.ha_slave.master_broker_addr else None
            assert await pull_all(client, b2) == acked
            resp = await client.invoke(b2.broker_addr, send_request(TOPIC, b"after"))
            assert resp.code == ResponseCode.SLAVE_NOT_AVAILABLE, resp.remark
            # The name server lists b2 as the master (id 0) though b1 is still connected.
            cmd = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC})
            await wait_for_route(client, ns_addr, cmd, b2.broker_addr)
            # b1 reaches the controller again: it learns it was deposed and restarts.
            del b1.ha_link._invoke
            await wait_for(lambda: restarts == [1], timeout=10)
            state = json.loads((await client.invoke(ns_addr, RemotingCommand.request(
                900103, {}))).body)["bk"]
            assert state["masterId"] == 2 and state["epoch"] == 2
    trio.run(main)


async def wait_for_route(client, ns_addr, cmd, addr):
    with trio.fail_after(10):
        while True:
            resp = await client.invoke(ns_addr, cmd)
            if resp.code == 0:
                route = json.loads(resp.body)
                if any(bd["brokerAddrs"].get("0") == addr for bd in route["brokerDatas"]):
                    return
            await trio.sleep(0.05)


async def _admin(*args: str) -> dict | str:
    import sys

    proc = await trio.run_process([sys.executable, "-m", "lmq", "admin", *args],
                                  capture_stdout=True, capture_stderr=True, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode()
    return json.loads(out) if "--json" in args else out


def test_admin_shows_roles_and_lag_and_switches_by_hand(tmp_path):
    async def main():
        async with controlled(tmp_path) as (client, ns, ns_addr, broker, restarts):
            b1, b2 = await _master_1_slave_2(client, broker)
            for i in range(10):
                resp = await client.invoke(b1.broker_addr, send_request(TOPIC, b"x%d" % i))
                assert resp.code == ResponseCode.SUCCESS
            # The master's next heartbeat carries the slave's figures.
            def caught_up() -> bool:
                rep = ns.controller.snapshot()["bk"]["replicas"]["2"]
                return rep.get("lagBytes") == 0 and rep.get("lagS") == 0.0
            await wait_for(caught_up)
            state = (await _admin("ha", "status", "-n", ns_addr, "--json"))["bk"]
            reps = state["replicas"]
            assert (reps["1"]["role"], reps["2"]["role"]) == ("MASTER", "SLAVE")
            assert state["epoch"] == 1 and reps["2"]["inSync"]
            assert reps["2"]["lagBytes"] == 0 and reps["2"]["lagS"] == 0.0
            table = await _admin("ha", "status", "-n", ns_addr)
            assert "MASTER" in table and "SLAVE" in table and "LAG BYTES" in table
            # A controlled switch: b1's lease is no longer renewed, then b2 is elected.
            await _admin("ha", "switch", "bk", "--to", "2", "-n", ns_addr)
            lease_of_b1 = b1.ha_link.lease_until
            await wait_for(b2.ha_link.can_write, timeout=10)
            assert trio.current_time() > lease_of_b1 and not b1.ha_link.can_write()
            await wait_for(lambda: restarts == [1], timeout=10)
            state = (await _admin("ha", "status", "-n", ns_addr, "--json"))["bk"]
            assert state["masterId"] == 2 and state["epoch"] == 2
            assert await pull_all(client, b2) == [b"x%d" % i for i in range(10)]
    trio.run(main)
