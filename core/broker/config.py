"""Broker configuration (defaults follow Java 4.9.7, docs/protocol.md §9.6) and TOML loading.

Every limit the broker enforces is a field here, with its default, so `lmq broker
--config FILE` can change it. Field names are the TOML keys (`broker_name = "broker-b"`).
"""

from __future__ import annotations

import dataclasses
import functools
import socket
import tomllib
from dataclasses import dataclass, field
from typing import Any

from core.remoting.listener_config import RemotingListenerConfig

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"


@dataclass
class BrokerConfig(RemotingListenerConfig):
    """Settings of one broker (a master has `broker_id` 0, a slave > 0: docs/ha.md)."""

    # identity and network
    broker_name: str = "broker-a"
    cluster_name: str = "DefaultCluster"
    broker_id: int = 0
    host: str = "127.0.0.1"  # loopback unless told otherwise (docs/remoting.md)
    port: int = 10911
    # Address written into STOREHOST and registered with the name servers; clients
    # (the C++ consumer's send-back) connect to it (docs/protocol.md §5.1 step 5). None = derived from host.
    advertise_host: str | None = None
    namesrv_addrs: list[str] = field(default_factory=list)
    data_dir: str = "./data"
    broker_permission: int = 6  # PermName READ|WRITE (docs/protocol.md §9.5)

    # store and durability
    flush: str = "async"  # "async" (ASYNC_FLUSH) | "sync" (SYNC_FLUSH, group commit)
    flush_interval_ms: int = 500  # ASYNC_FLUSH timer
    sync_flush_timeout_ms: int = 5000  # Java syncFlushTimeout -> FLUSH_DISK_TIMEOUT (10)
    commitlog_file_size: int = 1 << 30  # mappedFileSizeCommitLog
    consume_queue_units_per_file: int = 300_000  # 6 MB consume-queue files
    preallocate_files: bool = True  # fallocate new files (no SIGBUS on a full disk)
    max_message_size: int = 4 * 1024 * 1024  # maxMessageSize (body, after inflating a batch)
    file_reserved_hours: float = 72.0
    clean_interval_s: float = 10.0  # how often the retention pass runs
    enable_lmq: bool = True
    max_lmq_consume_queue_num: int = 20000

    # topics and groups
    auto_create_subscription_group: bool = True
    default_topic_queue_nums: int = 8
    cluster_topic_enable: bool = True
    broker_topic_enable: bool = True
    retry_max_times: int = 16  # SubscriptionGroupConfig.retryMaxTimes default
    max_topic_queue_nums: int = 1024  # UPDATE_AND_CREATE_TOPIC refuses more queues

    # topics created by a send (autoCreateTopicEnable, docs/topics.md)
    # None = the command's default: on for `lmq serve` (and embedded use), off for
    # `lmq broker` (a cluster member), which is what RocketMQ users expect of each.
    auto_create_topic_enable: bool | None = None
    auto_create_topic: bool | None = None  # older name of the same setting
    # Topics a send may create (TBW102 template or %RETRY% names) before sends to new
    # names get TOPIC_NOT_EXIST. Each costs a ConsumeQueue file (a descriptor and a
    # mapping) per written queue, up to default_topic_queue_nums: 256 stays within a
    # few thousand descriptors, while a development setup auto-creates a few dozen.
    max_auto_created_topics: int = 256

    # client management: what one HEART_BEAT may register (docs/topics.md, "Consumer
    # groups and heartbeats"). Each refusal uses RocketMQ's code, see each field.
    # Subscription groups created because a client named one (autoCreateSubscriptionGroup
    # above); beyond this an unknown group gets SUBSCRIPTION_GROUP_NOT_EXIST (26). Each
    # costs an entry in subscriptionGroup.json (rewritten whole on a change) and, from a
    # heartbeat, a %RETRY% topic, which counts against max_auto_created_topics.
    max_auto_created_groups: int = 1000
    # A heartbeat body is a few kB (one entry per producer/consumer group of a client
    # instance). It bounds the work one heartbeat does on the loop: each TAG expression
    # is capped (FilterLimits), but parsing tags costs ~0.15 s per MiB of them, so
    # 256 KiB (a thousand subscriptions of 250 bytes) keeps a heartbeat under ~40 ms.
    max_heartbeat_body_bytes: int = 256 * 1024
    # Producer plus consumer entries in one heartbeat, and subscriptions over all its
    # consumer entries: an application has a handful of groups, each a few topics.
    max_heartbeat_groups: int = 256
    max_heartbeat_subscriptions: int = 1024
    # Groups (producer or consumer) one connection may be a member of; without it a
    # connection could grow the broker's tables by max_heartbeat_groups per heartbeat.
    max_groups_per_connection: int = 256

    # consumers and pulls
    long_polling: bool = True  # longPollingEnable
    short_polling_ms: int = 1000  # shortPollingTimeMills (long polling off)
    # Cap of a held pull: clients time out after 30 s (docs/protocol.md §5.2), so answer well before.
    max_suspend_ms: int = 25000
    max_pull_msg_nums: int = 32  # maxTransferCountOnMessageInMemory
    max_pull_bytes: int = 256 * 1024  # maxTransferBytesOnMessageInMemory
    notify_consumer_ids_changed: bool = True
    client_channel_expiry_s: float = 120.0
    client_scan_interval_s: float = 10.0
    notify_timeout_s: float = 3.0  # a one-way NOTIFY to a slow client gives up after this
    flush_consumer_offset_interval_s: float = 5.0
    default_query_max_num: int = 32  # QUERY_MESSAGE with _UNIQUE_KEY_QUERY
    max_query_msg_num: int = 64  # QUERY_MESSAGE by key (Java maxMsgsNumBatch)

    # name server registration
    register_interval_s: float = 30.0  # registerNameServerPeriod
    register_timeout_s: float = 6.0

    # -- master/slave replication (docs/ha.md) ---------------------------------------
    #: ASYNC_MASTER (no wait), SYNC_MASTER (a send waits for a slave) or SLAVE.
    broker_role: str = "ASYNC_MASTER"
    #: Shared secret of the HA port (HMAC-SHA256 challenge both ways). Without it a
    #: master opens no HA port and a slave cannot start.
    ha_secret: str | None = field(default=None, repr=False)
    #: The master's HA listener (on `host`, loopback by default); None = the broker
    #: port + 1 (RocketMQ's default haListenPort), 0 = any free port.
    ha_listen_port: int | None = None
    #: SLAVE: the master's HA address, "host:port".
    ha_master_address: str | None = None
    #: SYNC_MASTER: how long a send waits for a slave (then FLUSH_SLAVE_TIMEOUT).
    sync_slave_timeout_s: float = 3.0
    #: Bytes per replication chunk (at least one whole record is always sent).
    ha_batch_bytes: int = 256 * 1024
    #: Master heartbeat when idle; a peer silent for ha_housekeeping_s is dropped.
    ha_heartbeat_s: float = 5.0
    ha_housekeeping_s: float = 20.0
    ha_handshake_timeout_s: float = 10.0
    ha_reconnect_s: float = 1.0
    #: Slaves one master streams to at once; more connections are closed.
    ha_max_slaves: int = 4
    #: SLAVE: how often topics and consumer offsets are pulled from the master.
    ha_config_sync_s: float = 10.0
    #: Failover (docs/ha.md): the HA controller "host:port" (a name server started with
    #: controller_enable). Then the controller picks the master among the brokers of a
    #: broker name (each with its own broker_id > 0; the master is listed as id 0);
    #: broker_role says ASYNC_MASTER or SYNC_MASTER for whichever one writes.
    controller_addr: str | None = None
    #: Heartbeat to the controller; each renews the master's write lease.
    controller_heartbeat_s: float = 1.0
    #: A slave further behind than this leaves the in-sync set (it can no longer be
    #: elected, and SYNC sends stop waiting for it).
    ha_max_gap_bytes: int = 64 * 1024 * 1024

    # delay levels, transactions, queue locks
    message_delay_level: str = DEFAULT_DELAY_LEVELS
    transaction_timeout_s: float = 6.0
    transaction_check_max: int = 15
    transaction_check_interval_s: float = 60.0
    lock_max_live_s: float = 60.0
    schedule_poll_interval_s: float = 5.0  # safety re-scan of the delay queues
    schedule_retry_interval_s: float = 1.0  # after a failed re-put of a due message
    timer_max_delay_s: int = 259_200  # furthest delivery time ahead (3 days); later: MESSAGE_ILLEGAL
    transaction_resolved_cache_size: int = 100_000  # decided transactions remembered

    # access control (docs/acl.md)
    acl_enable: bool = False  # aclEnable: every request is signed and checked
    acl_file: str | None = None  # the TOML ACL file (plain_acl.yml keys)
    # Credentials the broker signs its name-server requests with (REGISTER_BROKER needs
    # an admin account when the name server has ACL on).
    namesrv_access_key: str | None = None
    namesrv_secret_key: str | None = field(default=None, repr=False)
    # With ACL off, may TCP clients set INNER_* properties? (in-process peers always may;
    # a stand-alone `lmq mqtt` gateway without ACL needs this on).
    allow_inner_properties_without_acl: bool = False

    #: TLS towards the name servers (registration): on/off, CA file (None = system
    #: store), and whether to verify the certificate and host name.
    namesrv_tls: bool = False
    tls_ca_file: str | None = None
    tls_verify: bool = True

    # -- Apache-only strict mode (docs/stateless-gateways.md §5) ----------------------
    #: Refuse (REQUEST_CODE_NOT_SUPPORTED) every request code Apache RocketMQ 5 lacks,
    #: such as our private POP holder codes: proves a client would run against Apache.
    apache_strict: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.namesrv_addrs, str):
            self.namesrv_addrs = parse_addr_list(self.namesrv_addrs)
        if self.flush not in ("async", "sync"):
            raise ValueError(f"flush must be 'async' or 'sync', not {self.flush!r}")
        if self.broker_role not in ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE"):
            raise ValueError(f"broker_role must be ASYNC_MASTER, SYNC_MASTER or SLAVE, "
                             f"not {self.broker_role!r}")
        if self.controller_addr:
            if self.controller_heartbeat_s <= 0 or self.ha_max_gap_bytes <= 0:
                raise ValueError("controller_heartbeat_s and ha_max_gap_bytes must be > 0")
            if self.broker_role == "SLAVE" or self.broker_id <= 0 or not self.ha_secret:
                raise ValueError("with controller_addr every broker needs broker_id > 0, "
                                 "ha_secret and broker_role ASYNC_MASTER or SYNC_MASTER "
                                 "(the controller decides which one writes)")
        elif self.broker_role == "SLAVE":
            if self.broker_id <= 0:
                raise ValueError("a SLAVE needs broker_id > 0")
            if not self.ha_master_address or not self.ha_secret:
                raise ValueError("a SLAVE needs ha_master_address and ha_secret")
        elif self.broker_id != 0:
            raise ValueError("a master has broker_id 0")
        if self.broker_role == "SYNC_MASTER" and not self.ha_secret:
            raise ValueError("SYNC_MASTER needs ha_secret (no slave could connect)")

    @property
    def topic_auto_creation(self) -> bool:
        """autoCreateTopicEnable as resolved: either name, and on when neither is set."""
        if self.auto_create_topic_enable is not None:
            return self.auto_create_topic_enable
        return self.auto_create_topic is not False

    @property
    def advertised_ip(self) -> str:
        """The client-reachable IP: `advertise_host`, else `host` unless it is a wildcard."""
        if self.advertise_host:
            return resolve_ipv4(self.advertise_host)
        if self.host in ("", "0.0.0.0", "::"):
            return "127.0.0.1"
        return self.host

    @property
    def broker_addr(self) -> str:
        return f"{self.advertised_ip}:{self.port}"


