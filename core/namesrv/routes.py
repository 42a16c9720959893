"""The name server's route table, sans-IO (docs/protocol.md §4).

Per topic: one QueueData per broker name. Per broker name: a BrokerData (cluster, name,
broker id -> address; id 0 is the master). Per cluster: its broker names. Per broker
address: liveness (last registration, data version, the channel it registered on).

Only masters' topic configs make QueueData, as in RocketMQ. A registration merges the
topics it carries into the table and never removes topics a broker did not mention: a Java
4.x broker re-registers a single changed topic with the same data version (its
"increment" registration), so dropping unmentioned topics would lose routes. Deleted
topics leave through DELETE_TOPIC_IN_NAMESRV or when their last broker goes away.

All methods take an optional `now` (monotonic seconds) so tests drive time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from core.namesrv.bodies import DataVersion, TopicConfigData

__all__ = ["BrokerData", "BrokerLiveInfo", "QueueData", "RegisterResult", "RouteInfoManager"]

log = logging.getLogger(__name__)

PERM_WRITE = 2
MASTER_ID = 0


@dataclass
class QueueData:
    """A topic's queues on one broker (TopicRouteData.queueDatas element)."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "brokerName": self.broker_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicSysFlag": self.topic_sys_flag,
        }

    @classmethod
    def from_json(cls, obj: dict) -> QueueData:
        """As a client reads it: missing counts are 0, a missing perm is 6 (read and
        write), and older servers spell the flag `topicSynFlag`."""
        return cls(
            str(obj["brokerName"]),
            int(obj.get("readQueueNums", 0)),
            int(obj.get("writeQueueNums", 0)),
            int(obj.get("perm", 6)),
            int(obj.get("topicSysFlag", obj.get("topicSynFlag", 0)) or 0),
        )


@dataclass
class BrokerData:
    """The addresses of one broker name: id -> "ip:port" (0 = master)."""

    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        # Broker ids as quoted JSON keys (docs/protocol.md §4.1): standard JSON, the C++ client atoi()s them.
        return {
            "cluster": self.cluster,
            "brokerName": self.broker_name,
            "brokerAddrs": {str(i): a for i, a in sorted(self.broker_addrs.items())},
        }


@dataclass
class BrokerLiveInfo:
    last_update: float
    data_version: DataVersion
    channel: Hashable | None
    ha_server_addr: str


@dataclass
class RegisterResult:
    """What REGISTER_BROKER answers: the master of a slave, and its HA address."""

    master_addr: str | None = None
    ha_server_addr: str | None = None
    first_registration: bool = False


