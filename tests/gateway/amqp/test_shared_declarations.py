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


def test_declaration_log_snapshot_bounds_the_replay(tmp_path):
    """After `decl_snapshot_every` records a gateway writes a snapshot; a gateway starting
    later reads the snapshot and the records after it, not the whole log, and knows the
    same live declarations (deleted ones stay deleted)."""
    from gateway.amqp.broker import AmqpBroker, AmqpBrokerConfig
    from gateway.amqp.decl_log import DeclLog

    def client(gws: list[Gateway]):
        gw = gws[0]
        decl = gw.broker.decl
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.exchange_declare("snap-x", "topic", durable=True)
        for i in range(24):
            ch.queue_declare(f"snap-q{i}", durable=True, arguments={"x-max-length": i + 1})
        for i in range(0, 24, 5):
            ch.queue_delete(f"snap-q{i}")
        written = 1 + 24 + 5
        gw.wait_for(lambda: decl.read >= written)
        ch.queue_declare("snap-trigger")  # the writer checks after its next record
        gw.wait_for(lambda: decl.snapshots >= 1)
        ch.queue_declare("after-snapshot")
        ch.exchange_delete("snap-x")
        gw.wait_for(lambda: decl.read >= written + 4)

        async def fresh():
            b = gw.broker
            nb = AmqpBroker(gw.client, gw.addr, b.broker_name, b.routes, AmqpBrokerConfig())
            d = DeclLog(nb, "a-later-gateway")
            await d.replay()
            return ({n: q.arguments for n, q in nb.queues.items()}, set(nb.exchanges),
                    d.replayed)

        got = gw.call(fresh)
        conn.close()
        return written, got

    written, (queues, exchanges, replayed) = run_gateways(
        tmp_path, client, 1, AmqpBrokerConfig(decl_snapshot_every=10))
    live = {f"snap-q{i}" for i in range(24) if i % 5} | {"snap-trigger", "after-snapshot"}
    assert set(queues) == live
    assert queues["snap-q7"] == {"x-max-length": 8}
    assert "snap-x" not in exchanges and "amq.topic" in exchanges
    # The latest snapshot, what was written while it was taken and after it (about
    # decl_snapshot_every at most, depending on when the follower saw the records), not
    # the whole log (written + 4 records and the snapshots).
    assert replayed <= 2 * 10 < written
