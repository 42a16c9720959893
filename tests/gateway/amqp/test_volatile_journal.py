"""A non-durable AMQP queue's acknowledgement state is volatile (docs/pop.md "Volatile
states"): consuming it with manual acks, nacks and Basic.Get writes nothing to the
broker's POP journal; a durable queue's consumption is journaled as before. Over POP
requests (`lmq amqp`) and in process (`lmq serve`)."""

from __future__ import annotations

import time

import pika
import pytest

from tests.gateway.amqp.broker_harness import Gateway, params, run_gateway


def consume_all(ch, queue: str, count: int) -> list[bytes]:
    """`count` deliveries acked, after one nack with requeue (a redelivery and its ack)."""
    deliveries = ch.consume(queue, inactivity_timeout=10)
    method, _, _ = next(deliveries)
    assert method is not None, "no delivery"
    ch.basic_nack(method.delivery_tag, requeue=True)
    got = []
    for _ in range(count):
        method, _, body = next(deliveries)
        assert method is not None, "no delivery"
        got.append(body)
        ch.basic_ack(method.delivery_tag)
    ch.cancel()
    return got


@pytest.mark.parametrize("in_process", [True, False])
def test_non_durable_queue_writes_no_pop_journal(tmp_path, in_process):
    count = 6

    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.confirm_delivery()
        out = {}
        for name, durable in (("transient", False), ("kept", True)):
            ch.queue_declare(name, durable=durable)
            for i in range(count + 1):
                ch.basic_publish("", name, f"m{i}".encode())
            method, _, body = ch.basic_get(name)
            assert body == b"m0"
            ch.basic_ack(method.delivery_tag)
            out[name] = consume_all(ch, name, count)
            queue = gw.broker.queues[name]
            deadline = time.monotonic() + 20
            while gw.call(gw.broker.message_count, queue):  # every ack applied
                assert time.monotonic() < deadline, "acks not applied"
                time.sleep(0.02)
            out[name + ".lmq"] = queue.lmq
        conn.close()
        return out

    out = run_gateway(tmp_path, client, in_process=in_process)
    expected = [f"m{i}".encode() for i in range(1, count + 1)]
    assert sorted(out["transient"]) == sorted(out["kept"]) == expected
    with open(tmp_path / "data" / "pop" / "journal", "rb") as f:
        lines = f.read().decode().splitlines()
    assert not [ln for ln in lines if f" {out['transient.lmq']} " in ln]
    kept = {ln[0] for ln in lines if f" {out['kept.lmq']} " in ln}
    assert {"C", "P", "B"} <= kept, lines
