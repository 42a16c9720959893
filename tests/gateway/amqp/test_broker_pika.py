"""Exchanges, queues, bindings and publish over a real broker, driven by pika."""

from __future__ import annotations

import base64

import pika
import pika.exceptions
import pytest
import trio

from gateway.amqp.broker import PROP_PROPERTIES, PROP_ROUTING_KEY
from gateway.amqp.properties import decode_properties
from tests.gateway.amqp.broker_harness import Gateway, params, run_gateway, run_gateways

pytestmark = pytest.mark.timeout(120)


def _lmq(gw: Gateway, queue: str) -> str:
    return gw.broker.queues[queue].lmq


def test_topic_exchange_fans_out_one_stored_copy(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.exchange_declare("events", "topic")
        for queue, pattern in (("q-star", "order.*"), ("q-hash", "order.#"),
                               ("q-other", "invoice.*")):
            ch.queue_declare(queue)
            ch.queue_bind(queue, "events", pattern)
        props = pika.BasicProperties(content_type="application/json", delivery_mode=2,
                                     headers={"tenant": "acme", "n": 7})
        ch.basic_publish("events", "order.created", b'{"id": 1}', props)
        ch.basic_publish("events", "order.created.late", b"second")  # only order.#
        conn.close()
        gw.wait_idle()
        got = {q: gw.lmq_messages(_lmq(gw, q)) for q in ("q-star", "q-hash", "q-other")}
        return got, gw.stored_count()

    got, stored = run_gateway(tmp_path, client)
    assert stored == 2  # two publishes, each stored once however many queues it reached
    assert [m.body for m in got["q-star"]] == [b'{"id": 1}']
    assert [m.body for m in got["q-hash"]] == [b'{"id": 1}', b"second"]
    assert got["q-other"] == []
    # Both queues hold the same stored message, not copies.
    assert got["q-star"][0].commitlog_offset == got["q-hash"][0].commitlog_offset
    first = got["q-hash"][0]
    assert first.properties[PROP_ROUTING_KEY] == "order.created"
    props = decode_properties(base64.b64decode(first.properties[PROP_PROPERTIES]))
    assert props.content_type == "application/json" and props.delivery_mode == 2
    assert props.headers == {"tenant": "acme", "n": 7}


def test_direct_fanout_headers_and_default_exchange(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        for name in ("d1", "f1", "h1", "plain"):
            ch.queue_declare(name)
        ch.queue_bind("d1", "amq.direct", "key-a")
        ch.exchange_declare("fan", "fanout")
        ch.queue_bind("f1", "fan", "ignored")
        ch.queue_bind("h1", "amq.headers", "", arguments={"x-match": "any", "kind": "x"})
        ch.basic_publish("amq.direct", "key-a", b"direct")
        ch.basic_publish("amq.direct", "key-b", b"nobody")
        ch.basic_publish("fan", "whatever", b"fanout")
        ch.basic_publish("amq.headers", "", b"headers",
                         pika.BasicProperties(headers={"kind": "x"}))
        ch.basic_publish("amq.headers", "", b"no-match",
                         pika.BasicProperties(headers={"kind": "y"}))
        ch.basic_publish("", "plain", b"default")
        ch.queue_unbind("d1", "amq.direct", "key-a")
        ch.basic_publish("amq.direct", "key-a", b"after-unbind")
        conn.close()
        gw.wait_idle()
        return {q: [m.body for m in gw.lmq_messages(_lmq(gw, q))]
                for q in ("d1", "f1", "h1", "plain")}

    assert run_gateway(tmp_path, client) == {
        "d1": [b"direct"], "f1": [b"fanout"], "h1": [b"headers"], "plain": [b"default"]}


def test_server_named_exclusive_queue_and_confirms(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.confirm_delivery()
        name = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(name, "amq.topic", "a.b")
        ch.basic_publish("amq.topic", "a.b", b"confirmed")  # returns once acked
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish("amq.topic", "no.route", b"x", mandatory=True)
        ch.basic_publish("amq.topic", "no.route", b"dropped")  # not mandatory: just acked
        # Another connection may not use the exclusive queue (405 RESOURCE_LOCKED).
        other = pika.BlockingConnection(params(gw.port))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as locked:
            other.channel().queue_declare(name, passive=True)
        other.close()
        lmq = _lmq(gw, name)
        bodies = [m.body for m in gw.lmq_messages(lmq)]
        stored = gw.stored_count()
        conn.close()
        gw.wait_for(lambda: name not in gw.broker.queues)  # dies with its connection
        return name, bodies, stored, locked.value.reply_code

    name, bodies, stored, locked = run_gateway(tmp_path, client)
    assert name.startswith("amq.gen-")
    assert bodies == [b"confirmed"]
    assert stored == 1  # unroutable messages are not stored
    assert locked == 405


def _closed_with(ch_call) -> tuple[int, str]:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch_call()
    return info.value.reply_code, info.value.reply_text


def test_misuse_gets_rabbitmq_reply_codes(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        out = {}
        out["passive exchange"] = _closed_with(
            lambda: conn.channel().exchange_declare("missing", passive=True))
        out["passive queue"] = _closed_with(
            lambda: conn.channel().queue_declare("missing", passive=True))
        out["amq exchange"] = _closed_with(
            lambda: conn.channel().exchange_declare("amq.mine", "direct"))
        out["amq queue"] = _closed_with(lambda: conn.channel().queue_declare("amq.mine"))
        ch = conn.channel()
        ch.queue_declare("q", durable=True)
        ch.exchange_declare("x", "direct")
        out["queue redeclare"] = _closed_with(lambda: ch.queue_declare("q", durable=False))
        ch = conn.channel()
        out["exchange redeclare"] = _closed_with(lambda: ch.exchange_declare("x", "fanout"))
        out["bind missing queue"] = _closed_with(
            lambda: conn.channel().queue_bind("nope", "x", "k"))
        out["bind missing exchange"] = _closed_with(
            lambda: conn.channel().queue_bind("q", "nope", "k"))
        ch = conn.channel()
        ch.confirm_delivery()
        out["publish missing exchange"] = _closed_with(
            lambda: ch.basic_publish("nope", "k", b"x"))
        # The connection survived every channel error.
        ch = conn.channel()
        ch.queue_declare("q", durable=True)  # same arguments: fine
        ch.exchange_declare("amq.direct", passive=True)  # predefined
        alive = conn.is_open
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as hard:
            conn.channel().exchange_declare("y", "no-such-type")
        return out, alive, hard.value.reply_code

    out, alive, hard = run_gateway(tmp_path, client)
    codes = {k: v[0] for k, v in out.items()}
    assert codes == {"passive exchange": 404, "passive queue": 404, "amq exchange": 403,
                     "amq queue": 403, "queue redeclare": 406, "exchange redeclare": 406,
                     "bind missing queue": 404, "bind missing exchange": 404,
                     "publish missing exchange": 404}
    assert out["queue redeclare"][1] == ("PRECONDITION_FAILED - inequivalent arg 'durable' for "
                                         "queue 'q' in vhost '/': received 'false' but current "
                                         "is 'true'")
    assert out["passive exchange"][1] == "NOT_FOUND - no exchange 'missing' in vhost '/'"
    assert alive
    assert hard == 503


def test_consume_ack_round_trip_and_nack_requeue_redelivers(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.queue_declare("work")
        ch.queue_bind("work", "amq.direct", "job")
        for i in range(3):
            ch.basic_publish("amq.direct", "job", f"m{i}".encode(),
                             pika.BasicProperties(content_type="text/plain",
                                                  headers={"i": i}))
        ch.basic_qos(prefetch_count=10)
        seen = []
        for method, props, body in ch.consume("work", inactivity_timeout=10):
            assert method is not None, "no delivery"
            seen.append((body, method.redelivered, method.routing_key, props.headers))
            if body == b"m1" and not method.redelivered:
                ch.basic_nack(method.delivery_tag, requeue=True)  # comes back redelivered
            else:
                ch.basic_ack(method.delivery_tag)
            if len(seen) == 4:
                break
        ch.cancel()
        # Everything acknowledged: a new consumer (another connection) gets nothing.
        other = pika.BlockingConnection(params(gw.port))
        got = other.channel().basic_get("work", auto_ack=False)
        other.close()
        conn.close()
        return seen, got

    seen, got = run_gateway(tmp_path, client)
    assert sorted(b for b, *_ in seen) == [b"m0", b"m1", b"m1", b"m2"]
    firsts = [(b, r) for b, r, *_ in seen]
    assert (b"m1", False) in firsts and (b"m1", True) in firsts
    assert all(r is False for b, r in firsts if b != b"m1")
    assert seen[0][2] == "job" and seen[0][3] == {"i": 0}
    assert got == (None, None, None)


def test_basic_get_and_unacked_requeued_on_close(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.queue_declare("g")
        empty = ch.basic_get("g")
        ch.basic_publish("", "g", b"one")
        ch.basic_publish("", "g", b"two")
        m1, _, b1 = ch.basic_get("g", auto_ack=False)
        ch.close()  # m1 left unacknowledged: back to the queue at once
        ch = conn.channel()
        seen = []
        for _ in range(2):
            m, _, b = ch.basic_get("g", auto_ack=False)
            seen.append((b, m.redelivered))
            ch.basic_ack(m.delivery_tag)
        last = ch.basic_get("g")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.basic_ack(999)
            ch.basic_get("g")  # the 406 arrives by now
        conn.close()
        return empty, (b1, m1.redelivered), sorted(seen), last, info.value.reply_code

    empty, first, seen, last, code = run_gateway(tmp_path, client)
    assert empty == (None, None, None)
    assert first == (b"one", False)
    assert seen == [(b"one", True), (b"two", False)]
    assert last == (None, None, None)
    assert code == 406


def test_crashed_gateways_unacked_deliveries_return_at_once(tmp_path):
    def client(gws: list[Gateway]):
        a, b = gws
        conn_a = pika.BlockingConnection(params(a.port))
        ch_a = conn_a.channel()
        ch_a.queue_declare("shared", durable=True)
        ch_a.basic_publish("", "shared", b"precious")
        method, _, body = ch_a.basic_get("shared", auto_ack=False)
        assert body == b"precious" and not method.redelivered
        # Gateway A "crashes": its broker connections drop without any nack or release
        # (what the broker sees of a gateway killed with -9).
        a.call(a.drop_broker_connections)
        conn_b = pika.BlockingConnection(params(b.port))
        ch_b = conn_b.channel()
        ch_b.queue_declare("shared", durable=True)  # declarations are per gateway yet
        got = None
        for m, _, bd in ch_b.consume("shared", inactivity_timeout=15):
            got = (bd, m.redelivered) if m is not None else None
            if m is not None:
                ch_b.basic_ack(m.delivery_tag)
            break
        ch_b.cancel()
        conn_b.close()
        conn_a.close()
        return got

    # The invisibility deadline is 30 min: only the holder release can bring it back.
    assert run_gateways(tmp_path, client, 2) == (b"precious", True)


def test_queue_and_binding_limits_refused_on_the_channel(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.queue_declare("one")
        ch.queue_declare("two")
        over = _closed_with(lambda: ch.queue_declare("three"))
        ch = conn.channel()
        ch.queue_declare("one")  # redeclaring an existing queue is not a new one
        ch.queue_bind("one", "amq.direct", "a")
        ch.queue_bind("one", "amq.direct", "a")  # the same binding again: no new route
        ch.queue_bind("one", "amq.direct", "b")
        bind_over = _closed_with(lambda: ch.queue_bind("one", "amq.direct", "c"))
        conn.close()
        return over, bind_over

    from gateway.amqp.broker import AmqpBrokerConfig

    config = AmqpBrokerConfig(max_queues=2, max_bindings_per_queue=2)
    over, bind_over = run_gateway(tmp_path, client, config)
    assert over[0] == 406 and "queue limit" in over[1]
    assert bind_over[0] == 406


def test_names_that_are_not_utf8_get_errors_not_crashes(tmp_path):
    from gateway.amqp.codec import encode_content, encode_method_frame
    from gateway.amqp.methods import (
        BasicPublish,
        ChannelClose,
        ChannelOpen,
        ChannelOpenOk,
        QueueDeclare,
    )
    from gateway.amqp.properties import BasicProperties
    from tests.gateway.amqp.test_server_pika import _raw_handshake, _read_until

    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.queue_declare("all")
        ch.queue_bind("all", "amq.topic", "#")
        s, decoder = _raw_handshake(gw.port, heartbeat=0)
        with s:
            s.sendall(encode_method_frame(1, ChannelOpen()))
            _read_until(s, decoder, ChannelOpenOk)
            key = b"odd.\xff".decode("utf-8", "surrogateescape")
            s.sendall(encode_content(1, BasicPublish(0, "amq.topic", key, False, False),
                                     BasicProperties(), b"raw octets"))
            s.sendall(encode_method_frame(1, QueueDeclare(0, key)))
            close = _read_until(s, decoder, ChannelClose)
            s.sendall(encode_method_frame(2, ChannelOpen()))
            _read_until(s, decoder, ChannelOpenOk)  # the connection is fine
        stored = gw.lmq_messages(_lmq(gw, "all"))
        conn.close()
        return close.reply_code, [(m.body, m.properties[PROP_ROUTING_KEY]) for m in stored]

    code, stored = run_gateway(tmp_path, client)
    assert code == 406
    assert stored == [(b"raw octets", "odd.%FF")]


def test_acks_reach_the_broker_and_unacked_come_back_after_the_deadline(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.queue_declare("dl")
        for body in (b"acked", b"acked-too", b"kept"):
            ch.basic_publish("", "dl", body)
        ch.basic_get("dl", auto_ack=False)
        m2, _, _ = ch.basic_get("dl", auto_ack=False)
        held, _, b1 = ch.basic_get("dl", auto_ack=False)
        ch.basic_ack(m2.delivery_tag, multiple=True)  # the first two; `held` stays out
        # Past the (short) invisibility deadline: only the unacknowledged one returns.
        gw.call(trio.sleep, 2.5)
        other = pika.BlockingConnection(params(gw.port))
        och = other.channel()
        back = []
        while True:
            m, _, body = och.basic_get("dl", auto_ack=True)
            if m is None:
                break
            back.append((body, m.redelivered))
        other.close()
        conn.close()
        return b1, back

    from gateway.amqp.broker import AmqpBrokerConfig

    b1, back = run_gateway(tmp_path, client, AmqpBrokerConfig(invisible_ms=1000))
    assert b1 == b"kept"
    assert back == [(b"kept", True)]


def test_publishes_of_a_connection_keep_their_order_in_every_queue(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        for q in ("ord-a", "ord-b"):
            ch.queue_declare(q)
            ch.queue_bind(q, "amq.topic", "#")
        for i in range(60):  # a different routing key each time, stored in batches
            ch.basic_publish("amq.topic", f"k{i}.x", str(i).encode())
        conn.close()
        gw.wait_idle()
        return [[m.body for m in gw.lmq_messages(_lmq(gw, q))] for q in ("ord-a", "ord-b")]

    a, b = run_gateway(tmp_path, client)
    assert a == b == [str(i).encode() for i in range(60)]


def test_confirm_nack_when_the_broker_refuses_and_the_rest_are_stored(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.queue_declare("nk")
        # Without confirms, three publishes that may share a batch; the middle one is too
        # big for the broker: a refused batch is sent again one by one.
        plain = conn.channel()
        for body in (b"small-1", b"x" * 100_000, b"small-2"):
            plain.basic_publish("", "nk", body)
        ch.confirm_delivery()
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", "nk", b"y" * 100_000)
        ch.basic_publish("", "nk", b"small-3")  # acked
        conn.close()
        gw.wait_idle()
        return [m.body for m in gw.lmq_messages(_lmq(gw, "nk"))]

    bodies = run_gateway(tmp_path, client, broker_kw={"max_message_size": 64 * 1024})
    assert bodies == [b"small-1", b"small-2", b"small-3"]


def test_two_gateways_share_bindings_and_compete_for_one_queue(tmp_path):
    def client(gws: list[Gateway]):
        a, b = gws
        conn_a = pika.BlockingConnection(params(a.port))
        conn_b = pika.BlockingConnection(params(b.port))
        ch_a, ch_b = conn_a.channel(), conn_b.channel()
        ch_a.queue_declare("shared-work")
        ch_a.queue_bind("shared-work", "amq.direct", "task")  # bound through gateway A
        ch_b.queue_declare("shared-work")
        ch_b.confirm_delivery()
        for i in range(20):  # published through gateway B: the route log carried the bind
            ch_b.basic_publish("amq.direct", "task", str(i).encode())
        got = []
        for _ in range(30):
            for ch in (ch_a, ch_b):
                m, _, body = ch.basic_get("shared-work", auto_ack=True)
                if m is not None:
                    got.append((body, m.redelivered))
        conn_a.close()
        conn_b.close()
        return got

    got = run_gateways(tmp_path, client, 2)
    assert sorted(int(b) for b, _ in got) == list(range(20))  # each exactly once
    assert not any(r for _, r in got)


def test_recover_requeues_and_auto_delete_queue_goes_with_its_last_consumer(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.queue_declare("rec")
        ch.basic_publish("", "rec", b"again")
        m, _, _ = ch.basic_get("rec", auto_ack=False)
        ch.basic_recover(requeue=True)
        again, _, body = ch.basic_get("rec", auto_ack=True)
        ch.queue_declare("temp", auto_delete=True)
        tag = ch.basic_consume("temp", lambda *a: None)
        before = "temp" in gw.broker.queues
        ch.basic_cancel(tag)
        after = "temp" in gw.broker.queues
        conn.close()
        return (m.redelivered, again.redelivered, body), before, after

    got, before, after = run_gateway(tmp_path, client)
    assert got == (False, True, b"again")
    assert before and not after


def test_exclusive_consumer_refuses_others(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.queue_declare("solo")
        tag = ch.basic_consume("solo", lambda *a: None, exclusive=True)
        other = conn.channel()
        refused = _closed_with(lambda: other.basic_consume("solo", lambda *a: None))
        ch.basic_cancel(tag)
        ch.basic_consume("solo", lambda *a: None)  # free again
        late = conn.channel()
        refused_excl = _closed_with(
            lambda: late.basic_consume("solo", lambda *a: None, exclusive=True))
        conn.close()
        return refused[0], refused_excl[0]

    assert run_gateway(tmp_path, client) == (403, 403)


def test_declare_ok_counts_messages_not_yet_acknowledged_and_consumers(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        counts = [ch.queue_declare("cnt").method.message_count]
        for _ in range(5):
            ch.basic_publish("", "cnt", b"m")
        counts.append(ch.queue_declare("cnt", passive=True).method.message_count)
        ch.basic_consume("cnt", lambda *a: None)
        consumers = ch.queue_declare("cnt", passive=True).method.consumer_count
        conn.close()
        return counts, consumers

    counts, consumers = run_gateway(tmp_path, client)
    assert counts == [0, 5]
    assert consumers == 1


def test_transactions_hold_publishes_and_acks_until_commit(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.queue_declare("txq")
        ch.tx_select()
        ch.basic_publish("", "txq", b"rolled-back")
        ch.tx_rollback()
        ch.basic_publish("", "txq", b"committed")
        other = pika.BlockingConnection(params(gw.port))
        before = other.channel().basic_get("txq", auto_ack=True)[2]
        other.close()
        ch.tx_commit()
        m, _, body = ch.basic_get("txq", auto_ack=False)
        ch.basic_ack(m.delivery_tag)
        ch.tx_rollback()  # the ack is void: the delivery is unacknowledged again
        ch.basic_ack(m.delivery_tag)  # a known tag again
        ch.tx_commit()
        confirm = _closed_with(ch.confirm_delivery)  # tx channel cannot confirm
        conn.close()
        return before, body, confirm[0]

    assert run_gateway(tmp_path, client) == (None, b"committed", 406)


def test_repeated_publishes_follow_binding_changes_and_keep_their_properties(tmp_path):
    """Identical publishes reuse their stored properties (a cache): a binding added
    between two of them, or other properties, still count."""
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare("rep", "direct")
        for q in ("rep-1", "rep-2"):
            ch.queue_declare(q)
        ch.queue_bind("rep-1", "rep", "k")
        same = pika.BasicProperties(content_type="text/plain")
        ch.basic_publish("rep", "k", b"a", same)
        ch.queue_bind("rep-2", "rep", "k")
        ch.basic_publish("rep", "k", b"b", same)
        ch.basic_publish("rep", "k", b"c", pika.BasicProperties(content_type="text/html"))
        got = {}
        for q in ("rep-1", "rep-2"):
            got[q] = []
            while True:
                m, props, body = ch.basic_get(q, auto_ack=True)
                if m is None:
                    break
                got[q].append((body, props.content_type))
        conn.close()
        return got

    got = run_gateway(tmp_path, client)
    assert got["rep-1"] == [(b"a", "text/plain"), (b"b", "text/plain"), (b"c", "text/html")]
    assert got["rep-2"] == [(b"b", "text/plain"), (b"c", "text/html")]
