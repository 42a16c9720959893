"""Queue.Purge, Queue.Delete (if-unused, if-empty, Basic.Cancel to consumers),
Exchange.Delete if-unused, exchange-to-exchange and headers bindings end to end, driven
by pika over a real broker."""

from __future__ import annotations

import time

import pika
import pytest

from tests.gateway.amqp.broker_harness import Gateway, params, run_gateway
from tests.gateway.amqp.test_broker_pika import _closed_with
from tests.gateway.amqp.test_queue_args_pika import _drain

pytestmark = pytest.mark.timeout(120)


def test_purge_drops_ready_messages_and_keeps_unacknowledged_ones(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.queue_declare("p")
        for i in range(5):
            ch.basic_publish("", "p", b"%d" % i)
        held, _, first = ch.basic_get("p")  # unacknowledged: survives the purge
        purged = ch.queue_purge("p").method.message_count
        after = ch.basic_get("p", auto_ack=True)[0]
        ch.basic_nack(held.delivery_tag, requeue=True)
        back = _drain(ch, "p")
        ch.basic_publish("", "p", b"new")
        new = _drain(ch, "p")
        empty = ch.queue_purge("p").method.message_count
        conn.close()
        return first, purged, after, [b for b, _ in back], [b for b, _ in new], empty

    assert run_gateway(tmp_path, client) == (b"0", 4, None, [b"0"], [b"new"], 0)


def test_queue_delete_checks_and_cancels_its_consumers(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.queue_declare("d")
        for i in range(3):
            ch.basic_publish("", "d", b"%d" % i)
        out = {"if-empty": _closed_with(
            lambda: conn.channel().queue_delete("d", if_empty=True))}
        cons = conn.channel()
        cons.basic_qos(prefetch_count=1)
        cancelled: list = []
        cons.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
        delivered: list = []
        tag = cons.basic_consume("d", lambda _c, m, _p, body: delivered.append(body))
        deadline = time.monotonic() + 10
        while not delivered and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        out["if-unused"] = _closed_with(
            lambda: conn.channel().queue_delete("d", if_unused=True))
        ch = conn.channel()
        deleted = ch.queue_delete("d").method.message_count
        deadline = time.monotonic() + 10
        while not cancelled and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        again = ch.queue_declare("d").method.message_count  # a new, empty queue
        gone = ch.basic_get("d")[0]
        conn.close()
        return ({k: v[0] for k, v in out.items()}, deleted, cancelled == [tag], again, gone)

    codes, deleted, notified, again, gone = run_gateway(tmp_path, client)
    assert codes == {"if-empty": 406, "if-unused": 406}
    assert deleted == 2  # ready ones (RabbitMQ's count): not the one delivered, unacked
    assert notified
    assert (again, gone) == (0, None)


def test_exchange_to_exchange_and_headers_bindings_route_end_to_end(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.exchange_declare("src", "topic")
        ch.exchange_declare("dst", "fanout")
        ch.exchange_declare("hdr", "headers")
        for q in ("via-dst", "all", "any"):
            ch.queue_declare(q)
        ch.exchange_bind("dst", "src", "orders.*")
        ch.queue_bind("via-dst", "dst")
        ch.queue_bind("all", "hdr", arguments={"x-match": "all", "a": 1, "b": "two"})
        ch.queue_bind("any", "hdr", arguments={"x-match": "any", "a": 1, "b": "two"})
        ch.basic_publish("src", "orders.new", b"routed")
        ch.basic_publish("src", "invoices.new", b"not-routed")
        for body, headers in ((b"both", {"a": 1, "b": "two"}), (b"only-a", {"a": 1}),
                              (b"none", {"a": 2})):
            ch.basic_publish("hdr", "", body, pika.BasicProperties(headers=headers))
        out = {"in use": _closed_with(lambda: conn.channel().exchange_delete(
            "src", if_unused=True))}
        ch = conn.channel()
        ch.exchange_unbind("dst", "src", "orders.*")
        ch.basic_publish("src", "orders.late", b"after-unbind")
        ch.exchange_delete("src", if_unused=True)  # unused now
        out["deleted"] = _closed_with(lambda: conn.channel().exchange_declare(
            "src", passive=True))
        got = {q: [b for b, _ in _drain(ch, q)] for q in ("via-dst", "all", "any")}
        conn.close()
        return {k: v[0] for k, v in out.items()}, got

    codes, got = run_gateway(tmp_path, client)
    assert codes == {"in use": 406, "deleted": 404}
    assert got == {"via-dst": [b"routed"], "all": [b"both"], "any": [b"both", b"only-a"]}
