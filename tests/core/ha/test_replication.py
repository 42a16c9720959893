"""Master/slave replication in one process: real brokers, real name server, TCP on free
ports (docs/ha.md)."""

from __future__ import annotations

import contextlib
import json

import pytest
import trio

from core.broker.config import BrokerConfig
from core.broker.controller import BrokerController
from core.common.codec import decode_records
from core.namesrv import NameServer, NamesrvConfig
from core.remoting.client import RemotingClient
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode, ResponseCode
from tests.core.broker.harness import SMALL_FILES, pull_request, send_request

SECRET = "test-ha-secret"
TOPIC = "HaTopic"


def _config(tmp_path, name: str, **kw) -> BrokerConfig:
    base = dict(host="127.0.0.1", port=0, data_dir=str(tmp_path / name), broker_name="bk",
                ha_secret=SECRET, ha_listen_port=0, **SMALL_FILES)
    base.update(kw)
    return BrokerConfig(**base)


@contextlib.asynccontextmanager
async def cluster(tmp_path, *, role="SYNC_MASTER", slave=True, master_kw=None, slave_kw=None):
    """Name server + master (+ slave). Yields (client, master, slave, namesrv_addr)."""
    async with trio.open_nursery() as nursery:
        ns = NameServer(NamesrvConfig(host="127.0.0.1", port=0))
        await nursery.start(ns.serve)
        ns_addr = f"127.0.0.1:{ns.port}"
        master = BrokerController(_config(tmp_path, "master", broker_role=role,
                                          namesrv_addrs=[ns_addr], **(master_kw or {})))
        await nursery.start(master.serve)
        sl = None
        if slave:
            sl = await start_slave(nursery, tmp_path, master, ns_addr, **(slave_kw or {}))
        async with RemotingClient(request_timeout=10.0) as client:
            yield client, master, sl, ns_addr, nursery
        for b in (sl, master):
            if b is not None:
                b.stop()
        ns.close()
        nursery.cancel_scope.deadline = trio.current_time() + 30


async def start_slave(nursery, tmp_path, master, ns_addr, name="slave", **kw) -> BrokerController:
    sl = BrokerController(_config(
        tmp_path, name, broker_role="SLAVE", broker_id=1, namesrv_addrs=[ns_addr],
        ha_master_address=f"127.0.0.1:{master.ha_master.port}", **kw,
    ))
    await nursery.start(sl.serve)
    return sl


async def wait_for(pred, timeout=10.0):
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.01)


async def send(client, broker, body: bytes, queue_id=0):
    return await client.invoke(broker.broker_addr, send_request(TOPIC, body, queue_id=queue_id))


async def pull_all(client, broker, queue_id=0) -> list[bytes]:
    out: list[bytes] = []
    offset = 0
    while True:
        resp = await client.invoke(broker.broker_addr, pull_request("G", TOPIC, queue_id, offset))
        if resp.code != ResponseCode.SUCCESS:
            assert resp.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED), (
                resp.code, resp.remark)
            return out
        msgs = decode_records(resp.body)
        out += [m.body for m in msgs]
        offset = int(resp.ext_fields["nextBeginOffset"])


def test_sync_master_send_is_on_slave_when_acked(tmp_path):
    async def main():
        async with cluster(tmp_path) as (client, master, slave, _ns, _n):
            await wait_for(lambda: master.ha_master.slaves)
            for i in range(20):
                resp = await send(client, master, b"m%d" % i)
                assert resp.code == ResponseCode.SUCCESS, resp.remark
                # Acknowledged: the slave already holds and serves it.
                assert slave.store.max_physical_offset >= master.store.max_physical_offset
            await slave.ha_slave.sync_config()  # the topic (else within ha_config_sync_s)
            assert await pull_all(client, slave) == [b"m%d" % i for i in range(20)]
    trio.run(main)


def test_slave_refuses_sends_and_registers_as_broker_id_1(tmp_path):
    async def main():
        async with cluster(tmp_path) as (client, master, slave, ns_addr, _n):
            await wait_for(lambda: master.ha_master.slaves)
            assert (await send(client, master, b"x")).code == ResponseCode.SUCCESS
            resp = await send(client, slave, b"y")
            assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE
            assert "slave" in resp.remark
            await slave.ha_slave.sync_config()
            await slave.register_all()
            cmd = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC})
            route = json.loads((await client.invoke(ns_addr, cmd)).body)
            addrs = route["brokerDatas"][0]["brokerAddrs"]
            assert addrs == {"0": master.broker_addr, "1": slave.broker_addr}
    trio.run(main)


