"""Name server configuration."""

from __future__ import annotations

from dataclasses import dataclass

from core.remoting.codec import DEFAULT_MAX_FRAME_SIZE
from core.remoting.listener_config import RemotingListenerConfig


@dataclass
class NamesrvConfig(RemotingListenerConfig):
    """Settings of one name server; defaults are RocketMQ 4.9.7's (docs/protocol.md §9.6)."""

    host: str = "127.0.0.1"  # loopback unless told otherwise (docs/remoting.md)
    port: int = 9876
    #: A broker that has not registered for this long is dropped (Java: 120 s).
    broker_expiry_s: float = 120.0
    #: How often the expiry scan runs (Java: every 10 s).
    scan_interval_s: float = 10.0
    #: Fill `orderTopicConf` of routes from the ORDER_TOPIC_CONFIG KV namespace
    #: (Java's `orderMessageEnable`, default false).
    order_message_enable: bool = False
    #: Largest inflated compressed REGISTER_BROKER body (zip-bomb guard). The compressed
    #: form spends ~20 + name bytes per topic (at most ~150 B with a 127-byte name), so
    #: 4 MiB holds 28k+ topics, typically 60k; a broker with more sends plain JSON, which
    #: the 16 MiB frame limit bounds. (Was 64 MiB: one bomb cost ~130 MB and 250 ms.)
    max_register_body_bytes: int = 4 * 1024 * 1024
    #: Largest accepted remoting frame.
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    #: Check every request against the ACL file (docs/acl.md); write codes need admin.
    acl_enable: bool = False
    #: The TOML ACL file (plain_acl.yml keys).
    acl_file: str | None = None

    # -- HA controller (docs/ha.md, "Failover"): on in one name server only ------------
    #: Elect and fence masters for replicated broker names.
    controller_enable: bool = False
    #: Where the controller keeps epochs, masters and in-sync sets (fsynced JSON).
    controller_dir: str = "./data/controller"
    #: A master's write lease, renewed by each of its heartbeats.
    controller_lease_s: float = 3.0
    #: Extra wait after a lease runs out before a new master is elected (clock rates,
    #: scheduling): the old master has certainly stopped writing by then.
    controller_lease_margin_s: float = 1.0
    #: How often the controller looks for masters whose lease ran out.
    controller_check_s: float = 0.2
    #: Broker names one controller tracks (heartbeats of more are refused).
    controller_max_broker_names: int = 1024
