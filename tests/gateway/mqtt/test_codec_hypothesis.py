"""Property tests of MqttCodec: round trips for every packet type and version, and fuzzing.

Whatever bytes arrive, the codec either returns packets or raises MqttProtocolError;
nothing else (IndexError, UnicodeDecodeError, struct.error, ValueError ...) may escape,
or a client could crash its connection handler.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.mqtt.codec import MqttCodec
from gateway.mqtt.packets import Connect, MqttProtocolError

from .strategies import client_packets, connects, server_packets

VERSIONS = [3, 4, 5]
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _server(version: int) -> MqttCodec:
    return MqttCodec(protocol_version=version)


def _client(version: int) -> MqttCodec:
    return MqttCodec(protocol_version=version, role="client")


@pytest.mark.parametrize("version", VERSIONS)
@given(data=st.data())
@settings(max_examples=150, deadline=None)
def test_connect_round_trip(version: int, data: Any) -> None:
    packet = data.draw(connects(version))
    wire = _client(version).encode(packet)
    assert MqttCodec().feed(wire) == [packet]


def _sent(data: Any, version: int, to_server: bool, max_size: int) -> tuple[list, bytes]:
    """Packets one side sends (1 to `max_size`, client ones when `to_server`) and their
    bytes as that side's codec encodes them."""
    sent_by, sender = ((client_packets, _client) if to_server else (server_packets, _server))
    packets = data.draw(st.lists(sent_by(version), min_size=1, max_size=max_size))
    codec = sender(version)
    return packets, b"".join(codec.encode(p) for p in packets)


def _receiver(version: int, to_server: bool) -> MqttCodec:
    return _server(version) if to_server else _client(version)


DIRECTIONS = pytest.mark.parametrize("to_server", [True, False],
                                     ids=["client-to-server", "server-to-client"])


@pytest.mark.parametrize("version", VERSIONS)
@DIRECTIONS
@given(data=st.data())
@settings(max_examples=300, deadline=None)
def test_round_trip(version: int, to_server: bool, data: Any) -> None:
    packets, wire = _sent(data, version, to_server, 4)
    assert _receiver(version, to_server).feed(wire) == packets


@pytest.mark.parametrize("version", VERSIONS)
@given(data=st.data())
@settings(max_examples=100, deadline=None)
def test_split_points_do_not_matter(version: int, data: Any) -> None:
    packets = data.draw(st.lists(client_packets(version), min_size=1, max_size=4))
    wire = b"".join(_client(version).encode(p) for p in packets)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=6)))
    codec = _server(version)
    got = []
    for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        got += codec.feed(wire[a:b])
    assert got == packets


def _feed_safely(codec: MqttCodec, chunks: list[bytes]) -> None:
    try:
        for chunk in chunks:
            codec.feed(chunk)
    except MqttProtocolError:
        pass


def _codecs() -> list[MqttCodec]:
    return [
        MqttCodec(),  # waits for CONNECT
        MqttCodec(max_packet_size=64),
        *(_server(v) for v in VERSIONS),
        *(_client(v) for v in VERSIONS),
        MqttCodec(protocol_version=5, topic_alias_maximum=5),
    ]


@given(st.lists(st.binary(max_size=64), max_size=4))
@FUZZ
def test_random_bytes_only_raise_protocol_errors(chunks: list[bytes]) -> None:
    for codec in _codecs():
        _feed_safely(codec, chunks)


@st.composite
def mutated(draw: Any, wire: bytes) -> bytes:
    data = bytearray(wire)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "cut", "insert", "delete"]))
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            data[i] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF, 0xC0, 0xED]))
        elif kind == "cut":
            del data[i:]
        elif kind == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=4))
        else:
            del data[i]
    return bytes(data)


@pytest.mark.parametrize("version", VERSIONS)
@DIRECTIONS
@given(data=st.data())
@FUZZ
def test_mutated_packets_only_raise_protocol_errors(version: int, to_server: bool,
                                                   data: Any) -> None:
    _packets, wire = _sent(data, version, to_server, 3)
    _feed_safely(_receiver(version, to_server), [data.draw(mutated(wire))])


@pytest.mark.parametrize("version", VERSIONS)
@given(data=st.data())
@FUZZ
def test_mutated_connect_only_raises_protocol_errors(version: int, data: Any) -> None:
    packet: Connect = data.draw(connects(version))
    wire = _client(version).encode(packet)
    _feed_safely(MqttCodec(), [data.draw(mutated(wire))])