def test_sync_master_without_slave_answers_slave_not_available(tmp_path):
    async def main():
        async with cluster(tmp_path, slave=False) as (client, master, _s, _ns, _n):
            resp = await send(client, master, b"x")
            assert resp.code == ResponseCode.SLAVE_NOT_AVAILABLE
            # Stored all the same (RocketMQ semantics): the response carries the msgId.
            assert resp.ext_fields.get("msgId")
    trio.run(main)


def test_sync_master_times_out_when_slave_stalls(tmp_path):
    async def main():
        async with cluster(tmp_path, master_kw={"sync_slave_timeout_s": 0.2}) as (
            client, master, slave, _ns, _n
        ):
            await wait_for(lambda: master.ha_master.slaves)
            # The slave stops acknowledging: its stored offset stays behind.
            master.ha_master.acked = -1
            master.ha_master.slaves = {k: -1 for k in master.ha_master.slaves}
            orig = master.ha_master._set_acked
            master.ha_master._set_acked = lambda: None
            resp = await send(client, master, b"x")
            assert resp.code == ResponseCode.FLUSH_SLAVE_TIMEOUT
            master.ha_master._set_acked = orig
    trio.run(main)


def test_async_master_works_without_slave(tmp_path):
    async def main():
        async with cluster(tmp_path, role="ASYNC_MASTER", slave=False) as (
            client, master, _s, _ns, _n
        ):
            for i in range(5):
                assert (await send(client, master, b"a%d" % i)).code == ResponseCode.SUCCESS
            assert await pull_all(client, master) == [b"a%d" % i for i in range(5)]
    trio.run(main)


def test_slave_that_was_down_catches_up(tmp_path):
    async def main():
        async with cluster(tmp_path, role="ASYNC_MASTER") as (client, master, slave, ns, nursery):
            await wait_for(lambda: master.ha_master.slaves)
            assert (await send(client, master, b"before")).code == ResponseCode.SUCCESS
            await wait_for(lambda: slave.store.max_physical_offset == master.store.max_physical_offset)
            slave.stop()
            await wait_for(lambda: not master.ha_master.slaves)
            await wait_for(lambda: not slave.started)
            # Enough to span CommitLog files (8 MiB each): rollover and BLANK fillers.
            body = b"z" * 100_000
            for i in range(200):
                resp = await send(client, master, body + b"%d" % i, queue_id=i % 2)
                assert resp.code == ResponseCode.SUCCESS
            again = await start_slave(nursery, tmp_path, master, ns)
            await wait_for(lambda: again.store.max_physical_offset == master.store.max_physical_offset)
            await wait_for(lambda: again.ha_slave.master_broker_addr)
            await again.ha_slave.sync_config()
            got = await pull_all(client, again, 0) + await pull_all(client, again, 1)
            assert sorted(got) == sorted([b"before"] + [body + b"%d" % i for i in range(200)])
            again.stop()
    trio.run(main)


def test_wrong_secret_is_refused(tmp_path):
    async def main():
        async with cluster(tmp_path, slave=False) as (client, master, _s, ns, nursery):
            bad = await start_slave(nursery, tmp_path, master, ns, ha_secret="wrong")
            await wait_for(lambda: master.ha_master.refused >= 1)
            assert not master.ha_master.slaves
            assert not bad.ha_slave.connected
            bad.stop()
    trio.run(main)


@pytest.mark.parametrize("role", ["ASYNC_MASTER"])
def test_topics_and_offsets_synced(tmp_path, role):
    async def main():
        async with cluster(tmp_path, role=role) as (client, master, slave, _ns, _n):
            await wait_for(lambda: master.ha_master.slaves)
            assert (await send(client, master, b"x")).code == ResponseCode.SUCCESS
            master.offset_manager.commit("G1", TOPIC, 0, 1)
            await wait_for(lambda: slave.ha_slave.master_broker_addr)
            await slave.ha_slave.sync_config()
            assert slave.topic_config_manager.get(TOPIC) is not None
            assert slave.offset_manager.query("G1", TOPIC, 0) == 1
    trio.run(main)


