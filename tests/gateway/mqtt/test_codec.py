"""MqttCodec: byte-exact spec examples, every fault class, limits, aliases, replies."""

from __future__ import annotations

import pytest

from gateway.mqtt.codec import DEFAULT_MAX_PACKET_SIZE, MqttCodec
from gateway.mqtt.packets import (
    PINGREQ,
    PINGRESP,
    Auth,
    Connack,
    Connect,
    ConnectRejected,
    Disconnect,
    MqttProtocolError,
    PacketTooLarge,
    Properties,
    Puback,
    Publish,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from gateway.mqtt.properties import encode_string, encode_varint


def server(version: int, **kw: object) -> MqttCodec:
    """A server codec that has already decoded a CONNECT of `version`."""
    codec = MqttCodec(**kw)  # type: ignore[arg-type]
    [connect] = codec.feed(client_codec(version).encode(Connect("c1", version)))
    assert connect.protocol_version == version
    return codec


def client_codec(version: int) -> MqttCodec:
    return MqttCodec(protocol_version=version, role="client")


def raw(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_varint(len(body)) + body


def fault(codec: MqttCodec, data: bytes) -> MqttProtocolError:
    with pytest.raises(MqttProtocolError) as info:
        codec.feed(data)
    return info.value


# -- spec examples ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, wire",
    [
        (0, "00"),
        (127, "7f"),
        (128, "8001"),
        (16_383, "ff7f"),
        (16_384, "808001"),
        (2_097_151, "ffff7f"),
        (2_097_152, "80808001"),
        (268_435_455, "ffffff7f"),
    ],
)
def test_variable_byte_integer_table(value: int, wire: str) -> None:
    # MQTT 5.0 §1.5.5 / 3.1.1 §2.2.3 table of remaining-length encodings.
    assert encode_varint(value).hex() == wire


def test_utf8_string_example() -> None:
    # 5.0 §1.5.4 figure 1-1: "A\U0002A6D4" -> 00 05 41 F0 AA 9B 94.
    assert encode_string("A\U0002a6d4") == bytes.fromhex("00054 1f0aa9b94".replace(" ", ""))
    codec = server(4)
    [p] = codec.feed(raw(0x30, bytes.fromhex("000541f0aa9b94") + b"hi"))
    assert p == Publish("A\U0002a6d4", b"hi")


def test_connect_v311_example_variable_header() -> None:
    # 3.1.1 §3.1.2.10 figure 3.6: name, level 4, flags 0xCE, keep alive 10.
    packet = Connect("id", 4, True, 10, "user", b"pw", Will("w/t", b"bye", qos=1))
    wire = client_codec(4).encode(packet)
    assert wire[2:12] == bytes.fromhex("00044d5154540 4ce000a".replace(" ", ""))
    assert MqttCodec().feed(wire) == [packet]


def test_connect_v5_example_variable_header() -> None:
    # 5.0 §3.1.2.12 figure 3-6: flags 0xC2, keep alive 10, Session Expiry Interval 10.
    packet = Connect("id", 5, True, 10, "u", b"p", None, Properties(session_expiry_interval=10))
    wire = client_codec(5).encode(packet)
    assert wire[2:18] == bytes.fromhex("00044d51545405c2000a0511 0000000a".replace(" ", ""))
    assert MqttCodec().feed(wire) == [packet]


def test_connect_v31_uses_mqisdp() -> None:
    wire = client_codec(3).encode(Connect("legacy", 3, True, 30))
    assert wire[2:11] == b"\x00\x06MQIsdp\x03"
    assert MqttCodec().feed(wire) == [Connect("legacy", 3, True, 30)]


@pytest.mark.parametrize("version, extra", [(4, b""), (5, b"\x00")])
def test_publish_example_variable_header(version: int, extra: bytes) -> None:
    # 3.1.1 §3.3.2.3 / 5.0 §3.3.2.3.9: topic "a/b", packet id 10 (+ property length 0 in v5).
    wire = server(version).encode(Publish("a/b", b"xyz", qos=1, packet_id=10))
    assert wire == bytes((0x32, 10 + len(extra))) + bytes.fromhex("0003612f62000a") + extra + b"xyz"


def test_subscribe_suback_unsubscribe_examples_v311() -> None:
    # 3.1.1 §3.8.3 figure 3.22 payload, §3.9.3 figure 3.26, §3.10.3 figure 3.30.
    sub = Subscribe(10, (Subscription("a/b", 1), Subscription("c/d", 2)))
    wire = client_codec(4).encode(sub)
    assert wire == bytes.fromhex("820e000a0003612f62010003632f6402")
    assert server(4).feed(wire) == [sub]
    assert server(4).encode(Suback(10, (0, 2, 0x80))) == bytes.fromhex("9005000a000280")
    unsub = Unsubscribe(10, ("a/b", "c/d"))
    assert client_codec(4).encode(unsub) == bytes.fromhex("a20c000a0003612f620003632f64")


@pytest.mark.parametrize(
    "version, packet, wire",
    [
        (4, Connack(True, 0), "20020100"),
        (3, Connack(True, 0), "20020000"),  # 3.1: no session-present flag
        (5, Connack(False, 0), "2003000000"),
        (4, Connack(reason_code=ReasonCode.NOT_AUTHORIZED), "20020005"),  # v5 -> v3 code
        (4, Puback(10), "4002000a"),
        (4, Puback(10, 0x10), "4002000a"),  # v3 has no reason code
        (5, Puback(10), "4002000a"),
        (5, Puback(10, 0x10), "4003000a10"),
        (5, Pubrel(10), "6202000a"),
        (4, Unsuback(10), "b002000a"),
        (5, Unsuback(10, (0, 0x11)), "b005000a000011"),
        (4, Suback(1, (0, 0x97)), "90040001 0080"),  # v5 failure -> 0x80 in v3
        (4, PINGRESP, "d000"),
        (5, Disconnect(), "e000"),
        (5, Disconnect(ReasonCode.SERVER_SHUTTING_DOWN), "e0018b"),
        (5, Auth(0x18, Properties(authentication_method="SCRAM")), "f00a1808150005534352414d"),
    ],
)
def test_server_packet_bytes(version: int, packet: object, wire: str) -> None:
    assert server(version).encode(packet).hex() == wire.replace(" ", "")  # type: ignore[arg-type]


def test_mqtt31_accepts_qos1_flags_on_pubrel() -> None:
    # 3.1 sent PUBREL / SUBSCRIBE / UNSUBSCRIBE with QoS 1 and DUP allowed.
    assert server(3).feed(bytes.fromhex("6a02000a")) == [Pubrel(10)]
    assert fault(server(4), bytes.fromhex("6a02000a")).reason_code == 0x81


# -- streaming --------------------------------------------------------------------------


def test_byte_by_byte_equals_all_at_once() -> None:
    c = client_codec(5)
    packets = [
        Connect("x", 5),
        Publish("t", b"p" * 300, 1, packet_id=1, properties=Properties(content_type="a")),
        Subscribe(2, (Subscription("a/+", 2, True),)),
        PINGREQ,
        Disconnect(),
    ]
    wire = b"".join(c.encode(p) for p in packets)
    whole = MqttCodec().feed(wire)
    codec = MqttCodec()
    piecewise = []
    for i in range(len(wire)):
        piecewise += codec.feed(wire[i : i + 1])
    assert whole == piecewise == packets
    assert codec.buffered == 0


def test_feed_accepts_bytearray_and_memoryview_without_aliasing() -> None:
    codec = server(4)
    buf = bytearray(raw(0x30, b"\x00\x01tpay"))
    assert codec.feed(memoryview(buf)[:3]) == []
    buf[5:] = b"XXX"  # the caller reuses its buffer: the codec must have copied
    assert codec.feed(bytes(raw(0x30, b"\x00\x01tpay"))[3:]) == [Publish("t", b"pay")]


# -- limits -----------------------------------------------------------------------------


def test_packet_too_large_detected_from_fixed_header() -> None:
    codec = server(4, max_packet_size=1000)
    header = b"\x30" + encode_varint(2000)
    err = fault(codec, header)  # no body sent at all
    assert err.reason_code == ReasonCode.PACKET_TOO_LARGE
    assert codec.buffered <= len(header)
    with pytest.raises(MqttProtocolError):  # stays failed
        codec.feed(b"")


def test_packet_at_limit_accepted() -> None:
    limit = 100
    body = b"\x00\x01t" + b"x" * (limit - 2 - 3)
    packet = raw(0x30, body)
    assert len(packet) == limit
    assert server(4, max_packet_size=limit).feed(packet) == [Publish("t", b"x" * (limit - 5))]
    assert fault(server(4, max_packet_size=limit - 1), packet).reason_code == 0x95
    assert DEFAULT_MAX_PACKET_SIZE == 1024 * 1024


def test_outbound_respects_peer_maximum_packet_size() -> None:
    codec = MqttCodec()
    codec.feed(
        client_codec(5).encode(Connect("c", 5, properties=Properties(maximum_packet_size=40)))
    )
    assert codec.peer_max_packet_size == 40
    big = Publish("t", b"x" * 100)
    assert codec.encoded_size(big) == len(MqttCodec(protocol_version=5).encode(big))
    with pytest.raises(PacketTooLarge):
        codec.encode(big)
    # Reason string and user properties are dropped to fit (MQTT-3.1.2-29).
    ack = Puback(1, 0x80, Properties(reason_string="r" * 50, user_properties=(("k", "v"),)))
    assert codec.encode(ack) == bytes.fromhex("4004000180 00".replace(" ", ""))


@pytest.mark.parametrize("version", [3, 4, 5])
def test_encoded_size_of_publish(version: int) -> None:
    codec = server(version)
    for packet in (
        Publish("a/é", b"x" * 200, 2, True, True, 5),
        Publish("t", b""),
        Publish(
            "t",
            b"p",
            properties=Properties(message_expiry_interval=3) if version == 5 else Properties(),
        ),
    ):
        assert codec.encoded_size(packet) == len(codec.encode(packet))


# -- faults -----------------------------------------------------------------------------

CONNECT4 = client_codec(4).encode(Connect("c", 4))


def connect_bytes(name: bytes, level: int, flags: int = 0x02, rest: bytes = b"\x00\x01c") -> bytes:
    return raw(
        0x10, len(name).to_bytes(2, "big") + name + bytes((level, flags)) + b"\x00\x3c" + rest
    )


@pytest.mark.parametrize(
    "version, data, code",
    [
        (4, b"\x30\xff\xff\xff\xff\x01", 0x81),  # remaining length of 5 bytes
        (4, raw(0x36, b"\x00\x01t\x00\x01"), 0x81),  # QoS 3
        (4, raw(0x38, b"\x00\x01t"), 0x81),  # DUP on QoS 0
        (4, raw(0x30, b"\x00\x03a/+"), 0x81),  # wildcard in topic name
        (4, raw(0x30, b"\x00\x01#"), 0x81),
        (4, raw(0x30, b"\x00\x02\xc0\xaf"), 0x81),  # overlong UTF-8
        (4, raw(0x30, b"\x00\x03\xed\xa0\x80"), 0x81),  # encoded surrogate U+D800
        (4, raw(0x30, b"\x00\x01\xff"), 0x81),  # invalid UTF-8
        (4, raw(0x30, b"\x00\x01\x00"), 0x81),  # U+0000
        (4, raw(0x30, b"\x00\x05ab"), 0x81),  # truncated topic
        (4, raw(0x30, b"\x00\x00pay"), 0x81),  # empty topic (3.1.1)
        (5, raw(0x30, b"\x00\x00\x00pay"), 0x82),  # empty topic without alias (5.0)
        (4, raw(0x32, b"\x00\x01t\x00\x00"), 0x81),  # packet id 0
        (4, raw(0x32, b"\x00\x01t\x00"), 0x81),  # truncated packet id
        (4, raw(0x80, b"\x00\x01\x00\x01a\x00"), 0x81),  # SUBSCRIBE flags must be 0b0010
        (4, raw(0x82, b"\x00\x00\x00\x01a\x00"), 0x81),  # SUBSCRIBE packet id 0
        (4, raw(0x82, b"\x00\x01"), 0x82),  # SUBSCRIBE without filters
        (4, raw(0x82, b"\x00\x01\x00\x01a\x03"), 0x81),  # subscription QoS 3
        (4, raw(0x82, b"\x00\x01\x00\x01a\x04"), 0x81),  # reserved option bits (3.1.1)
        (5, raw(0x82, b"\x00\x01\x00\x00\x01a\x40"), 0x81),  # reserved option bits (5.0)
        (5, raw(0x82, b"\x00\x01\x00\x00\x01a\x30"), 0x82),  # retain handling 3
        (5, raw(0x82, b"\x00\x01\x00" + encode_string("$share/g/a") + b"\x04"), 0x82),  # no local
        (4, raw(0x82, b"\x00\x01" + encode_string("a/#/b") + b"\x00"), 0x81),
        (4, raw(0x82, b"\x00\x01" + encode_string("a+") + b"\x00"), 0x81),
        (4, raw(0x82, b"\x00\x01" + encode_string("$share/g") + b"\x00"), 0x81),
        (4, raw(0x82, b"\x00\x01" + encode_string("$share//a") + b"\x00"), 0x81),
        (4, raw(0xA2, b"\x00\x01"), 0x82),  # UNSUBSCRIBE without filters
        (4, raw(0xA0, b"\x00\x01\x00\x01a"), 0x81),  # UNSUBSCRIBE flags
        (4, raw(0x40, b"\x00\x00"), 0x81),  # PUBACK packet id 0
        (4, raw(0x40, b"\x00\x01\x00"), 0x81),  # PUBACK with a v5 reason code in 3.1.1
        (5, raw(0x40, b"\x00\x01\x92"), 0x82),  # reason code not allowed in PUBACK
        (4, raw(0x60, b"\x00\x01"), 0x81),  # PUBREL flags must be 0b0010
        (4, b"\xc0\x01\x00", 0x81),  # PINGREQ with a body
        (4, b"\xc1\x00", 0x81),  # PINGREQ with flags
        (4, b"\xe0\x01\x00", 0x81),  # 3.1.1 DISCONNECT with a body
        (4, b"\x00\x00", 0x81),  # reserved packet type 0
        (4, b"\xf0\x00", 0x81),  # AUTH is reserved in 3.1.1
        (4, b"\x20\x02\x00\x00", 0x82),  # CONNACK sent by a client
        (4, b"\xd0\x00", 0x82),  # PINGRESP sent by a client
        (4, CONNECT4, 0x82),  # second CONNECT
        (5, raw(0x30, b"\x00\x01t\x04\x01\x01\x01\x01"), 0x82),  # payload format indicator twice
        (5, raw(0x30, b"\x00\x01t\x02\x01\x02"), 0x82),  # payload format indicator 2
        (5, raw(0x30, b"\x00\x01t\x02\x11\x00"), 0x81),  # truncated property
        (5, raw(0x30, b"\x00\x01t\x05\x11\x00\x00\x00\x01"), 0x81),  # session expiry in PUBLISH
        (5, raw(0x30, b"\x00\x01t\x02\x0b\x01"), 0x82),  # subscription id from a client
        (5, raw(0x30, b"\x00\x01t\x01\x7f"), 0x81),  # unknown property id
        (5, raw(0x30, b"\x00\x01t\x09"), 0x81),  # property length beyond the packet
        (5, raw(0x82, b"\x00\x01\x04\x0b\x01\x0b\x02\x00\x01a\x00"), 0x82),  # 2 subscription ids
        (5, raw(0x82, b"\x00\x01\x02\x0b\x00\x00\x01a\x00"), 0x82),  # subscription id 0
        (5, raw(0xE0, b"\x05"), 0x82),  # reason code not allowed in DISCONNECT
        (5, raw(0xE0, b"\x00\x02\x1f"), 0x81),  # truncated reason string
    ],
)
def test_faults(version: int, data: bytes, code: int) -> None:
    err = fault(server(version), data)
    assert err.reason_code == code, err


def test_first_packet_must_be_connect() -> None:
    err = fault(MqttCodec(), b"\xc0\x00")
    assert err.reason_code == ReasonCode.PROTOCOL_ERROR
    assert MqttCodec().error_reply(err) is None  # version unknown: just close


@pytest.mark.parametrize(
    "name, level, reply",
    [
        (b"MQTT", 6, "20020001"),  # unknown level -> 3.1.1 CONNACK 0x01
        (b"MQTT", 3, "20020001"),  # level of 3.1 with the 3.1.1 name
        (b"MQIsdp", 4, "20020001"),
        (b"MQIsdp", 5, "2003008400"),  # level 5 -> v5 CONNACK 0x84
        (b"HTTP", 4, "20020001"),
    ],
)
def test_unsupported_protocol_gets_connack(name: bytes, level: int, reply: str) -> None:
    codec = MqttCodec()
    with pytest.raises(ConnectRejected) as info:
        codec.feed(connect_bytes(name, level))
    assert codec.encode(codec.error_reply(info.value)).hex() == reply  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "level, name, flags",
    [(4, b"MQTT", 0x00), (3, b"MQIsdp", 0x02)],  # 3.1.1 empty id w/o clean session; 3.1 empty id
)
def test_empty_client_id_rejected_with_connack_2(level: int, name: bytes, flags: int) -> None:
    codec = MqttCodec()
    with pytest.raises(ConnectRejected) as info:
        codec.feed(connect_bytes(name, level, flags, b"\x00\x00"))
    assert info.value.reason_code == ReasonCode.CLIENT_IDENTIFIER_NOT_VALID
    assert codec.encode(info.value.connack) == b"\x20\x02\x00\x02"


