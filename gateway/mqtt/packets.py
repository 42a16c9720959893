"""MQTT control packets (3.1, 3.1.1, 5.0) as small immutable values.

One dataclass per control packet type, shared by all protocol versions: fields that a
version does not carry on the wire keep their default there (v3.x packets have no
properties, a v3.x PUBACK has no reason code, ...). The codec (`codec.py`) turns bytes
into these values and back; nothing here touches the wire format.

Also here, because every other module of the package needs them: the v5 reason codes,
the v3.1.1 CONNACK return codes, the `Properties` container for v5 properties (their wire
format lives in `properties.py`) and the error types.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

__all__ = [
    "PROTOCOL_NAMES",
    "NO_PROPERTIES",
    "PINGREQ",
    "PINGRESP",
    "Auth",
    "Connack",
    "ConnackReturnCode",
    "Connect",
    "ConnectRejected",
    "Disconnect",
    "MqttProtocolError",
    "Packet",
    "PacketTooLarge",
    "PacketType",
    "Pingreq",
    "Pingresp",
    "Properties",
    "ProtocolVersion",
    "Puback",
    "Pubcomp",
    "Publish",
    "Pubrec",
    "Pubrel",
    "ReasonCode",
    "Suback",
    "Subscribe",
    "Subscription",
    "Unsuback",
    "Unsubscribe",
    "V3_SUBACK_FAILURE",
    "VALID_REASON_CODES",
    "Will",
    "v3_connack_return_code",
]


class ProtocolVersion(IntEnum):
    """The CONNECT "Protocol Level" byte."""

    V31 = 3  # protocol name "MQIsdp"
    V311 = 4  # protocol name "MQTT"
    V5 = 5  # protocol name "MQTT"


#: Protocol name sent in CONNECT for each level (3.1 used "MQIsdp", later versions "MQTT").
PROTOCOL_NAMES: dict[int, str] = {3: "MQIsdp", 4: "MQTT", 5: "MQTT"}


class PacketType(IntEnum):
    """Control packet type: the high nibble of the fixed header's first byte."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15  # v5 only; reserved in 3.1.1


class ReasonCode(IntEnum):
    """Every MQTT 5.0 reason code (spec §2.4). Values below 0x80 mean success."""

    SUCCESS = 0x00
    NORMAL_DISCONNECTION = 0x00
    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


class ConnackReturnCode(IntEnum):
    """CONNACK return codes of MQTT 3.1 / 3.1.1 (3.1.1 §3.2.2.3)."""

    ACCEPTED = 0
    UNACCEPTABLE_PROTOCOL_VERSION = 1
    IDENTIFIER_REJECTED = 2
    SERVER_UNAVAILABLE = 3
    BAD_USER_NAME_OR_PASSWORD = 4
    NOT_AUTHORIZED = 5


#: v3.1.1 SUBACK return code for a refused subscription (3.1.1 §3.9.3).
V3_SUBACK_FAILURE = 0x80

#: v5 reason codes each packet type may carry (§3.2.2.2, §3.4.2.1 ... §3.15.2.1). A
#: code outside its set parses but is not allowed: a Protocol Error.
VALID_REASON_CODES: dict[int, frozenset[int]] = {
    PacketType.CONNACK: frozenset(
        {0x00, *range(0x80, 0x8B), 0x8C, 0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F}
    ),
    PacketType.PUBACK: frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99}),
    PacketType.PUBREC: frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99}),
    PacketType.PUBREL: frozenset({0x00, 0x92}),
    PacketType.PUBCOMP: frozenset({0x00, 0x92}),
    PacketType.SUBACK: frozenset(
        {0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2}
    ),
    PacketType.UNSUBACK: frozenset({0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91}),
    PacketType.DISCONNECT: frozenset(
        {
            0x00,
            0x04,
            0x80,
            0x81,
            0x82,
            0x83,
            0x87,
            0x89,
            0x8B,
            *range(0x8D, 0x91),
            *range(0x93, 0xA3),
        }
    ),
    PacketType.AUTH: frozenset({0x00, 0x18, 0x19}),
}

