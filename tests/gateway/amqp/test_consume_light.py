"""The consumer's light path (PopRecord): exchange, routing key and AMQP properties read
out of the encoded properties agree with the full decode (`dead_letter.envelope`)."""

from __future__ import annotations

import base64

from core.client.pop_consumer import PopMessage, PopRecord
from core.common.properties import decode_properties_bytes, encode_properties
from gateway.amqp.broker import PROP_EXCHANGE, PROP_PROPERTIES, PROP_ROUTING_KEY, PROP_TTL
from gateway.amqp.codec import deliver_tail
from gateway.amqp.consume import _envelope
from gateway.amqp.dead_letter import envelope
from gateway.amqp.model import quote_text
from gateway.mqtt.message import K_EXPIRY, K_TOPIC


def light(props: dict) -> PopMessage:
    raw = encode_properties(props).encode()
    return PopMessage(PopRecord(b"body", raw, 5, 0, 0), "%LMQ%q", 0, 1, "h")


def test_light_envelope_agrees_with_the_full_decode():
    cases = [
        {PROP_EXCHANGE: quote_text("amq.topic"), PROP_ROUTING_KEY: quote_text("a.b"),
         PROP_PROPERTIES: base64.b64encode(b"\x80\x00\x01x").decode()},
        {PROP_EXCHANGE: quote_text("ex with space/é%"),
         PROP_ROUTING_KEY: quote_text("k\udcff\x7f;=&"), "XAMQP_RK": "decoy"},
        {"OTHER": f"{PROP_EXCHANGE}\x01".replace("\x01", "") + "v"},
        {},
        {"INNER_MULTI_DISPATCH": ",".join(f"%LMQ%AMQP_q{i}" for i in range(100)),
         PROP_EXCHANGE: "x", PROP_ROUTING_KEY: "", "AMQP_X": "AMQP_EX\x01no",
         "INNER_MULTI_QUEUE_OFFSET": ",".join(map(str, range(100)))},
        # Published by an MQTT client (the amq.topic bridge): no AMQP_P.
        {K_TOPIC: "a/b", "MQTT_QOS": "1", "MQTT_CT": "text/plain"},
        {K_TOPIC + "64": "YS9i", PROP_EXCHANGE: "amq.topic"},
    ]
    for props in cases:
        m = light(props)
        got = _envelope(m)
        m.message._props = None
        assert got[:3] == envelope(m)
        assert got[4] == deliver_tail(got[0], got[1])  # Basic.Deliver's encoded fields
        assert m.message.properties == decode_properties_bytes(m.message.raw_properties)
    assert _envelope(light({}))[2] == b"\x00\x00"


def test_own_expiration_seen_only_with_the_ttl_property():
    assert _envelope(light({PROP_TTL: "100"}))[3]
    assert _envelope(light({"AMQP_TTLX": "1", PROP_EXCHANGE: "x"}))[3] is False
    assert _envelope(light({PROP_EXCHANGE: "x", "K": "AMQP_TTL"}))[3] is False
    assert _envelope(light({K_TOPIC: "a/b", K_EXPIRY: "99"}))[3]
    assert _envelope(light({PROP_PROPERTIES: "AAA=", K_EXPIRY: "99"}))[3]


def test_records_differing_only_in_their_queue_offsets_share_one_envelope():
    def stored(offset: str, **after: str) -> PopMessage:
        return light({"INNER_MULTI_DISPATCH": "%LMQ%a_q", PROP_EXCHANGE: "x",
                      PROP_ROUTING_KEY: "k", PROP_PROPERTIES: "AAA=",
                      "INNER_MULTI_QUEUE_OFFSET": offset, **after})

    first = _envelope(stored("1"))
    assert _envelope(stored("2")) is first  # the offsets pair is skipped: one lookup
    # Anything after the offsets pair is read again, never taken from that cache.
    later = _envelope(stored("3", **{PROP_ROUTING_KEY: "other"}))
    assert later[1] == "other"
    expiring = _envelope(stored("4", **{PROP_TTL: "100"}))
    assert expiring[3] and not first[3]
