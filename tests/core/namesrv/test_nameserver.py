"""NameServer over real sockets: registration, routes, expiry, KV, admin commands, CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from trio.testing import trio_test, wait_all_tasks_blocked

from core.namesrv import DataVersion, NameServer, NamesrvConfig, TopicConfigData
from core.namesrv.bodies import encode_register_body
from core.remoting import (
    RemotingClient,
    RemotingCommand,
    RemotingConnectError,
    RequestCode,
    ResponseCode,
)
from tests.ports import free_port as _free_port

REPO = Path(__file__).resolve().parents[3]
V1 = DataVersion(1700000000000, 1)


@asynccontextmanager
async def nameserver(**kwargs: object) -> AsyncIterator[tuple[NameServer, str]]:
    ns = NameServer(NamesrvConfig(host="127.0.0.1", port=0, **kwargs))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(ns.serve)
        yield ns, f"127.0.0.1:{port}"
        ns.close()


async def register_broker(
    client: RemotingClient,
    ns_addr: str,
    broker_name: str,
    broker_addr: str,
    topics: dict[str, int],
    *,
    broker_id: int = 0,
    cluster: str = "DefaultCluster",
    version: DataVersion = V1,
    compressed: bool = False,
) -> RemotingCommand:
    configs = [TopicConfigData(t, n, n, 6) for t, n in topics.items()]
    body = encode_register_body(configs, version, compressed=compressed)
    ext = {
        "brokerName": broker_name,
        "brokerAddr": broker_addr,
        "clusterName": cluster,
        "haServerAddr": broker_addr.rsplit(":", 1)[0] + ":10912",
        "brokerId": broker_id,  # a JSON number: must be accepted (docs/protocol.md §1.4)
        "compressed": "true" if compressed else "false",
        "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF),
    }
    return await client.invoke(ns_addr, RemotingCommand.request(RequestCode.REGISTER_BROKER, ext, body))


async def route(client: RemotingClient, ns_addr: str, topic: str) -> RemotingCommand:
    return await client.invoke(
        ns_addr, RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    )


@trio_test
async def test_route_json_is_exact_and_unknown_topic_is_17() -> None:
    async with nameserver() as (ns, addr), RemotingClient() as client:
        resp = await register_broker(client, addr, "broker-a", "127.0.0.1:20911", {"SniffTopic": 4})
        assert resp.code == ResponseCode.SUCCESS
        resp = await route(client, addr, "SniffTopic")
        assert resp.code == 0
        assert resp.body == (
            b'{"orderTopicConf":null,"queueDatas":[{"brokerName":"broker-a","readQueueNums":4,'
            b'"writeQueueNums":4,"perm":6,"topicSysFlag":0}],"brokerDatas":[{"cluster":'
            b'"DefaultCluster","brokerName":"broker-a","brokerAddrs":{"0":"127.0.0.1:20911"}}],'
            b'"filterServerTable":{}}'
        )
        resp = await route(client, addr, "Missing")
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST == 17
        assert resp.remark == "No topic route info in name server for the topic: Missing"
        assert resp.body is None
        resp = await client.invoke(addr, RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC))
        assert resp.code == ResponseCode.SYSTEM_ERROR and "topic" in resp.remark
        assert ("Missing", False) in ns.processors.stats.recent_route_queries


@trio_test
async def test_two_brokers_merge_and_compressed_registration() -> None:
    async with nameserver() as (ns, addr), RemotingClient() as client:
        await register_broker(client, addr, "broker-a", "10.0.0.1:10911", {"T": 4, "A": 1})
        resp = await register_broker(
            client, addr, "broker-b", "10.0.0.2:10911", {"T": 8}, compressed=True
        )
        assert resp.code == 0
        data = json.loads((await route(client, addr, "T")).body)
        assert [(q["brokerName"], q["writeQueueNums"]) for q in data["queueDatas"]] == [
            ("broker-a", 4),
            ("broker-b", 8),
        ]
        assert [b["brokerAddrs"] for b in data["brokerDatas"]] == [
            {"0": "10.0.0.1:10911"},
            {"0": "10.0.0.2:10911"},
        ]
        info = await client.invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO))
        assert json.loads(info.body)["clusterAddrTable"] == {"DefaultCluster": ["broker-a", "broker-b"]}
        topics = await client.invoke(
            addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        )
        assert json.loads(topics.body) == {"topicList": ["A", "T"], "brokerAddr": None}
        by_cluster = await client.invoke(
            addr,
            RemotingCommand.request(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "DefaultCluster"}),
        )
        assert json.loads(by_cluster.body)["topicList"] == ["A", "T"]
        system = await client.invoke(
            addr, RemotingCommand.request(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS)
        )
        assert json.loads(system.body) == {
            "topicList": ["DefaultCluster", "broker-a", "broker-b"],
            "brokerAddr": "10.0.0.1:10911",
        }


@trio_test
async def test_slave_registration_answers_master_address() -> None:
    async with nameserver() as (ns, addr), RemotingClient() as client:
        await register_broker(client, addr, "broker-a", "10.0.0.1:10911", {"T": 4})
        resp = await register_broker(
            client, addr, "broker-a", "10.0.0.7:10911", {"T": 4}, broker_id=1
        )
        assert resp.ext_fields == {"masterAddr": "10.0.0.1:10911", "haServerAddr": "10.0.0.1:10912"}


@trio_test
async def test_bad_crc_and_bad_body() -> None:
    async with nameserver() as (ns, addr), RemotingClient() as client:
        ext = {"brokerName": "b", "brokerAddr": "1.1.1.1:1", "clusterName": "c",
               "haServerAddr": "", "brokerId": "0", "bodyCrc32": "12345"}
        resp = await client.invoke(
            addr, RemotingCommand.request(RequestCode.REGISTER_BROKER, ext, b'{"x":1}')
        )
        assert resp.code == ResponseCode.SYSTEM_ERROR and resp.remark == "crc32 not match"
        ext["bodyCrc32"] = "0"
        resp = await client.invoke(
            addr, RemotingCommand.request(RequestCode.REGISTER_BROKER, ext, b"{broken")
        )
        assert resp.code == ResponseCode.SYSTEM_ERROR and "register body" in resp.remark
        assert ns.routes.live_broker_addrs() == []


@trio_test
async def test_unregister_and_connection_close_drop_brokers() -> None:
    async with nameserver() as (ns, addr), RemotingClient() as client:
        async with RemotingClient() as broker_b:
            await register_broker(client, addr, "broker-a", "10.0.0.1:10911", {"T": 4})
            await register_broker(broker_b, addr, "broker-b", "10.0.0.2:10911", {"T": 4})
            assert len(json.loads((await route(client, addr, "T")).body)["queueDatas"]) == 2
        # broker-b's connection closed: it is dropped at once (as soon as the name server has
        # read the close; it runs in this trio run), broker-a stays.
        await wait_all_tasks_blocked()
        assert ns.routes.live_broker_addrs() == ["10.0.0.1:10911"]
        data = json.loads((await route(client, addr, "T")).body)
        assert [q["brokerName"] for q in data["queueDatas"]] == ["broker-a"]
        resp = await client.invoke(
            addr,
            RemotingCommand.request(
                RequestCode.UNREGISTER_BROKER,
                {"brokerName": "broker-a", "brokerAddr": "10.0.0.1:10911",
                 "clusterName": "DefaultCluster", "brokerId": "0"},
            ),
        )
        assert resp.code == 0
        assert (await route(client, addr, "T")).code == ResponseCode.TOPIC_NOT_EXIST


@trio_test
async def test_silent_broker_expires() -> None:
    async with nameserver(broker_expiry_s=0.2, scan_interval_s=0.05) as (ns, addr):
        async with RemotingClient() as client:
            await register_broker(client, addr, "broker-a", "10.0.0.1:10911", {"T": 4})
            assert (await route(client, addr, "T")).code == 0
            # The connection stays open, but the broker stops registering.
            with trio.fail_after(5):
                while (await route(client, addr, "T")).code == 0:
                    await trio.sleep(0.05)
            assert ns.routes.live_broker_addrs() == []


@trio_test
async def test_query_data_version() -> None:
    async with nameserver() as (ns, addr), RemotingClient() as client:
        version = DataVersion(1700000000000, 5)
        await register_broker(client, addr, "a", "1.1.1.1:1", {"T": 1}, version=version)
        ext = {"brokerName": "a", "brokerAddr": "1.1.1.1:1", "clusterName": "DefaultCluster",
               "brokerId": "0"}

        async def query(v: DataVersion) -> RemotingCommand:
            body = json.dumps(v.to_json()).encode()
            return await client.invoke(
                addr, RemotingCommand.request(RequestCode.QUERY_DATA_VERSION, ext, body)
            )

        same = await query(version)
        assert same.ext_fields == {"changed": "false"}
        assert json.loads(same.body) == {"counter": 5, "timestamp": 1700000000000}
        assert (await query(DataVersion(1700000000000, 6))).ext_bool("changed") is True


@trio_test
async def test_write_perm_and_delete_topic() -> None:
    async with nameserver() as (ns, addr), RemotingClient() as client:
        await register_broker(client, addr, "a", "1.1.1.1:1", {"T": 1, "U": 1})
        wipe = await client.invoke(
            addr, RemotingCommand.request(RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "a"})
        )
        assert wipe.ext_fields == {"wipeTopicCount": "2"}
        assert json.loads((await route(client, addr, "T")).body)["queueDatas"][0]["perm"] == 4
        add = await client.invoke(
            addr, RemotingCommand.request(RequestCode.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "a"})
        )
        assert add.ext_fields == {"addTopicCount": "2"}
        assert json.loads((await route(client, addr, "T")).body)["queueDatas"][0]["perm"] == 6
        resp = await client.invoke(
            addr, RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "T"})
        )
        assert resp.code == 0
        assert (await route(client, addr, "T")).code == ResponseCode.TOPIC_NOT_EXIST
        assert (await route(client, addr, "U")).code == 0


@trio_test
async def test_kv_config_and_order_topic_conf() -> None:
    async with nameserver(order_message_enable=True) as (ns, addr), RemotingClient() as client:
        async def call(code: int, **ext: str) -> RemotingCommand:
            return await client.invoke(addr, RemotingCommand.request(code, ext))

        ns_name = "ORDER_TOPIC_CONFIG"
        assert (await call(RequestCode.PUT_KV_CONFIG, namespace=ns_name, key="T", value="a:8")).code == 0
        got = await call(RequestCode.GET_KV_CONFIG, namespace=ns_name, key="T")
        assert got.code == 0 and got.ext_fields == {"value": "a:8"}
        missing = await call(RequestCode.GET_KV_CONFIG, namespace=ns_name, key="nope")
        assert missing.code == ResponseCode.QUERY_NOT_FOUND
        assert missing.remark == "No config item, Namespace: ORDER_TOPIC_CONFIG Key: nope"
        table = await call(RequestCode.GET_KVLIST_BY_NAMESPACE, namespace=ns_name)
        assert json.loads(table.body) == {"table": {"T": "a:8"}}
        # Registration answers the order config table; the route carries orderTopicConf.
        reg = await register_broker(client, addr, "a", "1.1.1.1:1", {"T": 8})
        assert json.loads(reg.body) == {"table": {"T": "a:8"}}
        assert json.loads((await route(client, addr, "T")).body)["orderTopicConf"] == "a:8"
        assert (await call(RequestCode.DELETE_KV_CONFIG, namespace=ns_name, key="T")).code == 0
        gone = await call(RequestCode.GET_KVLIST_BY_NAMESPACE, namespace=ns_name)
        assert gone.code == ResponseCode.QUERY_NOT_FOUND
        bad = await call(RequestCode.PUT_KV_CONFIG, namespace=ns_name, key="k")
        assert bad.code == ResponseCode.SYSTEM_ERROR and "value" in bad.remark


@trio_test
async def test_name_servers_are_independent_and_local_transport_works() -> None:
    async with nameserver() as (ns1, addr1), nameserver() as (ns2, addr2):
        async with RemotingClient() as client:
            client.register_local("namesrv-local:9876", ns2.table)
            await register_broker(client, addr1, "a", "1.1.1.1:1", {"T": 1})
            assert (await route(client, addr1, "T")).code == 0
            assert (await route(client, addr2, "T")).code == ResponseCode.TOPIC_NOT_EXIST
            await register_broker(client, "namesrv-local:9876", "b", "2.2.2.2:1", {"T": 2})
            data = json.loads((await route(client, addr2, "T")).body)
            assert [q["brokerName"] for q in data["queueDatas"]] == ["b"]
            unsupported = await client.invoke(addr1, RemotingCommand.request(RequestCode.SEND_MESSAGE))
            assert unsupported.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        # The in-process "connection" closed with the client: its broker is gone.
        assert ns2.routes.live_broker_addrs() == []


@trio_test
async def test_cli_namesrv_serves_until_sigterm() -> None:
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmq", "namesrv", "--host", "127.0.0.1", "--port", str(port)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        async with RemotingClient(request_timeout=2, connect_timeout=1) as client:
            addr = f"127.0.0.1:{port}"
            with trio.fail_after(30):
                while True:
                    try:
                        resp = await route(client, addr, "Anything")
                        break
                    except RemotingConnectError:
                        await trio.sleep(0.1)
            assert resp.code == ResponseCode.TOPIC_NOT_EXIST
        proc.send_signal(signal.SIGTERM)
        rc = await trio.to_thread.run_sync(lambda: proc.wait(timeout=20))
        assert rc == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