def test_empty_client_id_allowed_with_clean_session_and_in_v5() -> None:
    assert MqttCodec().feed(connect_bytes(b"MQTT", 4, 0x02, b"\x00\x00"))[0].client_id == ""
    assert MqttCodec().feed(connect_bytes(b"MQTT", 5, 0x00, b"\x00\x00\x00"))[0].client_id == ""


@pytest.mark.parametrize(
    "flags, rest, code",
    [
        (0x03, b"\x00\x01c", 0x81),  # reserved flag
        (0x1A, b"\x00\x01c", 0x81),  # will QoS 3
        (0x0A, b"\x00\x01c", 0x81),  # will QoS without will flag
        (0x22, b"\x00\x01c", 0x81),  # will retain without will flag
        (0x42, b"\x00\x01c\x00\x01p", 0x81),  # password without user name (3.1.1)
        (0x06, b"\x00\x01c\x00\x03a/#\x00\x00", 0x81),  # wildcard will topic
        (0x02, b"\x00\x01cX", 0x81),  # trailing byte
        (0x82, b"\x00\x01c\x00\x05us", 0x81),  # truncated user name
    ],
)
def test_connect_faults_v311(flags: int, rest: bytes, code: int) -> None:
    assert fault(MqttCodec(), connect_bytes(b"MQTT", 4, flags, rest)).reason_code == code