_V5_TO_V3_CONNACK = {
    ReasonCode.SUCCESS: ConnackReturnCode.ACCEPTED,
    ReasonCode.UNSUPPORTED_PROTOCOL_VERSION: ConnackReturnCode.UNACCEPTABLE_PROTOCOL_VERSION,
    ReasonCode.CLIENT_IDENTIFIER_NOT_VALID: ConnackReturnCode.IDENTIFIER_REJECTED,
    ReasonCode.BAD_USER_NAME_OR_PASSWORD: ConnackReturnCode.BAD_USER_NAME_OR_PASSWORD,
    ReasonCode.BAD_AUTHENTICATION_METHOD: ConnackReturnCode.BAD_USER_NAME_OR_PASSWORD,
    ReasonCode.NOT_AUTHORIZED: ConnackReturnCode.NOT_AUTHORIZED,
    ReasonCode.BANNED: ConnackReturnCode.NOT_AUTHORIZED,
}


def v3_connack_return_code(reason: int) -> ConnackReturnCode:
    """Map a v5 CONNACK reason code to the closest 3.1.1 return code.

    Lets the server decide in v5 terms once; anything without a 3.1.1 equivalent
    (busy, quota, ...) becomes "server unavailable", as Mosquitto and HiveMQ do.
    """
    return _V5_TO_V3_CONNACK.get(reason, ConnackReturnCode.SERVER_UNAVAILABLE)  # type: ignore[call-overload]


class MqttProtocolError(Exception):
    """The peer broke the protocol: the connection must be closed.

    `reason_code` is the v5 reason code that names the fault (0x81 malformed packet,
    0x82 protocol error, 0x95 packet too large, 0x94 topic alias invalid, ...); a v5
    server may send it in a DISCONNECT (or a CONNACK while the CONNECT is being read)
    before closing, a v3.x server just closes (3.1.1 §4.8).
    `packets` holds whatever the same `feed()` call decoded before the fault, in order.
    """

    def __init__(self, reason_code: int, message: str) -> None:
        super().__init__(f"{message} (reason code 0x{reason_code:02X})")
        self.reason_code = ReasonCode(reason_code)
        self.message = message
        self.packets: list[Packet] = []


class ConnectRejected(MqttProtocolError):
    """A CONNECT that the server MUST answer with a refusing CONNACK before closing.

    Raised for an unsupported protocol name or level (3.1.1 MQTT-3.1.2-2, 5.0
    MQTT-3.1.2-2: return code 1 / reason 0x84) and a rejected client identifier (3.1.1
    MQTT-3.1.3-9, 3.1 "identifier rejected": return code 2 / reason 0x85). `connack`
    is ready to send; encode it with `protocol_version` (the codec is already set to it).
    """

    def __init__(self, reason_code: int, message: str, protocol_version: int) -> None:
        super().__init__(reason_code, message)
        self.protocol_version = protocol_version
        code = reason_code if protocol_version == 5 else v3_connack_return_code(reason_code)
        self.connack = Connack(session_present=False, reason_code=int(code))


class PacketTooLarge(ValueError):
    """An outbound packet exceeds the peer's Maximum Packet Size (5.0 §3.1.2.11.4).

    Not a protocol error of the peer: the sender MUST discard the packet and behave as if
    it had been sent (MQTT-3.1.2-25).
    """

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"packet of {size} bytes exceeds the peer's maximum of {limit}")
        self.size = size
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Properties:
    """MQTT 5.0 properties of one packet (or of a Will), spec §2.2.2.2.

    A field left at None is absent. `user_properties` keeps order and repeats;
    `subscription_identifiers` repeats only in a server-to-client PUBLISH. Which
    properties a packet may carry is checked by `properties.py` on decode and encode.
    """

    payload_format_indicator: int | None = None  # 0x01
    message_expiry_interval: int | None = None  # 0x02
    content_type: str | None = None  # 0x03
    response_topic: str | None = None  # 0x08
    correlation_data: bytes | None = None  # 0x09
    subscription_identifiers: tuple[int, ...] = ()  # 0x0B
    session_expiry_interval: int | None = None  # 0x11
    assigned_client_identifier: str | None = None  # 0x12
    server_keep_alive: int | None = None  # 0x13
    authentication_method: str | None = None  # 0x15
    authentication_data: bytes | None = None  # 0x16
    request_problem_information: int | None = None  # 0x17
    will_delay_interval: int | None = None  # 0x18
    request_response_information: int | None = None  # 0x19
    response_information: str | None = None  # 0x1A
    server_reference: str | None = None  # 0x1C
    reason_string: str | None = None  # 0x1F
    receive_maximum: int | None = None  # 0x21
    topic_alias_maximum: int | None = None  # 0x22
    topic_alias: int | None = None  # 0x23
    maximum_qos: int | None = None  # 0x24
    retain_available: int | None = None  # 0x25
    user_properties: tuple[tuple[str, str], ...] = ()  # 0x26
    maximum_packet_size: int | None = None  # 0x27
    wildcard_subscription_available: int | None = None  # 0x28
    subscription_identifier_available: int | None = None  # 0x29
    shared_subscription_available: int | None = None  # 0x2A

    def __repr__(self) -> str:
        # Only the properties present: a full repr of 27 fields buries them.
        shown = []
        for name in self.__slots__:
            value = getattr(self, name)
            if value is not None and value != ():
                shown.append(f"{name}={value!r}")
        return f"Properties({', '.join(shown)})"


