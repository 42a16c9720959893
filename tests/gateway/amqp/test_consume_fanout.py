"""Deliveries of a message fanned out to many queues: the gateway reads the envelope
(exchange, routing key, AMQP properties) of the shared record once, not once per queue."""

from __future__ import annotations

import pika

from core.client.pop_consumer import PopMessage, PopRecord
from core.common.properties import encode_properties
from gateway.amqp import consume
from tests.gateway.amqp.broker_harness import declare_fanout, params, run_gateway


def test_fanned_out_record_envelope_is_read_once(tmp_path, monkeypatch):
    calls: list[int] = []
    original = consume._our_pairs

    def counting(raw: bytes) -> dict:
        calls.append(len(raw))
        return original(raw)

    monkeypatch.setattr(consume, "_our_pairs", counting)
    monkeypatch.setattr(consume, "_FANNED", {})
    queues = [f"fan-{i:02d}" for i in range(40)]
    # A large header: the record's properties pass the stored-properties cache's key bound.
    headers = {"h": "v" * 3000}

    def client(gw):
        with pika.BlockingConnection(params(gw.port)) as conn:
            ch = conn.channel()
            declare_fanout(ch, "fan", queues)
            ch.confirm_delivery()
            props = pika.BasicProperties(content_type="text/plain", headers=headers)
            ch.basic_publish("fan", "key", b"one", props)
            ch.basic_publish("fan", "key", b"two", props)
            got = []
            for q in queues:
                for _ in range(2):
                    method, p, body = ch.basic_get(q, auto_ack=True)
                    got.append((body, method.exchange, method.routing_key, p.content_type,
                                p.headers))
            return got

    got = run_gateway(tmp_path, client)
    assert got == [(b, "fan", "key", "text/plain", headers)
                   for _ in queues for b in (b"one", b"two")]
    # One read per published record (its first delivery); the other 39 pops share it.
    assert len(calls) == 2, calls


def _record(offsets: str) -> PopRecord:
    raw = encode_properties({"AMQP_EX": "x", "AMQP_RK": "k", "AMQP_P": "AAA=",
                             "INNER_MULTI_QUEUE_OFFSET": offsets}).encode()
    return PopRecord(b"b", raw, 1, 0, 0)


def test_fanned_cache_holds_multi_queue_records_only_and_is_bounded(monkeypatch):
    monkeypatch.setattr(consume, "_FANNED", {})
    monkeypatch.setattr(consume, "_fanned_bytes", 0)
    single = _record("7")
    consume._envelope(PopMessage(single, "%LMQ%q", 0, 7, "h"))
    assert not consume._FANNED  # popped once: nothing to share
    many = _record("7,8,9")
    first = consume._envelope(PopMessage(many, "%LMQ%q", 0, 7, "h"))
    assert consume._FANNED[id(many.raw_properties)] == (many.raw_properties, first)
    # An equal but distinct properties object is not an identity hit.
    other = PopRecord(b"b", bytes(bytearray(many.raw_properties)), 1, 0, 0)
    assert consume._envelope(PopMessage(other, "%LMQ%q", 0, 8, "h")) == first
    monkeypatch.setattr(consume, "_FANNED_MAX_BYTES", len(many.raw_properties) * 2)
    kept = [_record(f"{i},{i + 1}") for i in range(5)]
    for rec in kept:
        consume._envelope(PopMessage(rec, "%LMQ%q", 0, 1, "h"))
    assert 0 < len(consume._FANNED) <= 2
    assert consume._fanned_bytes <= consume._FANNED_MAX_BYTES