def test_v5_connect_fault_answered_with_v5_connack() -> None:
    codec = MqttCodec()
    # Topic Alias (0x23) is not allowed in CONNECT: malformed.
    err = fault(codec, connect_bytes(b"MQTT", 5, 0x02, b"\x03\x23\x00\x01\x00\x01c"))
    assert err.reason_code == 0x81
    assert codec.encode(codec.error_reply(err)) == b"\x20\x03\x00\x81\x00"  # type: ignore[arg-type]


def test_v5_fault_after_connect_answered_with_disconnect() -> None:
    codec = server(5)
    err = fault(codec, raw(0x36, b"\x00\x01t"))
    assert codec.encode(codec.error_reply(err)) == b"\xe0\x01\x81"  # type: ignore[arg-type]
    assert server(4).error_reply(err) is None  # 3.1.1: just close


def test_fault_keeps_packets_decoded_before_it() -> None:
    codec = server(4)
    err = fault(codec, b"\xc0\x00" + raw(0x30, b"\x00\x01t") + b"\x00\x00")
    assert err.packets == [PINGREQ, Publish("t")]
    with pytest.raises(MqttProtocolError) as again:
        codec.feed(b"\xc0\x00")
    assert again.value is err


# -- topic aliases (5.0 §3.3.2.3.4) ------------------------------------------------------