#: The shared empty property set; packets default to it (cheap identity test on encode).
NO_PROPERTIES = Properties()


@dataclass(frozen=True, slots=True)
class Will:
    """The Will Message carried in a CONNECT (5.0 §3.1.3.2-3.1.3.4)."""

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Connect:
    """CONNECT. `protocol_version` 3 (MQIsdp), 4 or 5; `password` is binary data."""

    client_id: str = ""
    protocol_version: int = 4
    clean_start: bool = True
    keepalive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Connack:
    """CONNACK. `reason_code` is a v5 `ReasonCode`, or a `ConnackReturnCode` in v3.x."""

    session_present: bool = False
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Publish:
    """PUBLISH. `packet_id` is None for QoS 0 and 1..65535 otherwise.

    On decode in v5 a Topic Alias is already resolved by the codec: `topic` is the full
    topic name and `properties.topic_alias` still shows the alias the peer used.
    """

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Puback:
    """PUBACK (QoS 1 acknowledgement). v3.x carries only the packet id."""

    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Pubrec:
    """PUBREC (QoS 2, step 1)."""

    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Pubrel:
    """PUBREL (QoS 2, step 2)."""

    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Pubcomp:
    """PUBCOMP (QoS 2, step 3)."""

    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Subscription:
    """One topic filter of a SUBSCRIBE with its options (5.0 §3.8.3.1).

    `no_local`, `retain_as_published` and `retain_handling` exist only in v5; in v3.x
    the options byte is just the requested QoS.
    """

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(frozen=True, slots=True)
class Subscribe:
    """SUBSCRIBE: one or more subscriptions."""

    packet_id: int
    subscriptions: tuple[Subscription, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Suback:
    """SUBACK: one reason code (v3.x: granted QoS or 0x80) per subscription, in order."""

    packet_id: int
    reason_codes: tuple[int, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """UNSUBSCRIBE: one or more topic filters."""

    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Unsuback:
    """UNSUBACK. v5 has one reason code per filter; v3.x has none (keep it empty)."""

    packet_id: int
    reason_codes: tuple[int, ...] = ()
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Pingreq:
    """PINGREQ (no fields; use the `PINGREQ` singleton)."""


@dataclass(frozen=True, slots=True)
class Pingresp:
    """PINGRESP (no fields; use the `PINGRESP` singleton)."""


PINGREQ = Pingreq()
PINGRESP = Pingresp()


@dataclass(frozen=True, slots=True)
class Disconnect:
    """DISCONNECT. v3.x has no reason code and is only sent by the client."""

    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Auth:
    """AUTH (v5 only): enhanced authentication exchange (5.0 §4.12)."""

    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


Packet = (
    Connect
    | Connack
    | Publish
    | Puback
    | Pubrec
    | Pubrel
    | Pubcomp
    | Subscribe
    | Suback
    | Unsubscribe
    | Unsuback
    | Pingreq
    | Pingresp
    | Disconnect
    | Auth
)