class RouteInfoManager:
    """Broker registry and topic routes of one name server (no I/O, no shared state)."""

    def __init__(self, broker_expiry_s: float = 120.0) -> None:
        self.broker_expiry_s = broker_expiry_s
        self.topic_queue_table: dict[str, dict[str, QueueData]] = {}
        self.broker_addr_table: dict[str, BrokerData] = {}
        self.cluster_addr_table: dict[str, set[str]] = {}
        self.broker_live_table: dict[str, BrokerLiveInfo] = {}
        self.filter_server_table: dict[str, list[str]] = {}

    # -- registration -----------------------------------------------------------------

    def register_broker(
        self,
        cluster_name: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        ha_server_addr: str = "",
        topic_configs: dict[str, TopicConfigData] | None = None,
        data_version: DataVersion | None = None,
        filter_servers: list[str] | None = None,
        channel: Hashable | None = None,
        now: float | None = None,
    ) -> RegisterResult:
        """Record a broker's (re-)registration and, for a master, its topics."""
        now = time.monotonic() if now is None else now
        data_version = data_version or DataVersion()
        result = RegisterResult()

        self.cluster_addr_table.setdefault(cluster_name, set()).add(broker_name)
        broker = self.broker_addr_table.get(broker_name)
        first = broker is None
        if broker is None:
            broker = self.broker_addr_table[broker_name] = BrokerData(cluster_name, broker_name)
        elif broker.cluster != cluster_name:
            # A broker name moved to another cluster: keep the cluster sets consistent.
            old = self.cluster_addr_table.get(broker.cluster)
            if old is not None:
                old.discard(broker_name)
                if not old:
                    del self.cluster_addr_table[broker.cluster]
            broker.cluster = cluster_name
        # The same address under another id (a slave promoted to master): drop the old id.
        for other_id, addr in list(broker.broker_addrs.items()):
            if addr == broker_addr and other_id != broker_id:
                del broker.broker_addrs[other_id]
        previous = broker.broker_addrs.get(broker_id)
        broker.broker_addrs[broker_id] = broker_addr
        first = first or previous is None

        if broker_id == MASTER_ID and topic_configs is not None:
            if first or self.is_broker_topic_config_changed(broker_addr, data_version):
                for tc in topic_configs.values():
                    self._put_queue_data(broker_name, tc)

        live = self.broker_live_table.get(broker_addr)
        if live is None:
            log.info(
                "broker registered: %s %s id=%d at %s", cluster_name, broker_name, broker_id,
                broker_addr,
            )
        self.broker_live_table[broker_addr] = BrokerLiveInfo(
            now, data_version, channel, ha_server_addr
        )
        if filter_servers:
            self.filter_server_table[broker_addr] = list(filter_servers)
        else:
            self.filter_server_table.pop(broker_addr, None)

        if broker_id != MASTER_ID:
            master_addr = broker.broker_addrs.get(MASTER_ID)
            if master_addr is not None:
                master_live = self.broker_live_table.get(master_addr)
                if master_live is not None:
                    result.master_addr = master_addr
                    result.ha_server_addr = master_live.ha_server_addr
        result.first_registration = live is None
        return result

    def registration_conflict(
        self,
        broker_name: str,
        broker_id: int,
        broker_addr: str,
        channel: Hashable | None,
        channel_open: Callable[[Hashable], bool],
        now: float | None = None,
    ) -> str | None:
        """Why a registration must not replace a live broker, or None (docs/acl.md §5).

        A live (name, id) keeps its address until it unregisters or expires; a live
        address keeps the connection it registered through while that stays open. So a
        stray REGISTER_BROKER can neither take a broker's traffic nor, by closing its
        connection, remove the real broker from the routes.
        """
        now = time.monotonic() if now is None else now
        deadline = now - self.broker_expiry_s
        broker = self.broker_addr_table.get(broker_name)
        current = broker.broker_addrs.get(broker_id) if broker is not None else None
        if current is not None and current != broker_addr:
            live = self.broker_live_table.get(current)
            if live is not None and live.last_update >= deadline:
                return (f"broker {broker_name} id {broker_id} is registered at {current} and "
                        f"alive; it must unregister or expire first")
        live = self.broker_live_table.get(broker_addr)
        if (
            live is not None
            and live.last_update >= deadline
            and channel is not None
            and live.channel is not None
            and live.channel != channel
            and channel_open(live.channel)
        ):
            return (f"broker address {broker_addr} is registered through another live "
                    f"connection")
        return None

    def _put_queue_data(self, broker_name: str, tc: TopicConfigData) -> None:
        queues = self.topic_queue_table.setdefault(tc.topic_name, {})
        queues[broker_name] = QueueData(
            broker_name, tc.read_queue_nums, tc.write_queue_nums, tc.perm, tc.topic_sys_flag
        )

    def is_broker_topic_config_changed(self, broker_addr: str, data_version: DataVersion) -> bool:
        live = self.broker_live_table.get(broker_addr)
        return live is None or live.data_version != data_version

    def broker_data_version(self, broker_addr: str) -> DataVersion | None:
        live = self.broker_live_table.get(broker_addr)
        return None if live is None else live.data_version

    def touch_broker(self, broker_addr: str, now: float | None = None) -> None:
        """Refresh a broker's liveness without a full registration (QUERY_DATA_VERSION)."""
        live = self.broker_live_table.get(broker_addr)
        if live is not None:
            live.last_update = time.monotonic() if now is None else now

    # -- removal ----------------------------------------------------------------------

    def unregister_broker(
        self, cluster_name: str, broker_addr: str, broker_name: str, broker_id: int
    ) -> bool:
        """A broker left cleanly (UNREGISTER_BROKER). Only the entry registered at
        `broker_addr` goes: another address for that name and id stays (docs/acl.md §5).
        Returns whether anything was removed."""
        broker = self.broker_addr_table.get(broker_name)
        if broker is None or broker.broker_addrs.get(broker_id) != broker_addr:
            return False
        self.broker_live_table.pop(broker_addr, None)
        self.filter_server_table.pop(broker_addr, None)
        del broker.broker_addrs[broker_id]
        log.info("broker unregistered: %s %s id=%d", cluster_name, broker_addr, broker_id)
        if not broker.broker_addrs:
            self._drop_broker_name(broker)
        return True

    def remove_broker_addr(self, broker_addr: str, reason: str = "") -> bool:
        """Forget everything about the broker at `broker_addr` (expired or disconnected)."""
        known = self.broker_live_table.pop(broker_addr, None) is not None
        self.filter_server_table.pop(broker_addr, None)
        for broker in list(self.broker_addr_table.values()):
            ids = [i for i, a in broker.broker_addrs.items() if a == broker_addr]
            for i in ids:
                del broker.broker_addrs[i]
                known = True
            if ids and not broker.broker_addrs:
                self._drop_broker_name(broker)
        if known:
            log.info("broker removed: %s (%s)", broker_addr, reason or "removed")
        return known

    def _drop_broker_name(self, broker: BrokerData) -> None:
        name = broker.broker_name
        self.broker_addr_table.pop(name, None)
        names = self.cluster_addr_table.get(broker.cluster)
        if names is not None:
            names.discard(name)
            if not names:
                del self.cluster_addr_table[broker.cluster]
        for topic, queues in list(self.topic_queue_table.items()):
            if queues.pop(name, None) is not None and not queues:
                del self.topic_queue_table[topic]

    def on_channel_closed(self, channel: Hashable) -> list[str]:
        """Drop the brokers that registered through `channel`; returns their addresses."""
        addrs = [a for a, live in self.broker_live_table.items() if live.channel == channel]
        for addr in addrs:
            self.remove_broker_addr(addr, "connection closed")
        return addrs

    def scan_not_active_brokers(self, now: float | None = None) -> list[str]:
        """Drop brokers silent for longer than `broker_expiry_s`; returns their addresses."""
        now = time.monotonic() if now is None else now
        deadline = now - self.broker_expiry_s
        expired = [a for a, live in self.broker_live_table.items() if live.last_update < deadline]
        for addr in expired:
            self.remove_broker_addr(addr, f"no registration for {self.broker_expiry_s:g} s")
        return expired

    # -- topics -----------------------------------------------------------------------

    def delete_topic(self, topic: str, cluster_name: str | None = None) -> bool:
        """Remove a topic's routes, on all brokers or only on those of `cluster_name`."""
        queues = self.topic_queue_table.get(topic)
        if queues is None:
            return False
        if cluster_name:
            for name in self.cluster_addr_table.get(cluster_name, ()):
                queues.pop(name, None)
            if queues:
                return True
        del self.topic_queue_table[topic]
        return True

    def _set_write_perm(self, broker_name: str, enable: bool) -> int:
        count = 0
        for queues in self.topic_queue_table.values():
            qd = queues.get(broker_name)
            if qd is not None:
                qd.perm = (qd.perm | PERM_WRITE) if enable else (qd.perm & ~PERM_WRITE)
                count += 1
        return count

    def wipe_write_perm_of_broker(self, broker_name: str) -> int:
        """Make every topic of `broker_name` read-only; returns the topic count."""
        return self._set_write_perm(broker_name, False)

    def add_write_perm_of_broker(self, broker_name: str) -> int:
        """Make every topic of `broker_name` writable again; returns the topic count."""
        return self._set_write_perm(broker_name, True)

    # -- queries ----------------------------------------------------------------------

    def get_route(self, topic: str, order_topic_conf: str | None = None) -> dict[str, Any] | None:
        """TopicRouteData (docs/protocol.md §4.1) as a JSON-ready dict, or None when there is no route."""
        queues = self.topic_queue_table.get(topic)
        if not queues:
            return None
        brokers = [self.broker_addr_table[n] for n in sorted(queues) if n in self.broker_addr_table]
        if not brokers:
            return None
        filters: dict[str, list[str]] = {}
        for broker in brokers:
            for addr in broker.broker_addrs.values():
                servers = self.filter_server_table.get(addr)
                if servers:
                    filters[addr] = servers
        return {
            "orderTopicConf": order_topic_conf,
            "queueDatas": [queues[n].to_json() for n in sorted(queues)],
            "brokerDatas": [b.to_json() for b in brokers],
            "filterServerTable": filters,
        }

    def cluster_info(self) -> dict[str, Any]:
        """ClusterInfo (docs/protocol.md §4.4)."""
        return {
            "brokerAddrTable": {
                name: self.broker_addr_table[name].to_json() for name in sorted(self.broker_addr_table)
            },
            "clusterAddrTable": {
                cluster: sorted(names) for cluster, names in sorted(self.cluster_addr_table.items())
            },
        }

    def all_topics(self) -> list[str]:
        return sorted(self.topic_queue_table)

    def topics_by_cluster(self, cluster_name: str) -> list[str]:
        names = self.cluster_addr_table.get(cluster_name, set())
        return sorted(t for t, queues in self.topic_queue_table.items() if names & queues.keys())

    def system_topics(self) -> tuple[list[str], str | None]:
        """Cluster and broker names (Java registers them as topics) and one broker address."""
        topics: set[str] = set()
        for cluster, names in self.cluster_addr_table.items():
            topics.add(cluster)
            topics.update(names)
        addr = None
        for name in sorted(self.broker_addr_table):
            addrs = self.broker_addr_table[name].broker_addrs
            if addrs:
                addr = addrs[min(addrs)]
                break
        return sorted(topics), addr

    def live_broker_addrs(self) -> list[str]:
        return sorted(self.broker_live_table)
