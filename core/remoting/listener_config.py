"""`RemotingListenerConfig`: the settings every remoting listener (broker, name server)
shares: exposure, TLS and the limits that keep one peer from exhausting the port
(docs/remoting.md). BrokerConfig and NamesrvConfig inherit them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RemotingListenerConfig"]


@dataclass
class RemotingListenerConfig:
    """Exposure, TLS and limits of one remoting listener (docs/remoting.md)."""

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
