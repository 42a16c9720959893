"""RouteInfoManager (sans-IO) and the register body codec."""

from __future__ import annotations

import json
import struct
import zlib

import pytest

from core.namesrv.bodies import (
    DataVersion,
    TopicConfigData,
    decode_register_body,
    encode_register_body,
)
from core.namesrv.routes import RouteInfoManager

V1 = DataVersion(1, 1)


def topics(*specs: tuple[str, int]) -> dict[str, TopicConfigData]:
    return {name: TopicConfigData(name, n, n, 6) for name, n in specs}


def register(
    rim: RouteInfoManager,
    name: str,
    addr: str,
    broker_id: int = 0,
    tcs: dict[str, TopicConfigData] | None = None,
    version: DataVersion = V1,
    cluster: str = "DefaultCluster",
    channel: object = None,
    now: float = 0.0,
):
    return rim.register_broker(
        cluster, addr, name, broker_id, addr.replace("109", "209"), tcs, version,
        channel=channel, now=now,
    )


def test_two_brokers_routes_merge() -> None:
    rim = RouteInfoManager()
    register(rim, "broker-a", "10.0.0.1:10911", tcs=topics(("T", 4), ("OnlyA", 2)))
    register(rim, "broker-b", "10.0.0.2:10911", tcs=topics(("T", 8)))
    route = rim.get_route("T")
    assert route == {
        "orderTopicConf": None,
        "queueDatas": [
            {"brokerName": "broker-a", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6,
             "topicSysFlag": 0},
            {"brokerName": "broker-b", "readQueueNums": 8, "writeQueueNums": 8, "perm": 6,
             "topicSysFlag": 0},
        ],
        "brokerDatas": [
            {"cluster": "DefaultCluster", "brokerName": "broker-a",
             "brokerAddrs": {"0": "10.0.0.1:10911"}},
            {"cluster": "DefaultCluster", "brokerName": "broker-b",
             "brokerAddrs": {"0": "10.0.0.2:10911"}},
        ],
        "filterServerTable": {},
    }
    assert [q["brokerName"] for q in rim.get_route("OnlyA")["queueDatas"]] == ["broker-a"]
    assert rim.get_route("Nope") is None
    assert rim.all_topics() == ["OnlyA", "T"]
    info = rim.cluster_info()
    assert info["clusterAddrTable"] == {"DefaultCluster": ["broker-a", "broker-b"]}
    assert info["brokerAddrTable"]["broker-b"]["brokerAddrs"] == {"0": "10.0.0.2:10911"}


def test_registration_merges_topics_and_honours_data_version() -> None:
    rim = RouteInfoManager()
    register(rim, "a", "1.1.1.1:1", tcs=topics(("T1", 4)), version=DataVersion(1, 1))
    # A Java "increment" registration: one changed topic, a new data version.
    register(rim, "a", "1.1.1.1:1", tcs=topics(("T2", 2)), version=DataVersion(1, 2))
    assert rim.all_topics() == ["T1", "T2"]
    # Same data version again: the topic table is not re-read.
    register(rim, "a", "1.1.1.1:1", tcs=topics(("T1", 16)), version=DataVersion(1, 2))
    assert rim.get_route("T1")["queueDatas"][0]["writeQueueNums"] == 4
    assert not rim.is_broker_topic_config_changed("1.1.1.1:1", DataVersion(1, 2))
    assert rim.is_broker_topic_config_changed("1.1.1.1:1", DataVersion(1, 3))
    assert rim.is_broker_topic_config_changed("9.9.9.9:1", DataVersion(1, 2))


def test_slave_gets_master_and_does_not_touch_topics() -> None:
    rim = RouteInfoManager()
    register(rim, "a", "10.0.0.1:10911", tcs=topics(("T", 4)))
    res = register(rim, "a", "10.0.0.9:10911", broker_id=1, tcs=topics(("T", 99), ("S", 1)))
    assert res.master_addr == "10.0.0.1:10911"
    assert res.ha_server_addr == "10.0.0.1:20911"
    assert rim.all_topics() == ["T"]
    assert rim.get_route("T")["brokerDatas"][0]["brokerAddrs"] == {
        "0": "10.0.0.1:10911",
        "1": "10.0.0.9:10911",
    }
    # The master leaves: the slave keeps the broker name (and its topics) alive.
    rim.unregister_broker("DefaultCluster", "10.0.0.1:10911", "a", 0)
    assert rim.get_route("T")["brokerDatas"][0]["brokerAddrs"] == {"1": "10.0.0.9:10911"}
    rim.unregister_broker("DefaultCluster", "10.0.0.9:10911", "a", 1)
    assert rim.get_route("T") is None and rim.all_topics() == []
    assert rim.cluster_info() == {"brokerAddrTable": {}, "clusterAddrTable": {}}