@functools.lru_cache(maxsize=16)
def resolve_ipv4(host: str) -> str:
    """A host name as the IPv4 address clients reach. Stored records carry STOREHOST as a
    4-byte IPv4 address (docs/protocol.md §7.1) and the C++ consumer sends retries there, so a
    name (docker-compose service names) is resolved once here; an unresolvable name is
    kept for the routes and stored as 127.0.0.1."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def parse_addr_list(text: str) -> list[str]:
    """`"a:9876;b:9876"` -> ["a:9876", "b:9876"] (RocketMQ's `namesrvAddr` form)."""
    return [part.strip() for part in text.replace(",", ";").split(";") if part.strip()]


def load_toml(path: str) -> dict[str, Any]:
    """Read a TOML config file (keys = BrokerConfig / NamesrvConfig field names; optional
    `[broker]` and `[namesrv]` tables for keys meant for only one of them)."""
    with open(path, "rb") as fh:
        return tomllib.load(fh)


def config_kwargs(cls: type, data: dict[str, Any], section: str) -> dict[str, Any]:
    """Pick the keys of dataclass `cls` from a loaded TOML mapping: top-level keys that
    are fields of `cls`, then the `[section]` table (which must only hold fields of cls)."""
    names = {f.name for f in dataclasses.fields(cls)}
    out = {k: v for k, v in data.items() if k in names and not isinstance(v, dict)}
    table = data.get(section, {})
    if not isinstance(table, dict):
        raise ValueError(f"[{section}] must be a table")
    unknown = set(table) - names
    if unknown:
        raise ValueError(f"unknown keys in [{section}]: {', '.join(sorted(unknown))}")
    out.update(table)
    return out


def check_unknown_keys(data: dict[str, Any], classes: dict[str, type]) -> None:
    """Reject top-level keys that belong to none of `classes` (typos must not pass)."""
    known: set[str] = set(classes)
    for cls in classes.values():
        known |= {f.name for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in known]
    if unknown:
        raise ValueError(f"unknown config keys: {', '.join(sorted(unknown))}")
