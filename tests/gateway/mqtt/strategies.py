"""Hypothesis strategies producing valid MQTT packets for a given protocol version.

Each packet is in the canonical form the codec decodes to for that version (no
properties before v5, no reason codes in v3.x acknowledgements, ...), so
`decode(encode(p)) == p` must hold for every example.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from gateway.mqtt.packets import (
    NO_PROPERTIES,
    PINGREQ,
    PINGRESP,
    VALID_REASON_CODES,
    Auth,
    Connack,
    Connect,
    Disconnect,
    PacketType,
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
from gateway.mqtt.properties import (
    WILL,
    PropertyId,
    PropertyType,
    allowed_properties,
    property_field,
    property_type,
)

# Well-formed MQTT string characters: no U+0000, no surrogates (MQTT-1.5.4).
chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
text = st.text(chars, max_size=12)
level = st.sampled_from(["a", "b", "", "é", "$x", "longer-level", "x y"])
topic_names = st.lists(level, min_size=1, max_size=5).map("/".join).filter(bool)
filter_level = st.one_of(level, st.just("+"))


@st.composite
def topic_filters(draw: Any, shared: bool = True) -> str:
    levels = draw(st.lists(filter_level, min_size=1, max_size=5))
    if draw(st.booleans()):
        levels.append("#")
    result = "/".join(levels)
    if not result:
        result = "+"
    if shared and draw(st.integers(0, 5)) == 0:
        result = f"$share/{draw(st.sampled_from(['g', 'group-1', 'é']))}/{result}"
    return result


_ONE_ZERO = {
    PropertyId.PAYLOAD_FORMAT_INDICATOR,
    PropertyId.REQUEST_PROBLEM_INFORMATION,
    PropertyId.REQUEST_RESPONSE_INFORMATION,
    PropertyId.MAXIMUM_QOS,
    PropertyId.RETAIN_AVAILABLE,
    PropertyId.WILDCARD_SUBSCRIPTION_AVAILABLE,
    PropertyId.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
    PropertyId.SHARED_SUBSCRIPTION_AVAILABLE,
}
_NONZERO = {
    PropertyId.RECEIVE_MAXIMUM,
    PropertyId.MAXIMUM_PACKET_SIZE,
    PropertyId.TOPIC_ALIAS,
    PropertyId.SUBSCRIPTION_IDENTIFIER,
}


def _value(pid: PropertyId) -> st.SearchStrategy[Any]:
    ptype = property_type(pid)
    if pid in _ONE_ZERO:
        return st.integers(0, 1)
    low = 1 if pid in _NONZERO else 0
    if ptype is PropertyType.BYTE:
        return st.integers(low, 0xFF)
    if ptype is PropertyType.TWO_BYTE_INT:
        return st.integers(low, 0xFFFF)
    if ptype is PropertyType.FOUR_BYTE_INT:
        return st.integers(low, 0xFFFFFFFF)
    if ptype is PropertyType.VARINT:
        return st.integers(1, 268_435_455)
    if ptype is PropertyType.UTF8_STRING:
        return text
    if ptype is PropertyType.BINARY:
        return st.binary(max_size=16)
    return st.tuples(text, text)


@st.composite
def properties(draw: Any, packet_type: int, sub_ids: int = 1, alias: bool = False) -> Properties:
    """Valid properties of a packet type; `sub_ids` caps subscription identifiers."""
    values: dict[str, Any] = {}
    for pid in sorted(allowed_properties(packet_type)):
        if pid == PropertyId.TOPIC_ALIAS and not alias:
            continue
        if pid == PropertyId.USER_PROPERTY:
            pairs = draw(st.lists(_value(pid), max_size=3))
            if pairs:
                values["user_properties"] = tuple(pairs)
        elif pid == PropertyId.SUBSCRIPTION_IDENTIFIER:
            ids = draw(st.lists(_value(pid), max_size=sub_ids))
            if ids:
                values["subscription_identifiers"] = tuple(ids)
        elif draw(st.integers(0, 3)) == 0:
            values[property_field(pid)] = draw(_value(pid))
    return Properties(**values)


def _props(version: int, packet_type: int, **kw: Any) -> st.SearchStrategy[Properties]:
    if version != 5:
        return st.just(NO_PROPERTIES)
    return properties(packet_type, **kw)


pids = st.integers(1, 0xFFFF)


def codes(packet_type: int) -> st.SearchStrategy[int]:
    """A v5 reason code valid in `packet_type`."""
    return st.sampled_from(sorted(VALID_REASON_CODES[packet_type]))


qos = st.integers(0, 2)


@st.composite
def connects(draw: Any, version: int) -> Connect:
    clean = draw(st.booleans())
    client_id = draw(text)
    if not client_id and (version == 3 or (version == 4 and not clean)):
        client_id = "c"
    will = None
    if draw(st.booleans()):
        will = Will(
            draw(topic_names),
            draw(st.binary(max_size=20)),
            draw(qos),
            draw(st.booleans()),
            draw(_props(version, WILL)),
        )
    username = draw(st.none() | text)
    password = draw(st.none() | st.binary(max_size=10))
    if username is None and version < 5:
        password = None
    return Connect(
        client_id,
        version,
        clean,
        draw(st.integers(0, 0xFFFF)),
        username,
        password,
        will,
        draw(_props(version, PacketType.CONNECT)),
    )


@st.composite
def publishes(draw: Any, version: int, from_server: bool) -> Publish:
    q = draw(qos)
    return Publish(
        draw(topic_names),
        draw(st.binary(max_size=64)),
        q,
        draw(st.booleans()),
        draw(st.booleans()) if q else False,
        draw(pids) if q else None,
        draw(_props(version, PacketType.PUBLISH, sub_ids=3 if from_server else 0)),
    )


def _acks(version: int) -> st.SearchStrategy[Any]:
    out = []
    for cls, ptype in ((Puback, 4), (Pubrec, 5), (Pubrel, 6), (Pubcomp, 7)):
        if version == 5:
            out.append(st.builds(cls, pids, codes(ptype), properties(ptype)))
        else:
            out.append(st.builds(cls, pids))
    return st.one_of(out)


def _subscription(version: int) -> st.SearchStrategy[Subscription]:
    if version != 5:
        return st.builds(Subscription, topic_filters(), qos)

    @st.composite
    def build(draw: Any) -> Subscription:
        f = draw(topic_filters())
        no_local = draw(st.booleans()) and not f.startswith("$share/")
        return Subscription(f, draw(qos), no_local, draw(st.booleans()), draw(st.integers(0, 2)))

    return build()


def client_packets(version: int) -> st.SearchStrategy[Any]:
    """Packets a client sends (except CONNECT)."""
    options = [
        publishes(version, from_server=False),
        _acks(version),
        st.builds(
            Subscribe,
            pids,
            st.lists(_subscription(version), min_size=1, max_size=4).map(tuple),
            _props(version, PacketType.SUBSCRIBE),
        ),
        st.builds(
            Unsubscribe,
            pids,
            st.lists(topic_filters(), min_size=1, max_size=4).map(tuple),
            _props(version, PacketType.UNSUBSCRIBE),
        ),
        st.just(PINGREQ),
    ]
    if version == 5:
        options.append(
            st.builds(Disconnect, codes(PacketType.DISCONNECT), properties(PacketType.DISCONNECT))
        )
        options.append(st.builds(Auth, codes(PacketType.AUTH), properties(PacketType.AUTH)))
    else:
        options.append(st.just(Disconnect()))
    return st.one_of(options)


def server_packets(version: int) -> st.SearchStrategy[Any]:
    """Packets a server sends."""
    if version == 5:
        connack = st.builds(
            Connack, st.booleans(), codes(PacketType.CONNACK), properties(PacketType.CONNACK)
        )
        suback = st.builds(
            Suback,
            pids,
            st.lists(codes(PacketType.SUBACK), min_size=1, max_size=4).map(tuple),
            properties(PacketType.SUBACK),
        )
        unsuback = st.builds(
            Unsuback,
            pids,
            st.lists(codes(PacketType.UNSUBACK), min_size=1, max_size=4).map(tuple),
            properties(PacketType.UNSUBACK),
        )
        extra = [
            st.builds(Disconnect, codes(PacketType.DISCONNECT), properties(PacketType.DISCONNECT)),
            st.builds(Auth, codes(PacketType.AUTH), properties(PacketType.AUTH)),
        ]
    else:
        connack = st.builds(
            Connack, st.booleans() if version == 4 else st.just(False), st.integers(0, 5)
        )
        suback = st.builds(
            Suback,
            pids,
            st.lists(st.sampled_from([0, 1, 2, 0x80]), min_size=1, max_size=4).map(tuple),
        )
        unsuback = st.builds(Unsuback, pids)
        extra = []
    return st.one_of(
        connack,
        publishes(version, from_server=True),
        _acks(version),
        suback,
        unsuback,
        st.just(PINGRESP),
        *extra,
    )
