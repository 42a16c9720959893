"""Settings of a client instance (the part shared by all producers and consumers of it).

Defaults follow the Java 4.x client (docs/protocol.md §8.7): route polling and heartbeats every
30 s, consumer offsets persisted every 5 s, rebalance every 20 s.
"""

from __future__ import annotations

import itertools
import os
import socket
from dataclasses import dataclass, field

_instance_seq = itertools.count(1)


def parse_namesrv_addr(value: str | list[str] | tuple[str, ...]) -> list[str]:
    """`"a:9876;b:9876"` (RocketMQ's namesrvAddr form, commas also accepted) -> list."""
    if isinstance(value, str):
        parts = value.replace(",", ";").split(";")
    else:
        parts = list(value)
    out = [p.strip() for p in parts if p and p.strip()]
    if not out:
        raise ValueError("at least one name server address is required")
    for addr in out:
        host, sep, port = addr.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"bad name server address {addr!r}, expected host:port")
    return out


def local_ip_towards(addr: str) -> str:
    """The local IPv4 address used to reach `addr` (a UDP connect sends no packet)."""
    host, _, port = addr.rpartition(":")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host.strip("[]"), int(port)))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


@dataclass
class ClientConfig:
    """Settings of one `ClientInstance`."""

    #: Name servers, "host:port;host:port" or a list.
    namesrv_addr: str | list[str] = "127.0.0.1:9876"
    #: Instance name, the part after "@" of the client id. None = unique per instance
    #: ("<pid>#<n>"), so two instances in one process are two group members, as Java's
    #: default instance name (pid + nanoTime) makes them.
    instance_name: str | None = None
    #: IP put in the client id and UNIQ_KEY ids; None = the address towards the name server.
    client_ip: str | None = None
    #: Default timeout of one request (Java sendMsgTimeout / RPC timeout: 3 s).
    request_timeout: float = 3.0
    #: Route refresh from the name servers (pollNameServerInterval, 30 s).
    poll_namesrv_interval: float = 30.0
    #: Heartbeat to every master broker (heartbeatBrokerInterval, 30 s).
    heartbeat_interval: float = 30.0
    #: Consumer offsets persisted every (persistConsumerOffsetInterval, 5 s).
    persist_offset_interval: float = 5.0
    #: Periodic rebalance (rocketmq.client.rebalance.waitInterval, 20 s).
    rebalance_interval: float = 20.0
    #: Directory of broadcasting consumers' local offset files.
    offset_store_dir: str = field(
        default_factory=lambda: os.path.join(os.path.expanduser("~"), ".lmq_offsets")
    )
    #: `language` of our request headers (docs/protocol.md §1.2).
    language: str = "PYTHON"
    #: ACL credentials (docs/acl.md): when set, every request is signed as RocketMQ's
    #: AclClientRPCHook signs it. Both or neither.
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)

    # -- TLS to name servers and brokers (docs/remoting.md) ---------------------------
    #: Connect over TLS; `tls_ca_file` (PEM) is trusted instead of the system store;
    #: `tls_verify=False` encrypts without checking certificates (test setups only).
    tls: bool = False
    tls_ca_file: str | None = None
    tls_verify: bool = True

    def __post_init__(self) -> None:
        self.namesrv_addrs = parse_namesrv_addr(self.namesrv_addr)
        if self.instance_name is None:
            self.instance_name = f"{os.getpid()}#{next(_instance_seq)}"
        if self.client_ip is None:
            self.client_ip = local_ip_towards(self.namesrv_addrs[0])
        for name in (
            "request_timeout",
            "poll_namesrv_interval",
            "heartbeat_interval",
            "persist_offset_interval",
            "rebalance_interval",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")

    @property
    def client_id(self) -> str:
        """Java 4.9 form `<ip>@<instanceName>` (docs/protocol.md §6.2); opaque to brokers."""
        return f"{self.client_ip}@{self.instance_name}"
