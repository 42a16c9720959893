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
