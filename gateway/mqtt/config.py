"""`MqttConfig`: every setting and limit of the MQTT gateway, with documented defaults.

Loaded from a TOML file (`--mqtt-config`, keys = field names, optionally inside an
`[mqtt]` table) and overridden by command-line flags. Every limit here is enforced with
the protocol's own reason code (docs/mqtt.md lists which).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import tomllib
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MqttConfig", "host_is_loopback", "load_mqtt_config"]


@dataclass
class MqttConfig:
    """Settings of one MQTT gateway process."""

    # -- listeners ------------------------------------------------------------------
    #: Bind address of every listener: loopback unless told otherwise (as Mosquitto 2).
    host: str = "127.0.0.1"
    #: Plain TCP listener (MQTT's registered port); None disables it.
    port: int | None = 1883
    #: WebSocket listener (subprotocol "mqtt"); None disables it.
    ws_port: int | None = None
    #: Path served by the WebSocket listener ("" or "/" accepts any path).
    ws_path: str = "/mqtt"
    #: TLS listener (8883 is the registered port); needs certfile + keyfile.
    tls_port: int | None = None
    certfile: str | None = None
    keyfile: str | None = None

    # -- storage --------------------------------------------------------------------
    #: Gateway state (sessions, retained messages, name table): a RocksDB directory.
    data_dir: str = "./data/mqtt"
    #: Regular topic every MQTT publish is stored on (native consumers read it here).
    store_topic: str = "MQTT_MESSAGES"
    #: Queues of the store topic per broker; queue = crc32(MQTT topic) mod count.
    store_queues: int = 8
    #: Consumer group used for LMQ pulls (LMQ groups are broker-fabricated).
    pull_group: str = "%LMQ%mqtt_gateway"
    #: ACL credentials the gateway signs its broker and name-server requests with
    #: (docs/acl.md). Its account needs `innerProperties = true` (multi-dispatch into
    #: LMQs) and PUB|SUB on the store topic and the LMQs; both or neither.
    broker_access_key: str | None = None
    broker_secret_key: str | None = field(default=None, repr=False)
    #: Messages per LMQ pull.
    pull_batch: int = 32
    #: Pulls of `pull_batch` entries kept in flight ahead of the slowest reader of an LMQ
    #: that other gateways write, while its readers are behind (gateway/mqtt/lmq_watch.py;
    #: bounded by half the recent entries of one LMQ). 0: no read-ahead.
    readahead_pulls: int = 16
    #: Session offsets / in-flight state written behind at this period (a kill -9 can
    #: re-deliver at most this much at QoS >= 1; clean shutdown writes everything).
    state_flush_interval_s: float = 0.5
    #: A persistent session that fell further behind on one filter than this many messages
    #: skips to (newest - max_session_lag) when it reconnects; the gap is logged.
    max_session_lag: int = 100_000

    # -- connection limits ------------------------------------------------------------
    #: Open sockets, counted from accept (a socket that has not sent CONNECT yet counts):
    #: one more is closed at once, as Mosquitto's max_connections does.
    max_connections: int = 100_000
    #: Largest packet accepted (fixed header included); advertised in CONNACK (v5), 0x95.
    max_packet_size: int = 1024 * 1024
    #: Seconds a TCP connection may take to send CONNECT.
    connect_timeout_s: float = 10.0
    #: Seconds a control packet may take to arrive once its first byte did (keep alive
    #: or not; DISCONNECT 0x8D). A max_packet_size (1 MiB) packet needs ~33 s at
    #: 256 kbit/s, so 60 s leaves slow links room while a stalled half-sent packet holds
    #: its buffer (at most max_packet_size) for a minute, not for ever.
    packet_read_timeout_s: float = 60.0
    #: Bytes of incomplete packets buffered across all connections (each holds at most
    #: max_packet_size). While the others hold more than this, a connection with an
    #: incomplete packet is not read (TCP back pressure; its packet_read_timeout_s keeps
    #: running), so half-sent packets cannot pile up memory. 64 MiB: 64 max-size
    #: packets arriving at the same time.
    max_partial_packet_bytes: int = 64 * 1024 * 1024
    #: Lingering close after a DISCONNECT / refusing CONNACK: input is read and dropped
    #: for at most this long and this many bytes before the socket closes, so the client
    #: reads the reason instead of a connection reset.
    close_linger_s: float = 2.0
    close_linger_bytes: int = 1024 * 1024
    #: Keep alive granted at most (v5 Server Keep Alive; 0 = accept the client's value).
    max_keepalive: int = 0
    #: Receive Maximum we advertise: unacknowledged QoS 1/2 PUBLISHes a client may send
    #: (exceeding it: DISCONNECT 0x93).
    receive_maximum: int = 1024
    #: QoS >= 1 messages in flight towards a client at most (also bounded by the
    #: client's Receive Maximum). Mosquitto's max_inflight_messages is 20.
    max_inflight_out: int = 64
    #: Bytes queued for a socket before delivery pauses (back pressure on slow readers);
    #: reading from the client pauses too while that much waits behind a stuck write.
    max_out_buffer: int = 256 * 1024
    #: Topic Alias Maximum we accept from clients (0 = aliases refused).
    topic_alias_maximum: int = 64
    #: Topic name / filter limits (PUBACK 0x90 / SUBACK 0x8F, DISCONNECT for 3.1.1).
    max_topic_length: int = 4096
    max_topic_levels: int = 128
    #: Subscriptions one session may hold (SUBACK 0x97 Quota exceeded / 3.1.1 0x80).
    max_subscriptions_per_client: int = 1000
    #: Longest client identifier accepted (3.1.1 allows servers to refuse long ids).
    max_client_id_length: int = 256
    #: Session Expiry Interval granted at most, seconds (v5; also the lifetime of a
    #: 3.1.1 persistent session, as Mosquitto's persistent_client_expiration); None =
    #: sessions may live for ever. 7 days: an offline session keeps its filters live
    #: (every matching publish is indexed for it), so an abandoned client id must not
    #: cost that for ever.
    max_session_expiry_s: int | None = 7 * 86400
    #: Persistent sessions stored at most (connected or not). A CONNECT that would create
    #: one more is refused (v5 CONNACK 0x97 Quota exceeded, 3.1.1 0x03 Server
    #: unavailable); resuming an existing one always works. Refused rather than evicting
    #: the oldest: eviction would let anyone with many client ids wipe real sessions.
    max_stored_sessions: int = 100_000
    #: Largest QoS granted to subscriptions and accepted on publish (0, 1 or 2).
    maximum_qos: int = 2
    #: Retained messages kept at most (a new topic over it: PUBACK 0x97, dropped).
    max_retained: int = 100_000
    #: Publishes queued towards the broker across the gateway before readers pause.
    max_pending_publishes: int = 10_000
    #: Payload bytes of those queued publishes before readers pause (a queue bounded by
    #: count alone would hold 10 000 x max_packet_size).
    max_pending_bytes: int = 16 * 1024 * 1024
    #: Payload bytes of stored messages kept in memory for the readers of all LMQs (their
    #: recent entries); past it the LMQ written longest ago gives up its entries first and
    #: readers behind pull.
    max_recent_bytes: int = 64 * 1024 * 1024

    # -- security -------------------------------------------------------------------
    #: Connections without user name: None (default) = allowed only when `host` is a
    #: loopback address (Mosquitto 2's local-only default); True = allowed on any
    #: address (a warning is logged at start when `host` is not loopback); False =
    #: refused (CONNACK 0x87 / 3.1.1 0x05).
    allow_anonymous: bool | None = None
    #: Password checks (scrypt, ~40 ms of CPU each) run in worker threads, at most this
    #: many at once; more CONNECTs wait their turn, nothing else does.
    password_check_threads: int = 2
    #: Password file written by `lmq mqtt passwd` (scrypt hashes); None = no passwords.
    password_file: str | None = None
    #: ACL file (see docs/mqtt.md); None = everything allowed.
    acl_file: str | None = None

    # -- $SYS ------------------------------------------------------------------------
    #: Period of the $SYS/broker/... statistics publishes; 0 disables them.
    sys_interval_s: float = 10.0

    # -- overload (docs/mqtt.md, "Overload") -------------------------------------------
    #: An online subscriber that takes what it is given may fall this many messages behind
    #: the newest stored before the gateway stops reading from publishing sockets (TCP
    #: then slows the devices down).
    backpressure_lag: int = 2000
    #: QoS 0 messages queued for one client at most (Mosquitto: max_queued_messages); a
    #: client further behind on a QoS 0 subscription skips to the newest this many,
    #: counted in $SYS/broker/messages/dropped and logged once per episode.
    max_queued_messages: int = 20_000
    #: Collect once and move every object alive after start-up (modules, code, tables)
    #: out of the garbage collector's reach (`gc.freeze()`): later collections no longer
    #: scan them. Process-wide: leave it off when the gateway is embedded in a process
    #: whose own objects must stay collectable (tests).
    gc_freeze_at_start: bool = True

    # -- retained messages on SUBSCRIBE (docs/mqtt.md, "Retained messages") -------------
    #: Retained messages sent at most to one new subscription (one filter of a
    #: SUBSCRIBE); the rest are not sent and the cut is logged. Bounds the memory and
    #: loop time a `#` subscription over a big retained table can take.
    max_retained_per_subscription: int = 10_000

    # -- server --------------------------------------------------------------------------
    #: Seconds between checks for expired offline sessions and due will messages.
    expiry_check_interval_s: float = 1.0

    # -- several gateways (docs/stateless-gateways.md, "Abandoned state") ----------------
    #: A gateway out of the route log's member group this long has vanished: its
    #: clean-session routes are swept and its persistent sessions expire by their interval.
    gateway_orphan_timeout_s: float = 300.0
    #: How often each gateway looks for vanished gateways.
    gateway_sweep_interval_s: float = 30.0

    def anonymous_allowed(self) -> bool:
        """`allow_anonymous` resolved (None: only on a loopback `host`)."""
        if self.allow_anonymous is not None:
            return self.allow_anonymous
        return host_is_loopback(self.host)

    def __post_init__(self) -> None:
        if self.maximum_qos not in (0, 1, 2):
            raise ValueError("maximum_qos must be 0, 1 or 2")
        if not 1 <= self.receive_maximum <= 65535:
            raise ValueError("receive_maximum must be 1..65535")
        if not 1 <= self.max_inflight_out <= 65535:
            raise ValueError("max_inflight_out must be 1..65535")
        if not 0 <= self.topic_alias_maximum <= 65535:
            raise ValueError("topic_alias_maximum must be 0..65535")
        if not 16 <= self.max_packet_size <= 268_435_460:
            raise ValueError("max_packet_size must be 16..268435460")
        if self.gateway_orphan_timeout_s <= 0 or self.gateway_sweep_interval_s <= 0:
            raise ValueError("gateway_orphan_timeout_s and gateway_sweep_interval_s must be"
                             " positive")
        if self.packet_read_timeout_s <= 0 or self.close_linger_s < 0:
            raise ValueError("packet_read_timeout_s must be positive, close_linger_s >= 0")
        if self.readahead_pulls < 0:
            raise ValueError("readahead_pulls must be >= 0")
        if self.store_queues < 1 or self.pull_batch < 1:
            raise ValueError("store_queues and pull_batch must be positive")
        if self.tls_port is not None and not (self.certfile and self.keyfile):
            raise ValueError("tls_port needs certfile and keyfile")
        for name in ("max_connections", "max_topic_length", "max_topic_levels",
                     "max_subscriptions_per_client", "max_client_id_length", "max_retained",
                     "max_pending_publishes", "max_out_buffer", "max_session_lag",
                     "password_check_threads", "max_stored_sessions", "close_linger_bytes",
                     "max_partial_packet_bytes", "backpressure_lag", "max_queued_messages",
                     "max_retained_per_subscription", "max_pending_bytes", "max_recent_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")


def host_is_loopback(host: str) -> bool:
    """Is `host` (a bind address or name) loopback only? ("" and 0.0.0.0 are not.)"""
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_mqtt_config(path: str | None, overrides: dict[str, Any] | None = None) -> MqttConfig:
    """Defaults < TOML file < `overrides` (None values in overrides are ignored)."""
    kwargs: dict[str, Any] = {}
    if path:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
        table = data.get("mqtt", data)
        if not isinstance(table, dict):
            raise ValueError("[mqtt] must be a table")
        kwargs.update(table)
    kwargs.update({k: v for k, v in (overrides or {}).items() if v is not None})
    names = {f.name for f in dataclasses.fields(MqttConfig)}
    unknown = set(kwargs) - names
    if unknown:
        raise ValueError(f"unknown MQTT config keys: {', '.join(sorted(unknown))}")
    return MqttConfig(**kwargs)
