"""Shared by the tests of the C scans of the MQTT codec (`publish_runs`: test_publish_run,
test_puback_run): raw packet bytes, a codec past CONNECT, and the packets decoded with
the runs spelled out as the Python decoder gives them."""

from __future__ import annotations

from gateway.mqtt.codec import MqttCodec, PubackRun, PublishRun
from gateway.mqtt.packets import Connect, MqttProtocolError, Puback, Publish
from gateway.mqtt.properties import encode_varint


def raw(first: int, body: bytes) -> bytes:
    """A packet: its first byte, the remaining length and `body`."""
    return bytes((first,)) + encode_varint(len(body)) + body


def run_codec(version: int, runs: bool, max_packet_size: int = 4096) -> MqttCodec:
    """A server codec that has read a CONNECT of `version`, with `publish_runs` on or off."""
    codec = MqttCodec(max_packet_size)
    codec.publish_runs = runs
    hello = MqttCodec(protocol_version=version, role="client").encode(Connect("c", version))
    assert len(codec.feed(hello)) == 1
    return codec


def flatten(packets: list) -> list:
    """PublishRun and PubackRun items as the Publish and Puback the Python decoder gives."""
    out: list = []
    for p in packets:
        if type(p) is PubackRun:
            out += [Puback(pid) for pid in p]
        elif type(p) is PublishRun:
            out += [Publish(t, pl, (f >> 1) & 3, bool(f & 1), bool(f & 8), pid)
                    for t, pl, f, pid in p]
        else:
            out.append(p)
    return out


def feed_chunks(codec: MqttCodec, chunks: list[bytes]):
    """(packets, None), or (the packets before the fault, (reason code, message))."""
    packets: list = []
    try:
        for chunk in chunks:
            packets += codec.feed(chunk)
    except MqttProtocolError as exc:
        return packets + list(exc.packets), (exc.reason_code, str(exc))
    return packets, None
