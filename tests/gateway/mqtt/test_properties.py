"""MQTT 5.0 properties: the §2.2.2.2 table, wire types, repetition and range rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.mqtt.packets import NO_PROPERTIES, MqttProtocolError, PacketType, Properties
from gateway.mqtt.properties import (
    WILL,
    PropertyId,
    PropertyType,
    allowed_properties,
    decode_properties,
    decode_string,
    decode_varint,
    encode_properties,
    encode_varint,
    property_type,
)

from .strategies import properties

P = PacketType
I = PropertyId  # noqa: E741

# MQTT 5.0 §2.2.2.2, written out independently of the implementation's table.
SPEC_TABLE: dict[PropertyId, tuple[PropertyType, set[int]]] = {
    I.PAYLOAD_FORMAT_INDICATOR: (PropertyType.BYTE, {P.PUBLISH, WILL}),
    I.MESSAGE_EXPIRY_INTERVAL: (PropertyType.FOUR_BYTE_INT, {P.PUBLISH, WILL}),
    I.CONTENT_TYPE: (PropertyType.UTF8_STRING, {P.PUBLISH, WILL}),
    I.RESPONSE_TOPIC: (PropertyType.UTF8_STRING, {P.PUBLISH, WILL}),
    I.CORRELATION_DATA: (PropertyType.BINARY, {P.PUBLISH, WILL}),
    I.SUBSCRIPTION_IDENTIFIER: (PropertyType.VARINT, {P.PUBLISH, P.SUBSCRIBE}),
    I.SESSION_EXPIRY_INTERVAL: (PropertyType.FOUR_BYTE_INT, {P.CONNECT, P.CONNACK, P.DISCONNECT}),
    I.ASSIGNED_CLIENT_IDENTIFIER: (PropertyType.UTF8_STRING, {P.CONNACK}),
    I.SERVER_KEEP_ALIVE: (PropertyType.TWO_BYTE_INT, {P.CONNACK}),
    I.AUTHENTICATION_METHOD: (PropertyType.UTF8_STRING, {P.CONNECT, P.CONNACK, P.AUTH}),
    I.AUTHENTICATION_DATA: (PropertyType.BINARY, {P.CONNECT, P.CONNACK, P.AUTH}),
    I.REQUEST_PROBLEM_INFORMATION: (PropertyType.BYTE, {P.CONNECT}),
    I.WILL_DELAY_INTERVAL: (PropertyType.FOUR_BYTE_INT, {WILL}),
    I.REQUEST_RESPONSE_INFORMATION: (PropertyType.BYTE, {P.CONNECT}),
    I.RESPONSE_INFORMATION: (PropertyType.UTF8_STRING, {P.CONNACK}),
    I.SERVER_REFERENCE: (PropertyType.UTF8_STRING, {P.CONNACK, P.DISCONNECT}),
    I.REASON_STRING: (
        PropertyType.UTF8_STRING,
        {
            P.CONNACK,
            P.PUBACK,
            P.PUBREC,
            P.PUBREL,
            P.PUBCOMP,
            P.SUBACK,
            P.UNSUBACK,
            P.DISCONNECT,
            P.AUTH,
        },
    ),
    I.RECEIVE_MAXIMUM: (PropertyType.TWO_BYTE_INT, {P.CONNECT, P.CONNACK}),
    I.TOPIC_ALIAS_MAXIMUM: (PropertyType.TWO_BYTE_INT, {P.CONNECT, P.CONNACK}),
    I.TOPIC_ALIAS: (PropertyType.TWO_BYTE_INT, {P.PUBLISH}),
    I.MAXIMUM_QOS: (PropertyType.BYTE, {P.CONNACK}),
    I.RETAIN_AVAILABLE: (PropertyType.BYTE, {P.CONNACK}),
    I.USER_PROPERTY: (
        PropertyType.STRING_PAIR,
        {WILL, *(t for t in P if t not in (P.PINGREQ, P.PINGRESP))},
    ),
    I.MAXIMUM_PACKET_SIZE: (PropertyType.FOUR_BYTE_INT, {P.CONNECT, P.CONNACK}),
    I.WILDCARD_SUBSCRIPTION_AVAILABLE: (PropertyType.BYTE, {P.CONNACK}),
    I.SUBSCRIPTION_IDENTIFIER_AVAILABLE: (PropertyType.BYTE, {P.CONNACK}),
    I.SHARED_SUBSCRIPTION_AVAILABLE: (PropertyType.BYTE, {P.CONNACK}),
}


def decode(data: bytes, packet_type: int) -> Properties:
    mv = memoryview(data)
    props, pos = decode_properties(mv, 0, len(data), packet_type)
    assert pos == len(data)
    return props


def block(body: bytes) -> bytes:
    return encode_varint(len(body)) + body


def test_table_matches_spec() -> None:
    assert set(PropertyId) == set(SPEC_TABLE)
    for pid, (ptype, _) in SPEC_TABLE.items():
        assert property_type(pid) == ptype, pid
    for packet_type in [WILL, *P]:
        expected = {pid for pid, (_, where) in SPEC_TABLE.items() if packet_type in where}
        assert allowed_properties(packet_type) == expected, packet_type


@pytest.mark.parametrize("packet_type", [WILL, *(t for t in P if t not in (P.PINGREQ, P.PINGRESP))])
@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_round_trip_every_allowed_property(packet_type: int, data: st.DataObject) -> None:
    props = data.draw(
        properties(packet_type, sub_ids=3 if packet_type == P.PUBLISH else 1, alias=True)
    )
    assert decode(encode_properties(props, packet_type), packet_type) == props


def test_empty_block() -> None:
    assert encode_properties(NO_PROPERTIES, P.PUBLISH) == b"\x00"
    assert decode(b"\x00", P.PUBLISH) is NO_PROPERTIES


def test_wire_layout_of_each_type() -> None:
    props = Properties(
        payload_format_indicator=1,  # byte
        message_expiry_interval=0x01020304,  # four-byte integer
        content_type="é",  # UTF-8 string
        correlation_data=b"\x00\xff",  # binary
        subscription_identifiers=(300,),  # variable byte integer
        topic_alias=0x0A0B,  # two-byte integer
        user_properties=(("k", "v"),),  # string pair
    )
    body = (
        b"\x01\x01"
        + b"\x02\x01\x02\x03\x04"
        + b"\x03\x00\x02\xc3\xa9"
        + b"\x09\x00\x02\x00\xff"
        + b"\x0b\xac\x02"
        + b"\x23\x0a\x0b"
        + b"\x26\x00\x01k\x00\x01v"
    )
    assert encode_properties(props, P.PUBLISH) == block(body)


def test_user_properties_keep_order_and_repeats() -> None:
    pairs = (("b", "1"), ("a", "2"), ("b", "1"), ("", ""))
    wire = encode_properties(Properties(user_properties=pairs), P.PUBACK)
    assert decode(wire, P.PUBACK).user_properties == pairs


def test_publish_carries_several_subscription_ids_subscribe_one() -> None:
    wire = block(b"\x0b\x01\x0b\x02")
    assert decode(wire, P.PUBLISH).subscription_identifiers == (1, 2)
    with pytest.raises(MqttProtocolError) as info:
        decode(wire, P.SUBSCRIBE)
    assert info.value.reason_code == 0x82
    with pytest.raises(ValueError):
        encode_properties(Properties(subscription_identifiers=(1, 2)), P.SUBSCRIBE)


@pytest.mark.parametrize(
    "body, packet_type, code",
    [
        (b"\x11\x00\x00\x00\x01\x11\x00\x00\x00\x02", P.CONNECT, 0x82),  # repeated
        (b"\x1f\x00\x00\x1f\x00\x00", P.PUBACK, 0x82),  # reason string twice
        (b"\x21\x00\x00", P.CONNECT, 0x82),  # receive maximum 0
        (b"\x27\x00\x00\x00\x00", P.CONNECT, 0x82),  # maximum packet size 0
        (b"\x23\x00\x00", P.PUBLISH, 0x82),  # topic alias 0
        (b"\x0b\x00", P.SUBSCRIBE, 0x82),  # subscription identifier 0
        (b"\x17\x02", P.CONNECT, 0x82),  # request problem information 2
        (b"\x24\x02", P.CONNACK, 0x82),  # maximum QoS 2
        (b"\x01\x02", P.PUBLISH, 0x82),  # payload format indicator 2
        (b"\x23\x00\x01", P.CONNECT, 0x81),  # topic alias not allowed in CONNECT
        (b"\x18\x00\x00\x00\x01", P.PUBLISH, 0x81),  # will delay only in Will properties
        (b"\x00", P.PUBLISH, 0x81),  # identifier 0 does not exist
        (b"\x80\x01\x00", P.PUBLISH, 0x81),  # two-byte identifier: unknown
        (b"\x02\x00\x00", P.PUBLISH, 0x81),  # truncated four-byte integer
        (b"\x03\x00\x05ab", P.PUBLISH, 0x81),  # truncated string
        (b"\x03\x00\x01\x00", P.PUBLISH, 0x81),  # U+0000
        (b"\x0b\xff\xff\xff\xff\x01", P.PUBLISH, 0x81),  # 5-byte varint
        (b"\x26\x00\x01k", P.PUBLISH, 0x81),  # user property without value
    ],
)
def test_faults(body: bytes, packet_type: int, code: int) -> None:
    with pytest.raises(MqttProtocolError) as info:
        decode(block(body), packet_type)
    assert info.value.reason_code == code


def test_property_block_cannot_exceed_its_length() -> None:
    # Length 2 covers only part of the four-byte integer that follows: malformed even
    # though the bytes exist after the block.
    data = b"\x02\x02\x00\x00\x00\x01"
    with pytest.raises(MqttProtocolError):
        decode_properties(memoryview(data), 0, len(data), P.PUBLISH)


def test_encode_rejects_misplaced_or_out_of_range() -> None:
    with pytest.raises(ValueError):
        encode_properties(Properties(topic_alias=1), P.CONNECT)
    with pytest.raises(ValueError):
        encode_properties(Properties(server_keep_alive=70000), P.CONNACK)
    with pytest.raises(ValueError):
        encode_properties(Properties(receive_maximum=0), P.CONNACK)


@pytest.mark.parametrize(
    "raw",
    [
        b"\xed\xa0\x80",  # U+D800 surrogate (MQTT-1.5.4-1)
        b"\xed\xbf\xbf",  # U+DFFF
        b"\xc0\x80",  # overlong U+0000
        b"\xe0\x80\xaf",  # overlong '/'
        b"\xf4\x90\x80\x80",  # above U+10FFFF
        b"\x00",  # U+0000 (MQTT-1.5.4-2)
        b"\xff",
    ],
)
def test_strings_must_be_well_formed(raw: bytes) -> None:
    data = len(raw).to_bytes(2, "big") + raw
    with pytest.raises(MqttProtocolError) as info:
        decode_string(memoryview(data), 0, len(data))
    assert info.value.reason_code == 0x81


def test_string_allows_bom_and_noncharacters() -> None:
    # MQTT-1.5.4-3: U+FEFF must not be stripped; non-characters are only "SHOULD NOT".
    raw = "\ufeffa\uffff".encode()
    data = len(raw).to_bytes(2, "big") + raw
    assert decode_string(memoryview(data), 0, len(data))[0] == "\ufeffa\uffff"


@given(st.integers(0, 268_435_455))
def test_varint_round_trip(value: int) -> None:
    data = encode_varint(value)
    assert decode_varint(memoryview(data), 0, len(data)) == (value, len(data))


def test_varint_limits() -> None:
    with pytest.raises(ValueError):
        encode_varint(268_435_456)
    with pytest.raises(MqttProtocolError):
        decode_varint(memoryview(b"\x80\x80\x80\x80\x01"), 0, 5)
    with pytest.raises(MqttProtocolError):
        decode_varint(memoryview(b"\x80"), 0, 1)
