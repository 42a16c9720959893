"""Exchange and queue declarations shared by the gateways of one cluster (the declaration
log, gateway/amqp/decl_log.py): declared through one gateway, served by another."""

from __future__ import annotations

import time

import pika
import pytest

from tests.gateway.amqp.broker_harness import Gateway, params, run_gateways

pytestmark = pytest.mark.timeout(120)


def test_declared_on_one_gateway_served_and_deleted_on_another(tmp_path):
    def client(gws: list[Gateway]):
        a, b = gws
        conn_a = pika.BlockingConnection(params(a.port))
        conn_b = pika.BlockingConnection(params(b.port))
        ch_a = conn_a.channel()
        ch_a.exchange_declare("orders", "topic", durable=True)
        ch_a.queue_declare("billing", durable=True, arguments={"x-message-ttl": 600000})
        b.wait_for(lambda: "billing" in b.broker.queues and "orders" in b.broker.exchanges)
        ch_b = conn_b.channel()
        # No declare through B: the queue and the exchange are known there.
        ch_b.queue_bind("billing", "orders", "order.*")
        ch_b.queue_declare("billing", passive=True)
        adopted = b.broker.queues["billing"].args.message_ttl
        ch_a.confirm_delivery()
        ch_a.basic_publish("orders", "order.paid", b"42")
        m, _, body = ch_b.basic_get("billing", auto_ack=True)
        cancelled: list = []
        ch_b.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
        tag = ch_b.basic_consume("billing", lambda *x: None)
        ch_a.queue_delete("billing")
        deadline = time.monotonic() + 20
        while not cancelled and time.monotonic() < deadline:
            conn_b.process_data_events(time_limit=0.1)
        b.wait_for(lambda: "billing" not in b.broker.queues)
        gone = True
        conn_a.close()
        conn_b.close()
        return adopted, body, cancelled == [tag], gone

    assert run_gateways(tmp_path, client, 2) == (600000, b"42", True, True)
