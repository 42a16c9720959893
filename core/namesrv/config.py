"""Name server configuration."""

from __future__ import annotations

from dataclasses import dataclass

from core.remoting.codec import DEFAULT_MAX_FRAME_SIZE


@dataclass
class NamesrvConfig:
    """Settings of one name server; defaults are RocketMQ 4.9.7's (protocol doc §9.6)."""

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


    # -- remoting listener: exposure, TLS, limits (docs/remoting.md) ----------------
    #: Serve on a non-loopback host with ACL off (refused otherwise); logs a warning.
    allow_unauthenticated_remote: bool = False
    #: TLS on this port when both are set (PEM certificate chain and private key).
    tls_certfile: str | None = None
    tls_keyfile: str | None = None
    #: Open connections on this port / from one source address; more are closed at once.
    max_connections: int = 10_000
    max_connections_per_address: int = 1_000
    #: Descriptors kept free for the store: accept stops at RLIMIT_NOFILE minus this.
    fd_reserve: int = 1_024
    #: Bytes of partly received frames buffered for all peers of this port together;
    #: the peer whose partial frame grows past it is closed.
    max_pending_frame_bytes: int = 512 * 1024 * 1024
    #: Close a connection silent (nothing read or written, no request running) this long
    #: (Java's serverChannelMaxIdleTimeSeconds is 120).
    idle_timeout_s: float = 120.0
    #: Seconds a frame may take from its first byte to the end of its header, and from
    #: there to its last body byte (slow or stalled senders are cut off).
    frame_header_timeout_s: float = 10.0
    frame_body_timeout_s: float = 60.0