def test_topic_alias_set_and_used() -> None:
    codec = server(5, topic_alias_maximum=10)
    c = client_codec(5)
    set_alias = Publish("a/b", b"1", properties=Properties(topic_alias=3))
    use_alias = Publish("", b"2", properties=Properties(topic_alias=3))
    first, second = codec.feed(c.encode(set_alias) + c.encode(use_alias))
    assert first == set_alias
    assert second.topic == "a/b" and second.payload == b"2"
    assert second.properties.topic_alias == 3


def test_topic_alias_faults() -> None:
    c = client_codec(5)
    over = c.encode(Publish("t", properties=Properties(topic_alias=11)))
    assert fault(server(5, topic_alias_maximum=10), over).reason_code == 0x94
    assert fault(server(5), over).reason_code == 0x94  # aliases not accepted at all
    unknown = c.encode(Publish("", properties=Properties(topic_alias=2)))
    assert fault(server(5, topic_alias_maximum=10), unknown).reason_code == 0x82
    assert (
        fault(
            server(5, topic_alias_maximum=10), raw(0x30, b"\x00\x01t\x03\x23\x00\x00")
        ).reason_code
        == 0x82
    )


# -- encode-side programming errors -----------------------------------------------------


@pytest.mark.parametrize(
    "packet",
    [
        Publish("t", qos=1),  # no packet id
        Publish("t", packet_id=3),  # QoS 0 with packet id
        Publish("t", dup=True),
        Publish("t", qos=3, packet_id=1),
        Publish(""),
        Puback(0),
        Subscribe(1, ()),
        Publish("t", properties=Properties(session_expiry_interval=1)),  # not a PUBLISH property
    ],
)
def test_encode_rejects_invalid_packets(packet: object) -> None:
    with pytest.raises(ValueError):
        server(5).encode(packet)  # type: ignore[arg-type]


def test_encode_before_version_known() -> None:
    with pytest.raises(ValueError):
        MqttCodec().encode(PINGRESP)
    with pytest.raises(ValueError):
        server(4).encode(Auth())