def test_native_client_pulls_from_slave_when_master_is_gone(tmp_path):
    from core.client import ClientInstance, MessageQueue, PullConsumer, PullStatus

    async def main():
        async with cluster(tmp_path, role="ASYNC_MASTER") as (client, master, slave, ns, _n):
            await wait_for(lambda: master.ha_master.slaves)
            for i in range(3):
                assert (await send(client, master, b"c%d" % i)).code == ResponseCode.SUCCESS
            await wait_for(lambda: slave.store.max_physical_offset == master.store.max_physical_offset)
            await slave.ha_slave.sync_config()
            await slave.register_all()
            master.stop()  # unregisters: the route keeps only the slave (brokerId 1)
            await wait_for(lambda: not master.started)
            async with ClientInstance(namesrv_addr=ns) as native:
                pc = PullConsumer(native, "CG_HA")
                await native.update_route(TOPIC)
                r = await pc.pull(MessageQueue(TOPIC, "bk", 0), "*", 0)
                assert r.status is PullStatus.FOUND
                assert [m.body for m in r.messages] == [b"c0", b"c1", b"c2"]
    trio.run(main)


def test_sync_waits_do_not_serialize_a_connection(tmp_path):
    """Sends on one connection wait for the slave side by side (not one after another)."""
    async def main():
        async with cluster(tmp_path, master_kw={"sync_slave_timeout_s": 60}) as (
            client, master, slave, _ns, nursery
        ):
            await wait_for(lambda: master.ha_master.slaves)
            ha = master.ha_master
            release = ha._set_acked
            ha._set_acked = lambda: None  # reports arrive, but no send is released yet
            codes = []

            async def one(body):
                codes.append((await send(client, master, body)).code)

            nursery.start_soon(one, b"a")
            nursery.start_soon(one, b"b")
            # Both were stored while the first still waits for the slave.
            await wait_for(lambda: master.store.max_offset(TOPIC, 0) == 2)
            assert codes == []
            ha._set_acked = release
            release()
            await wait_for(lambda: len(codes) == 2)
            assert codes == [ResponseCode.SUCCESS] * 2
    trio.run(main)


def test_hostile_handshakes_are_refused_and_the_slave_carries_on(tmp_path):
    import hashlib
    import hmac
    import struct

    async def main():
        async with cluster(tmp_path) as (client, master, slave, _ns, _n):
            ha = master.ha_master
            await wait_for(lambda: ha.slaves)
            port = ha.port

            async def attempt(name: bytes, offset: int, secret: str = SECRET) -> bytes:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                async with stream:
                    hello = b""
                    while len(hello) < 38:
                        hello += await stream.receive_some(38 - len(hello))
                    id_epoch = struct.pack(">ii", 2, 0)
                    mac = hmac.new(secret.encode(), b"slave" + hello[6:] + name + id_epoch,
                                   hashlib.sha256).digest()
                    await stream.send_all(mac + struct.pack(">q", offset) + id_epoch
                                          + struct.pack(">H", len(name)) + name)
                    with trio.move_on_after(5):
                        return await stream.receive_some(100)
                    return b"timeout"

            assert await attempt(b"bk", 0, "guess") == b""  # wrong secret: closed
            assert await attempt(b"other", 0) == b""  # another broker's slave
            assert await attempt(b"bk", 1 << 40) == b""  # ahead of the master
            assert ha.refused == 3
            assert (await send(client, master, b"still")).code == ResponseCode.SUCCESS
    trio.run(main)


def test_slave_syncs_subscription_groups(tmp_path):
    from core.broker.subscription_group import SubscriptionGroupConfig

    async def main():
        async with cluster(tmp_path, role="ASYNC_MASTER") as (client, master, slave, _ns, _n):
            await wait_for(lambda: slave.ha_slave.master_broker_addr)
            master.subscription_group_manager.update(
                SubscriptionGroupConfig("GroupOnMaster", retry_max_times=3))
            await slave.ha_slave.sync_config()
            got = slave.subscription_group_manager.table.get("GroupOnMaster")
            assert got is not None and got.retry_max_times == 3
    trio.run(main)
