"""Sans-IO MQTT codec: bytes in -> packets out, packets in -> bytes out.

`MqttCodec` knows nothing of sockets (h11 style). A server-side codec learns the
protocol version from the first packet, which must be CONNECT, and uses it from then on;
a client-side codec (role="client") is given the version, or learns it from the CONNECT
it encodes.

Fixed header (§2.1): byte 0 = packet type << 4 | flags, then the Remaining Length as a
Variable Byte Integer of at most four bytes. The total size (fixed header + remaining
length) is checked against `max_packet_size` as soon as the fixed header is complete, so
an oversized packet is refused (0x95) before a byte of its body is buffered.

Faults raise `MqttProtocolError` with the v5 reason code that names them:
0x81 Malformed Packet (cannot be parsed: truncated, bad UTF-8, reserved bits, QoS 3,
wildcard in a topic name, packet id 0 ...), 0x82 Protocol Error (parsed, but not allowed:
a second CONNECT, a first packet that is not CONNECT, a repeated property ...), 0x94
Topic Alias invalid, 0x95 Packet too large; `ConnectRejected` for the CONNECT faults
that must be answered with a refusing CONNACK. After a fault the codec stays failed;
`error_reply()` says what (if anything) to send before closing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal

from gateway.mqtt._encoding import encode_packet, publish_size
from gateway.mqtt.packets import (
    NO_PROPERTIES,
    PINGREQ,
    PINGRESP,
    VALID_REASON_CODES,
    Auth,
    Connack,
    Connect,
    ConnectRejected,
    Disconnect,
    MqttProtocolError,
    Packet,
    PacketTooLarge,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from gateway.mqtt.properties import WILL, decode_binary, decode_properties, decode_string
from gateway.mqtt.publish_run import PubackRun, PublishRun, scan_pubacks, scan_publishes
from gateway.mqtt.topics import parse_shared_subscription, validate_topic_filter

__all__ = ["DEFAULT_MAX_PACKET_SIZE", "MqttCodec", "MqttProtocolError", "ConnectRejected",
           "PublishRun"]

#: Default inbound limit: EMQX also defaults to 1 MB (Mosquitto and HiveMQ default to the
#: 256 MB protocol maximum, too much to buffer per connection on a gateway).
DEFAULT_MAX_PACKET_SIZE = 1024 * 1024
#: Protocol maximum: 1 header byte + 4 length bytes + 268,435,455 (§2.1.4).
PROTOCOL_MAX_PACKET_SIZE = 1 + 4 + 268_435_455

# Packet types (ints, to index tables without enum overhead on the hot path).
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ_T, PINGRESP_T, DISCONNECT, AUTH = range(8, 16)

_BOTH_WAYS = {PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, DISCONNECT, AUTH}
_SERVER_RECEIVES = frozenset({CONNECT, SUBSCRIBE, UNSUBSCRIBE, PINGREQ_T, *_BOTH_WAYS})
_CLIENT_RECEIVES = frozenset({CONNACK, SUBACK, UNSUBACK, PINGRESP_T, *_BOTH_WAYS})
_SUPPORTED = {("MQIsdp", 3), ("MQTT", 4), ("MQTT", 5)}

_CONNACK_CODES = VALID_REASON_CODES[CONNACK]
_SUBACK_CODES = VALID_REASON_CODES[SUBACK]
_UNSUBACK_CODES = VALID_REASON_CODES[UNSUBACK]
_DISCONNECT_CODES = VALID_REASON_CODES[DISCONNECT]
_AUTH_CODES = VALID_REASON_CODES[AUTH]
_V3_SUBACK_CODES = frozenset({0, 1, 2, 0x80})
_ACK_CLASSES: dict[int, Any] = {PUBACK: Puback, PUBREC: Pubrec, PUBREL: Pubrel, PUBCOMP: Pubcomp}


def _malformed(message: str) -> MqttProtocolError:
    return MqttProtocolError(0x81, message)


def _protocol_error(message: str) -> MqttProtocolError:
    return MqttProtocolError(0x82, message)


class MqttCodec:
    """Sans-IO MQTT 3.1 / 3.1.1 / 5.0 packet codec for one connection.

    `feed(data)` returns the complete packets in `data` (plus what was buffered);
    `encode(packet)` returns wire bytes for the connection's protocol version.

    Attributes a server may set or read between calls:
    `max_packet_size` (inbound limit, advertise it in CONNACK), `topic_alias_maximum`
    (inbound aliases accepted, advertise it in CONNACK; 0 = none), `protocol_version`,
    `peer_max_packet_size` (learned from CONNECT / CONNACK; `encode` respects it).
    """

    __slots__ = (
        "max_packet_size",
        "protocol_version",
        "topic_alias_maximum",
        "peer_max_packet_size",
        "_role",
        "_receives",
        "_connected",
        "_buf",
        "_failed",
        "_aliases",
        "publish_runs",
    )

    def __init__(
        self,
        max_packet_size: int = DEFAULT_MAX_PACKET_SIZE,
        protocol_version: int | None = None,
        *,
        role: Literal["server", "client"] = "server",
        topic_alias_maximum: int = 0,
    ) -> None:
        if not 2 <= max_packet_size <= PROTOCOL_MAX_PACKET_SIZE:
            raise ValueError("max_packet_size out of range")
        if protocol_version not in (None, 3, 4, 5):
            raise ValueError("protocol_version must be 3, 4, 5 or None")
        if role not in ("server", "client"):
            raise ValueError("role must be 'server' or 'client'")
        self.max_packet_size = max_packet_size
        self.protocol_version = protocol_version
        self.topic_alias_maximum = topic_alias_maximum
        self.peer_max_packet_size: int | None = None
        self._role = role
        self._receives = _SERVER_RECEIVES if role == "server" else _CLIENT_RECEIVES
        # A server given the version up front has had its CONNECT handled elsewhere.
        self._connected = protocol_version is not None
        self._buf = bytearray()
        self._failed: MqttProtocolError | None = None
        self._aliases: dict[int, str] = {}
        #: feed gives PublishRun lists for 3.x PUBLISHes (server role, C extension built)
        self.publish_runs = False

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete packet."""
        return len(self._buf)

    # -- decoding ------------------------------------------------------------------------

    def feed(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        """Consume received bytes; return every packet they complete, in order.

        Raises `MqttProtocolError` (its `packets` holds the packets completed before the
        fault); once it has raised, every later call raises the same error.
        """
        if self._failed is not None:
            raise self._failed
        buf = self._buf
        if buf or type(data) is not bytes:
            buf += data  # copy: the caller may reuse a bytearray / memoryview
            src: bytes | bytearray = buf
        else:
            src = data  # common case: decode straight from the received bytes
        out: list[Packet] = []
        n = len(src)
        pos = 0
        mv = memoryview(src)
        scan = scan_publishes if self.publish_runs else None
        acks = scan_pubacks if self.publish_runs else None
        try:
            limit = self.max_packet_size
            while pos < n:
                first = src[pos]
                if scan is not None and first >> 4 == PUBLISH and self._connected \
                        and self.protocol_version != 5:  # (CONNECT may be in this read)
                    run, pos = scan(src, pos, limit)
                    if run:
                        out.append(PublishRun(run))
                        if pos == n:
                            break
                        first = src[pos]
                if acks is not None and first == 0x40 and self._connected:
                    ids, pos = acks(src, pos)
                    if ids:
                        out.append(PubackRun(ids))
                        if pos == n:
                            break
                        first = src[pos]
                # Remaining Length: at most four bytes (§2.1.4).
                p = pos + 1
                length = 0
                shift = 0
                while p < n:
                    byte = src[p]
                    p += 1
                    length |= (byte & 0x7F) << shift
                    if byte < 0x80:
                        break
                    shift += 7
                    if shift == 28:
                        raise _malformed("remaining length longer than 4 bytes")
                else:
                    break  # fixed header incomplete
                if p - pos + length > limit:
                    # Before buffering the body: never hold more than max_packet_size.
                    raise MqttProtocolError(
                        0x95, f"packet of {p - pos + length} bytes exceeds {limit}"
                    )
                end = p + length
                if end > n:
                    break  # body incomplete
                if first >> 4 == PUBLISH and self._connected:  # hot path: skip the checks
                    out.append(self._decode_publish(first, mv, p, end))
                else:
                    out.append(self._decode(first, mv, p, end))
                pos = end
        except MqttProtocolError as exc:
            exc.packets = out
            self._failed = exc
            raise
        finally:
            mv.release()
        if src is buf:
            del buf[:pos]
        elif pos < n:
            buf += data[pos:]
        return out

    def _decode(self, first: int, mv: memoryview, start: int, end: int) -> Packet:
        ptype = first >> 4
        version = self.protocol_version
        if ptype == 0 or (ptype == AUTH and version is not None and version < 5):
            raise _malformed(f"reserved packet type {ptype}")
        if self._role == "server":
            if not self._connected and ptype != CONNECT:
                raise _protocol_error("first packet must be CONNECT")  # MQTT-3.1.0-1
            if self._connected and ptype == CONNECT:
                raise _protocol_error("second CONNECT")  # MQTT-3.1.0-2
        elif version is None:
            raise _protocol_error("client codec received a packet before sending CONNECT")
        if ptype not in self._receives:
            raise _protocol_error(f"packet type {ptype} not allowed in this direction")
        return _DECODERS[ptype](self, first, mv, start, end)  # type: ignore[misc]

    def _check_flags(self, first: int, expected: int) -> None:
        flags = first & 0x0F
        # MQTT 3.1 sent PUBREL / SUBSCRIBE / UNSUBSCRIBE at QoS 1 and could set DUP.
        if flags != expected and not (
            expected == 0x02 and flags == 0x0A and self.protocol_version == 3
        ):
            raise _malformed(f"invalid fixed header flags 0x{flags:X}")  # MQTT-2.2.2-2

    def _read_pid(self, mv: memoryview, pos: int, end: int) -> int:
        if pos + 2 > end:
            raise _malformed("truncated packet identifier")
        pid = (mv[pos] << 8) | mv[pos + 1]
        if pid == 0:
            raise _malformed("packet identifier 0")  # MQTT-2.2.1-3
        return pid

    def _decode_connect(self, first: int, mv: memoryview, pos: int, end: int) -> Connect:
        self._check_flags(first, 0)
        name, pos = decode_string(mv, pos, end)
        if pos >= end:
            raise _malformed("truncated CONNECT")
        level = mv[pos]
        if (name, level) not in _SUPPORTED:
            # MQTT-3.1.2-2: answer CONNACK 0x01 (3.1.1) / 0x84 (5.0), then close. The
            # 3.1.1 form is the one every older client can read.
            reply = 5 if level == 5 else 4
            self.protocol_version = reply
            raise ConnectRejected(0x84, f"unsupported protocol {name!r} level {level}", reply)
        # Known from here on, so a v5 fault later in CONNECT can be answered in v5.
        self.protocol_version = version = level
        if pos + 4 > end:
            raise _malformed("truncated CONNECT")
        flags = mv[pos + 1]
        keepalive = (mv[pos + 2] << 8) | mv[pos + 3]
        pos += 4
        if flags & 0x01 and version >= 4:
            raise _malformed("reserved CONNECT flag set")  # MQTT-3.1.2-3
        will_flag = flags & 0x04
        will_qos = (flags >> 3) & 0x03
        will_retain = bool(flags & 0x20)
        if will_qos == 3:
            raise _malformed("will QoS 3")  # MQTT-3.1.2-14
        if not will_flag and (will_qos or will_retain):
            raise _malformed("will QoS/retain without will flag")  # MQTT-3.1.2-11/-13
        if flags & 0x40 and not flags & 0x80 and version < 5:
            raise _malformed("password without user name")  # 3.1.1 MQTT-3.1.2-22
        props = NO_PROPERTIES
        if version == 5:
            props, pos = decode_properties(mv, pos, end, CONNECT)
        client_id, pos = decode_string(mv, pos, end)
        will = None
        if will_flag:
            will_props = NO_PROPERTIES
            if version == 5:
                will_props, pos = decode_properties(mv, pos, end, WILL)
            will_topic, pos = decode_string(mv, pos, end)
            if not will_topic or "+" in will_topic or "#" in will_topic:
                raise _malformed("invalid will topic")
            will_payload, pos = decode_binary(mv, pos, end)
            will = Will(will_topic, will_payload, will_qos, will_retain, will_props)
        username = password = None
        if flags & 0x80:
            username, pos = decode_string(mv, pos, end)
        if flags & 0x40:
            password, pos = decode_binary(mv, pos, end)
        if pos != end:
            raise _malformed("trailing bytes after CONNECT payload")
        clean = bool(flags & 0x02)
        if not client_id and (version == 3 or (version == 4 and not clean)):
            # 3.1 needs 1-23 characters; 3.1.1 allows an empty id only with a clean
            # session (MQTT-3.1.3-8). Longer 3.1 ids are accepted, as Mosquitto does.
            raise ConnectRejected(0x85, "empty client identifier", version)
        self._connected = True
        self.peer_max_packet_size = props.maximum_packet_size
        return Connect(client_id, version, clean, keepalive, username, password, will, props)

    def _decode_connack(self, first: int, mv: memoryview, pos: int, end: int) -> Connack:
        self._check_flags(first, 0)
        if end - pos < 2:
            raise _malformed("truncated CONNACK")
        ack_flags, code = mv[pos], mv[pos + 1]
        if ack_flags & 0xFE:
            raise _malformed("reserved CONNACK flags set")  # MQTT-3.2.2-1
        props = NO_PROPERTIES
        if self.protocol_version == 5:
            props, pos = decode_properties(mv, pos + 2, end, CONNACK)
            if code not in _CONNACK_CODES:
                raise _protocol_error(f"invalid CONNACK reason code 0x{code:02X}")
            self.peer_max_packet_size = props.maximum_packet_size
        else:
            pos += 2
            if code > 5:
                raise _protocol_error(f"invalid CONNACK return code {code}")
        if pos != end:
            raise _malformed("trailing bytes after CONNACK")
        return Connack(bool(ack_flags), code, props)

    def _decode_publish(self, first: int, mv: memoryview, pos: int, end: int) -> Publish:
        qos = (first >> 1) & 0x03
        if qos == 3:
            raise _malformed("PUBLISH with QoS 3")  # MQTT-3.3.1-4
        dup = bool(first & 0x08)
        if dup and not qos:
            raise _malformed("DUP set on a QoS 0 PUBLISH")  # MQTT-3.3.1-2
        if pos + 2 > end:
            raise _malformed("truncated topic name")
        stop = pos + 2 + ((mv[pos] << 8) | mv[pos + 1])
        if stop > end:
            raise _malformed("truncated topic name")
        try:
            topic = str(mv[pos + 2 : stop], "utf-8")
        except UnicodeDecodeError:
            raise _malformed("topic name is not well-formed UTF-8") from None
        if "+" in topic or "#" in topic or "\x00" in topic:
            raise _malformed("wildcard or U+0000 in topic name")  # MQTT-3.3.2-2, 1.5.4-2
        pos = stop
        packet_id = None
        if qos:
            if pos + 2 > end:
                raise _malformed("truncated packet identifier")
            packet_id = (mv[pos] << 8) | mv[pos + 1]
            if not packet_id:
                raise _malformed("packet identifier 0")  # MQTT-2.2.1-3
            pos += 2
        props = NO_PROPERTIES
        if self.protocol_version == 5:
            props, pos = decode_properties(mv, pos, end, PUBLISH)
            if props is not NO_PROPERTIES:
                topic = self._resolve_alias(topic, props)
                if props.subscription_identifiers and self._role == "server":
                    raise _protocol_error("client PUBLISH with subscription identifier")
            elif not topic:
                raise _protocol_error("empty topic name without topic alias")  # §3.3.2.1
        elif not topic:
            raise _malformed("empty topic name")  # MQTT-4.7.3-1
        return Publish(topic, bytes(mv[pos:end]), qos, bool(first & 0x01), dup, packet_id, props)

    def _resolve_alias(self, topic: str, props: Properties) -> str:
        alias = props.topic_alias
        if alias is None:
            if not topic:
                raise _protocol_error("empty topic name without topic alias")
            return topic
        if alias > self.topic_alias_maximum:
            raise MqttProtocolError(0x94, f"topic alias {alias} above the maximum")
        if topic:
            self._aliases[alias] = topic  # set or replace the mapping (§3.3.2.3.4)
            return topic
        known = self._aliases.get(alias)
        if known is None:
            raise _protocol_error(f"topic alias {alias} used before it was set")
        return known

    def _decode_ack(self, first: int, mv: memoryview, pos: int, end: int) -> Packet:
        ptype = first >> 4
        self._check_flags(first, 0x02 if ptype == PUBREL else 0)  # MQTT-3.6.1-1
        packet_id = self._read_pid(mv, pos, end)
        code = 0
        props = NO_PROPERTIES
        if self.protocol_version == 5:
            # Reason code and properties may be left out when 0 / empty (§3.4.2.1).
            if end - pos > 2:
                code = mv[pos + 2]
                if code not in VALID_REASON_CODES[ptype]:
                    raise _protocol_error(f"invalid reason code 0x{code:02X}")
                if end - pos > 3:
                    props, stop = decode_properties(mv, pos + 3, end, ptype)
                    if stop != end:
                        raise _malformed("trailing bytes after properties")
        elif end - pos != 2:
            raise _malformed("acknowledgement must have remaining length 2")
        return _ACK_CLASSES[ptype](packet_id, code, props)  # type: ignore[no-any-return]

    def _read_filters(
        self, mv: memoryview, pos: int, end: int, with_options: bool
    ) -> tuple[list[tuple[str, int]], int]:
        items = []
        while pos < end:
            topic_filter, pos = decode_string(mv, pos, end)
            # Syntax only (a bad filter cannot be "correctly formed"); the configurable
            # length / level limits are the session's to apply (reason code 0x8F).
            validate_topic_filter(topic_filter, max_levels=1 << 30)
            options = 0
            if with_options:
                if pos >= end:
                    raise _malformed("missing subscription options")
                options = mv[pos]
                pos += 1
            items.append((topic_filter, options))
        if not items:
            raise _protocol_error("no topic filter")  # MQTT-3.8.3-2, MQTT-3.10.3-2
        return items, pos

    def _decode_subscribe(self, first: int, mv: memoryview, pos: int, end: int) -> Subscribe:
        self._check_flags(first, 0x02)  # MQTT-3.8.1-1
        packet_id = self._read_pid(mv, pos, end)
        pos += 2
        v5 = self.protocol_version == 5
        props = NO_PROPERTIES
        if v5:
            props, pos = decode_properties(mv, pos, end, SUBSCRIBE)
        items, pos = self._read_filters(mv, pos, end, True)
        subs = []
        for topic_filter, options in items:
            qos = options & 0x03
            if qos == 3:
                raise _malformed("subscription QoS 3")  # MQTT-3-8.3-4
            if not v5:
                if options & 0xFC:
                    raise _malformed("reserved subscription option bits set")  # MQTT-3-8.3-4
                subs.append(Subscription(topic_filter, qos))
                continue
            if options & 0xC0:
                raise _malformed("reserved subscription option bits set")  # MQTT-3.8.3-5
            retain_handling = (options >> 4) & 0x03
            if retain_handling == 3:
                raise _protocol_error("retain handling 3")
            no_local = bool(options & 0x04)
            if no_local and parse_shared_subscription(topic_filter) is not None:
                raise _protocol_error("no local on a shared subscription")  # MQTT-3.8.3-4
            subs.append(
                Subscription(topic_filter, qos, no_local, bool(options & 0x08), retain_handling)
            )
        return Subscribe(packet_id, tuple(subs), props)

    def _decode_suback(self, first: int, mv: memoryview, pos: int, end: int) -> Suback:
        self._check_flags(first, 0)
        packet_id = self._read_pid(mv, pos, end)
        pos += 2
        props = NO_PROPERTIES
        allowed = _SUBACK_CODES
        if self.protocol_version == 5:
            props, pos = decode_properties(mv, pos, end, SUBACK)
        else:
            allowed = _V3_SUBACK_CODES
        codes = tuple(mv[pos:end])
        if not codes:
            raise _protocol_error("SUBACK without reason codes")
        if not allowed.issuperset(codes):
            raise _protocol_error("invalid SUBACK reason code")
        return Suback(packet_id, codes, props)

    def _decode_unsubscribe(self, first: int, mv: memoryview, pos: int, end: int) -> Unsubscribe:
        self._check_flags(first, 0x02)  # MQTT-3.10.1-1
        packet_id = self._read_pid(mv, pos, end)
        pos += 2
        props = NO_PROPERTIES
        if self.protocol_version == 5:
            props, pos = decode_properties(mv, pos, end, UNSUBSCRIBE)
        items, pos = self._read_filters(mv, pos, end, False)
        return Unsubscribe(packet_id, tuple(f for f, _ in items), props)

    def _decode_unsuback(self, first: int, mv: memoryview, pos: int, end: int) -> Unsuback:
        self._check_flags(first, 0)
        packet_id = self._read_pid(mv, pos, end)
        pos += 2
        if self.protocol_version != 5:
            if pos != end:
                raise _malformed("UNSUBACK must have remaining length 2")
            return Unsuback(packet_id)
        props, pos = decode_properties(mv, pos, end, UNSUBACK)
        codes = tuple(mv[pos:end])
        if not codes or not _UNSUBACK_CODES.issuperset(codes):
            raise _protocol_error("missing or invalid UNSUBACK reason code")
        return Unsuback(packet_id, codes, props)

    def _decode_ping(self, first: int, mv: memoryview, pos: int, end: int) -> Packet:
        self._check_flags(first, 0)
        if pos != end:
            raise _malformed("PINGREQ/PINGRESP must have remaining length 0")
        return PINGREQ if first >> 4 == PINGREQ_T else PINGRESP

    def _decode_reason_and_props(
        self, mv: memoryview, pos: int, end: int, ptype: int, allowed: frozenset[int]
    ) -> tuple[int, Properties]:
        # DISCONNECT / AUTH: both fields may be left out when 0 / empty (§3.14.2, §3.15.2).
        if pos == end:
            return 0, NO_PROPERTIES
        code = mv[pos]
        if code not in allowed:
            raise _protocol_error(f"invalid reason code 0x{code:02X}")
        props = NO_PROPERTIES
        if end - pos > 1:
            props, pos = decode_properties(mv, pos + 1, end, ptype)
            if pos != end:
                raise _malformed("trailing bytes after properties")
        return code, props

    def _decode_disconnect(self, first: int, mv: memoryview, pos: int, end: int) -> Disconnect:
        self._check_flags(first, 0)
        if self.protocol_version != 5:
            if pos != end:
                raise _malformed("DISCONNECT must have remaining length 0")
            return Disconnect()
        code, props = self._decode_reason_and_props(mv, pos, end, DISCONNECT, _DISCONNECT_CODES)
        return Disconnect(code, props)

    def _decode_auth(self, first: int, mv: memoryview, pos: int, end: int) -> Auth:
        self._check_flags(first, 0)
        code, props = self._decode_reason_and_props(mv, pos, end, AUTH, _AUTH_CODES)
        return Auth(code, props)

    def error_reply(self, exc: MqttProtocolError) -> Packet | None:
        """The packet to send (if any) before closing the connection after `exc`.

        `ConnectRejected` -> its refusing CONNACK (a MUST). In v5 otherwise: a CONNACK
        with the reason code while the CONNECT is being read, a DISCONNECT with it after
        (§4.13.1-2, both MAYs that every client profits from). v3.x: nothing, just close.
        """
        if isinstance(exc, ConnectRejected):
            return exc.connack
        if self.protocol_version != 5:
            return None
        if self._role == "server" and not self._connected:
            return Connack(reason_code=exc.reason_code)
        return Disconnect(reason_code=exc.reason_code)

    # -- encoding ------------------------------------------------------------------------

    def encode(self, packet: Packet) -> bytes:
        """Wire bytes of `packet` in this connection's protocol version.

        Fields the version cannot carry are left out (v3.x has no properties and no
        reason codes in acknowledgements; v5 codes in a v3.x CONNACK / SUBACK become the
        nearest 3.1.1 code). If the peer set a Maximum Packet Size, a larger packet first
        loses its Reason String and User Properties (MQTT-3.1.2-29 allows dropping them)
        and, if still too large, raises `PacketTooLarge` (discard it, MQTT-3.1.2-25).
        Raises ValueError for a packet that cannot be valid (QoS 1 without packet id ...).
        """
        version = self.protocol_version
        if type(packet) is Connect:
            version = packet.protocol_version
            if self._role == "client":
                self.protocol_version = version
        elif version is None:
            raise ValueError("protocol version unknown: no CONNECT yet")
        data = encode_packet(packet, version)
        limit = self.peer_max_packet_size
        if limit is not None and len(data) > limit:
            props = getattr(packet, "properties", NO_PROPERTIES)
            if type(packet) is not Publish and (props.reason_string or props.user_properties):
                lean = replace(props, reason_string=None, user_properties=())
                data = encode_packet(replace(packet, properties=lean), version)  # type: ignore[type-var]
            if len(data) > limit:
                raise PacketTooLarge(len(data), limit)
        return data

    def encoded_size(self, packet: Packet) -> int:
        """Size in bytes that `encode(packet)` would produce (before any trimming).

        Cheap for PUBLISH (no payload copy), so a server can skip messages that exceed
        the client's Maximum Packet Size before building them.
        """
        version = packet.protocol_version if type(packet) is Connect else self.protocol_version
        if version is None:
            raise ValueError("protocol version unknown: no CONNECT yet")
        if type(packet) is Publish:
            return publish_size(packet, version)
        return len(encode_packet(packet, version))


_DECODERS: list[Callable[..., Packet] | None] = [
    None,
    MqttCodec._decode_connect,
    MqttCodec._decode_connack,
    MqttCodec._decode_publish,
    MqttCodec._decode_ack,  # PUBACK
    MqttCodec._decode_ack,  # PUBREC
    MqttCodec._decode_ack,  # PUBREL
    MqttCodec._decode_ack,  # PUBCOMP
    MqttCodec._decode_subscribe,
    MqttCodec._decode_suback,
    MqttCodec._decode_unsubscribe,
    MqttCodec._decode_unsuback,
    MqttCodec._decode_ping,  # PINGREQ
    MqttCodec._decode_ping,  # PINGRESP
    MqttCodec._decode_disconnect,
    MqttCodec._decode_auth,
]