def test_promoted_slave_drops_old_id() -> None:
    rim = RouteInfoManager()
    register(rim, "a", "10.0.0.9:1", broker_id=1)
    register(rim, "a", "10.0.0.9:1", broker_id=0)
    assert rim.broker_addr_table["a"].broker_addrs == {0: "10.0.0.9:1"}


def test_stale_unregister_is_ignored() -> None:
    rim = RouteInfoManager()
    register(rim, "a", "1.1.1.1:1", tcs=topics(("T", 1)))
    rim.unregister_broker("DefaultCluster", "2.2.2.2:2", "a", 0)  # not its address
    assert rim.broker_addr_table["a"].broker_addrs == {0: "1.1.1.1:1"}
    route = rim.get_route("T")
    assert [q["brokerName"] for q in route["queueDatas"]] == ["a"]
    assert [b["brokerAddrs"] for b in route["brokerDatas"]] == [{"0": "1.1.1.1:1"}]


def test_expiry_scan() -> None:
    rim = RouteInfoManager(broker_expiry_s=120)
    register(rim, "a", "1.1.1.1:1", tcs=topics(("T", 4)), now=0)
    register(rim, "b", "2.2.2.2:1", tcs=topics(("T", 4)), now=100)
    assert rim.scan_not_active_brokers(now=119) == []
    assert rim.scan_not_active_brokers(now=121) == ["1.1.1.1:1"]
    assert [q["brokerName"] for q in rim.get_route("T")["queueDatas"]] == ["b"]
    rim.touch_broker("2.2.2.2:1", now=200)
    assert rim.scan_not_active_brokers(now=300) == []
    assert rim.scan_not_active_brokers(now=321) == ["2.2.2.2:1"]
    assert rim.get_route("T") is None and rim.live_broker_addrs() == []


def test_channel_close_drops_only_brokers_of_that_channel() -> None:
    rim = RouteInfoManager()
    register(rim, "a", "1.1.1.1:1", tcs=topics(("T", 4)), channel=1)
    register(rim, "b", "2.2.2.2:1", tcs=topics(("T", 4)), channel=2)
    # "a" re-registered over a new connection: closing the old one must not drop it.
    register(rim, "a", "1.1.1.1:1", tcs=topics(("T", 4)), channel=3)
    assert rim.on_channel_closed(1) == []
    assert rim.on_channel_closed(2) == ["2.2.2.2:1"]
    assert [q["brokerName"] for q in rim.get_route("T")["queueDatas"]] == ["a"]


def test_delete_topic_and_write_perm() -> None:
    rim = RouteInfoManager()
    register(rim, "a", "1.1.1.1:1", tcs=topics(("T", 4), ("U", 1)), cluster="c1")
    register(rim, "b", "2.2.2.2:1", tcs=topics(("T", 4)), cluster="c2")
    assert rim.topics_by_cluster("c1") == ["T", "U"]
    assert rim.topics_by_cluster("c2") == ["T"]
    assert rim.topics_by_cluster("none") == []
    assert rim.wipe_write_perm_of_broker("a") == 2
    assert rim.get_route("T")["queueDatas"][0]["perm"] == 4
    assert rim.get_route("T")["queueDatas"][1]["perm"] == 6
    assert rim.add_write_perm_of_broker("a") == 2
    assert rim.get_route("U")["queueDatas"][0]["perm"] == 6
    assert rim.delete_topic("T", "c1")
    assert [q["brokerName"] for q in rim.get_route("T")["queueDatas"]] == ["b"]
    assert rim.delete_topic("T")
    assert not rim.delete_topic("T")
    assert rim.all_topics() == ["U"]
    names, addr = rim.system_topics()
    assert names == ["a", "b", "c1", "c2"] and addr == "1.1.1.1:1"


