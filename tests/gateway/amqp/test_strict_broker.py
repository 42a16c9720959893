"""The AMQP gateway in front of a broker that speaks only Apache RocketMQ 5's codes (ours in
`apache_strict` mode): it falls back from lmq-gateway's private POP codes (docs/amqp.md,
"In front of an Apache RocketMQ 5 broker")."""

from __future__ import annotations

import logging

import pika
import pytest

from tests.gateway.amqp.broker_harness import Gateway, params, run_gateway

pytestmark = pytest.mark.timeout(120)


def _drain(ch, queue: str, n: int) -> list:
    got = []
    for method, _props, body in ch.consume(queue, inactivity_timeout=10):
        if method is None:
            break
        got.append((method, body))
        if len(got) == n:
            break
    return got


def test_pika_on_a_strict_broker(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="gateway.amqp.broker")

    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare("orders", "direct", durable=True)
        ch.queue_declare("strict-q", durable=True)
        ch.queue_bind("strict-q", "orders", "new")
        for i in range(6):  # each confirmed (pika raises on a nack)
            ch.basic_publish("orders", "new", b"m%d" % i,
                             pika.BasicProperties(delivery_mode=2), mandatory=True)
        ch.basic_qos(prefetch_count=10)
        first = _drain(ch, "strict-q", 6)
        tags = {body: m.delivery_tag for m, body in first}
        ch.basic_nack(tags[b"m0"], requeue=True)   # back at once, redelivered
        ch.basic_reject(tags[b"m1"], requeue=False)  # no DLX: dropped, never again
        for body in (b"m2", b"m3", b"m4", b"m5"):
            ch.basic_ack(tags[body])
        again = _drain(ch, "strict-q", 1)
        ch.basic_ack(again[0][0].delivery_tag)
        ch.cancel()
        nothing = ch.basic_get("strict-q")[0]
        # Purge without POP_PURGE: the ready messages go, an unacknowledged one stays.
        for i in range(4):
            ch.basic_publish("orders", "new", b"p%d" % i)
        held = ch.basic_get("strict-q")
        purged = ch.queue_purge("strict-q").method.message_count
        after_purge = ch.basic_get("strict-q")[0]
        ch.basic_ack(held[0].delivery_tag)
        # Nothing left unacknowledged (the rejected m1 included): the group's consumed
        # offset reached the queue's end.
        left = gw.call(gw.broker.message_count, gw.broker.queues["strict-q"])
        ch.queue_delete("strict-q")
        conn.close()
        return ([body for _, body in first], again, nothing, held[2], purged, after_purge,
                left, gw.broker.extensions)

    first, again, nothing, held, purged, after_purge, left, extensions = run_gateway(
        tmp_path, client, broker_kw={"apache_strict": True})
    assert extensions is False
    assert first == [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5"]
    assert [(m.redelivered, body) for m, body in again] == [(True, b"m0")]
    assert nothing is None  # m1 was rejected without requeue: not delivered again
    assert held == b"p0" and purged == 3 and after_purge is None
    assert left == 0
    assert "Apache RocketMQ 5 POP only" in caplog.text