def test_cluster_move() -> None:
    rim = RouteInfoManager()
    register(rim, "a", "1.1.1.1:1", cluster="old")
    register(rim, "a", "1.1.1.1:1", cluster="new")
    assert rim.cluster_info()["clusterAddrTable"] == {"new": ["a"]}


def test_order_topic_conf_and_filter_servers() -> None:
    rim = RouteInfoManager()
    rim.register_broker("c", "1.1.1.1:1", "a", 0, "", topics(("T", 1)), DataVersion(1, 1),
                        ["1.1.1.1:5000"])
    route = rim.get_route("T", "a:8")
    assert route["orderTopicConf"] == "a:8"
    assert route["filterServerTable"] == {"1.1.1.1:1": ["1.1.1.1:5000"]}


# -- register body ---------------------------------------------------------------------

JAVA_BODY = {
    "topicConfigSerializeWrapper": {
        "topicConfigTable": {
            "TopicA": {"topicName": "TopicA", "readQueueNums": 8, "writeQueueNums": 4,
                       "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 1,
                       "order": False},
            "Old": {"readQueueNums": "2", "writeQueueNums": 2, "topicSynFlag": 2},
        },
        "dataVersion": {"timestamp": 1700000000000, "counter": 3},
    },
    "filterServerList": [],
}


def test_decode_java_json_register_body() -> None:
    reg = decode_register_body(json.dumps(JAVA_BODY).encode())
    assert reg.data_version == DataVersion(1700000000000, 3)
    a = reg.topic_configs["TopicA"]
    assert (a.read_queue_nums, a.write_queue_nums, a.perm, a.topic_sys_flag) == (8, 4, 6, 1)
    old = reg.topic_configs["Old"]
    assert (old.topic_name, old.read_queue_nums, old.perm, old.topic_sys_flag) == ("Old", 2, 6, 2)
    assert reg.filter_servers == []


@pytest.mark.parametrize("compressed", [False, True])
def test_register_body_round_trip(compressed: bool) -> None:
    tcs = [TopicConfigData("A", 4, 4, 6), TopicConfigData("%RETRY%g", 1, 1, 6, 0, "MULTI_TAG")]
    body = encode_register_body(tcs, DataVersion(5, 7), ["f:1"], compressed=compressed)
    reg = decode_register_body(body, compressed)
    assert reg.data_version == DataVersion(5, 7)
    assert reg.topic_configs["A"] == TopicConfigData("A", 4, 4, 6)
    assert reg.topic_configs["%RETRY%g"].topic_filter_type == "MULTI_TAG"
    assert reg.filter_servers == ["f:1"]


def test_compressed_java_layout_by_hand() -> None:
    def chunk(b: bytes) -> bytes:
        return struct.pack(">i", len(b)) + b

    raw = chunk(b'{"counter":2,"timestamp":9}') + struct.pack(">i", 1)
    raw += chunk(b"TopicX 3 5 7 SINGLE_TAG {}") + chunk(b"[]")
    reg = decode_register_body(zlib.compress(raw, 9), True)
    assert reg.data_version == DataVersion(9, 2)
    assert reg.topic_configs["TopicX"] == TopicConfigData("TopicX", 3, 5, 7)


@pytest.mark.parametrize(
    "body, compressed",
    [
        (b"{not json", False),
        (b"[]", False),
        (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"perm":"x"}}}}', False),
        (b'{"topicConfigSerializeWrapper":{"dataVersion":[1]}}', False),
        (b'{"filterServerList":[1]}', False),
        (b"not zlib", True),
        (zlib.compress(struct.pack(">i", 100) + b"{}"), True),
        (zlib.compress(struct.pack(">i", 2) + b"{}" + struct.pack(">i", 1) + struct.pack(">i", 3) + b"a b"), True),
    ],
)
def test_bad_register_bodies(body: bytes, compressed: bool) -> None:
    with pytest.raises(ValueError):
        decode_register_body(body, compressed)


def test_zip_bomb_is_refused() -> None:
    bomb = zlib.compress(b"\0" * (4 * 1024 * 1024), 9)
    with pytest.raises(ValueError, match="exceeds"):
        decode_register_body(bomb, True, max_size=1024 * 1024)


def test_empty_body_registers_liveness_only() -> None:
    reg = decode_register_body(None)
    assert reg.topic_configs == {} and reg.data_version == DataVersion()
