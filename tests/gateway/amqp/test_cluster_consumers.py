"""Consumers across two gateways of one cluster (gateway/amqp/presence.py): an auto-delete
queue goes with its last consumer anywhere, an exclusive consume counts the other gateway's
consumers, Declare-Ok counts them all, another gateway's exclusive queue is locked (405),
and what a gateway that left the cluster consumed or owned is cleaned up."""

from __future__ import annotations

import time

import pika
import pytest

from gateway.amqp.broker import AmqpBrokerConfig
from tests.gateway.amqp.broker_harness import Gateway, params, run_gateways
from tests.gateway.amqp.test_cluster_queues import STRICT, _decl_records, collect, pump

pytestmark = pytest.mark.timeout(120)

CFG = AmqpBrokerConfig(poll_ms=200)
CFG.presence_check_s, CFG.presence_gone_s = 0.1, 0.5  # (a plain attribute on old code)


def closed_with(fn) -> int | None:
    """The reply code of the channel close `fn()` provokes (None: no close)."""
    try:
        fn()
    except pika.exceptions.ChannelClosedByBroker as exc:
        return exc.reply_code
    return None


def consumer_count(conn, queue: str) -> int:
    return conn.channel().queue_declare(queue, passive=True).method.consumer_count


def eventually(conn, fn, want, timeout_s: float = 10.0):
    """`fn()` once it returns `want`, or its last value after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (got := fn()) != want and time.monotonic() < deadline:
        conn.sleep(0.05)
    return got


def wait_count(conn, queue: str, want: int) -> int:
    return eventually(conn, lambda: consumer_count(conn, queue), want)


@STRICT
def test_auto_delete_waits_for_the_last_consumer_on_every_gateway(tmp_path, strict):
    def client(gws: list[Gateway]):
        a, b = gws
        conn_a, conn_b = (pika.BlockingConnection(params(g.port)) for g in (a, b))
        ch_a, ch_b = conn_a.channel(), conn_b.channel()
        ch_a.queue_declare("ad", auto_delete=True)
        b.wait_for(lambda: "ad" in b.broker.queues)
        cancelled_b: list = []
        ch_b.add_on_cancel_callback(cancelled_b.append)
        tag_a = ch_a.basic_consume("ad", collect([]))
        got_b: list[bytes] = []
        tag_b = ch_b.basic_consume("ad", collect(got_b))
        wait_count(conn_a, "ad", 2)
        ch_a.basic_cancel(tag_a)  # A's last consumer, not the queue's
        conn_a.sleep(0.5)
        alive = ("ad" in a.broker.queues, "ad" in b.broker.queues)
        conn_a.channel().basic_publish("", "ad", b"still")
        pump([conn_a, conn_b], lambda: got_b == [b"still"])
        ch_b.basic_cancel(tag_b)  # the last one anywhere: the queue goes, everywhere
        for g in (a, b):
            g.wait_for(lambda g=g: "ad" not in g.broker.queues)
        gone = closed_with(lambda: conn_a.channel().queue_declare("ad", passive=True))
        deletes = len(_decl_records(a, "q-", "ad"))
        conn_a.close()
        conn_b.close()
        return alive, cancelled_b, gone, deletes

    alive, cancelled_b, gone, deletes = run_gateways(tmp_path, client, 2, CFG,
                                                     broker_kw={"apache_strict": strict})
    assert alive == (True, True)
    assert cancelled_b == []  # B's consumer was never cancelled by the server
    assert gone == 404
    assert deletes == 1


def test_exclusive_consume_and_consumer_counts_span_gateways(tmp_path):
    def client(gws: list[Gateway]):
        a, b = gws
        conn_a, conn_b = (pika.BlockingConnection(params(g.port)) for g in (a, b))
        ch_a = conn_a.channel()
        ch_a.queue_declare("shared")
        b.wait_for(lambda: "shared" in b.broker.queues)
        tags_a = [ch_a.basic_consume("shared", collect([])) for _ in range(2)]
        conn_b.channel().basic_consume("shared", collect([]))
        counts = (wait_count(conn_a, "shared", 3), wait_count(conn_b, "shared", 3))
        # B has a consumer: an exclusive consume on A is refused, and the reverse.
        refused_a = closed_with(lambda: conn_a.channel().basic_consume(
            "shared", collect([]), exclusive=True))
        for tag in tags_a:
            ch_a.basic_cancel(tag)
        b_count = wait_count(conn_b, "shared", 1)
        conn_b.close()  # B's consumer goes: A may consume exclusively now
        wait_count(conn_a, "shared", 0)
        ch_x = conn_a.channel()
        ch_x.basic_consume("shared", collect([]), exclusive=True)
        conn_b = pika.BlockingConnection(params(b.port))
        wait_count(conn_b, "shared", 1)
        # While A's exclusive consumer holds the queue, B's consumes are refused.
        plain_b = closed_with(lambda: conn_b.channel().basic_consume("shared", collect([])))
        excl_b = closed_with(lambda: conn_b.channel().basic_consume(
            "shared", collect([]), exclusive=True))
        conn_a.close()
        conn_b.close()
        return counts, refused_a, b_count, plain_b, excl_b

    counts, refused_a, b_count, plain_b, excl_b = run_gateways(
        tmp_path, client, 2, CFG)
    assert counts == (3, 3)
    assert refused_a == 403
    assert b_count == 1  # A's went
    assert (plain_b, excl_b) == (403, 403)


def test_another_gateways_exclusive_queue_is_locked(tmp_path):
    """As on RabbitMQ for another connection's exclusive queue: 405 for declare, passive
    declare, consume, get, purge, bind and delete; a publish reaches it. It goes with its
    connection, on both gateways."""
    def client(gws: list[Gateway]):
        a, b = gws
        conn_a, conn_b = (pika.BlockingConnection(params(g.port)) for g in (a, b))
        ch_a = conn_a.channel()
        ch_a.queue_declare("mine", exclusive=True)
        got: list[bytes] = []
        ch_a.basic_consume("mine", collect(got))
        eventually(conn_b, lambda: closed_with(
            lambda: conn_b.channel().queue_declare("mine", passive=True)), 405)
        codes = [closed_with(lambda fn=fn: fn(conn_b.channel())) for fn in (
            lambda ch: ch.queue_declare("mine", exclusive=True),
            lambda ch: ch.queue_declare("mine"),
            lambda ch: ch.queue_declare("mine", passive=True),
            lambda ch: ch.basic_consume("mine", collect([])),
            lambda ch: ch.basic_get("mine"),
            lambda ch: ch.queue_purge("mine"),
            lambda ch: ch.queue_bind("mine", "amq.direct", "k"),
            lambda ch: ch.queue_delete("mine"),
        )]
        conn_b.channel().basic_publish("", "mine", b"via b")
        pump([conn_a], lambda: got == [b"via b"])
        conn_a.close()
        b.wait_for(lambda: "mine" not in b.broker.queues)
        conn_b.channel().queue_declare("mine", exclusive=True)  # free now
        conn_b.close()
        return codes

    assert run_gateways(tmp_path, client, 2, CFG) == [405] * 8


def test_what_a_gone_gateway_consumed_or_owned_is_cleaned_up(tmp_path):
    """A gateway that left the cluster without a word (as after kill -9; here a gateway id
    that never joins the group writes the records): its consumers stop counting after
    presence_gone_s, its exclusive queue goes, and so does an auto-delete queue it was the
    last to consume — deleted once; a queue another gateway still consumes stays."""
    from gateway.amqp.presence import CONSUMERS_OP, EXCLUSIVE_QUEUE_OP

    ghost = "amqp-gw-ghost"

    def client(gws: list[Gateway]):
        a, b = gws
        conn_a = pika.BlockingConnection(params(a.port))
        ch = conn_a.channel()
        for name in ("ad-ghost", "ad-kept"):
            ch.queue_declare(name, auto_delete=True)
        ch.basic_consume("ad-kept", collect([]))
        decl = b.broker.decl

        async def ghost_writes() -> None:
            for name in ("ad-ghost", "ad-kept"):
                await decl._send(_record(CONSUMERS_OP, name, c=2, x=False))
            await decl._send(_record(EXCLUSIVE_QUEUE_OP, "ex-ghost", d=False, ad=False,
                                     a={}))

        def _record(op: str, name: str, **fields) -> bytes:
            import json
            return json.dumps({"o": op, "v": "/", "n": name, "g": ghost, **fields}).encode()

        b.call(ghost_writes)
        for g in (a, b):
            g.wait_for(lambda g=g: "ex-ghost" in g.broker.queues)
        counted = consumer_count(conn_a, "ad-kept")
        locked = closed_with(lambda: conn_a.channel().queue_declare("ex-ghost", passive=True))
        for g in (a, b):
            g.wait_for(lambda g=g: "ad-ghost" not in g.broker.queues
                       and "ex-ghost" not in g.broker.queues)
        kept = "ad-kept" in a.broker.queues and "ad-kept" in b.broker.queues
        after = consumer_count(conn_a, "ad-kept")
        deletes = [len(_decl_records(a, "q-", n)) for n in ("ad-ghost", "ex-ghost")]
        conn_a.close()
        return counted, locked, kept, after, deletes, a.broker.presence.reaped

    counted, locked, kept, after, deletes, reaped = run_gateways(tmp_path, client, 2, CFG)
    assert counted == 3 and locked == 405
    assert kept and after == 1
    assert deletes == [1, 1]
    assert reaped == [ghost]


def test_consumers_cancelled_by_a_deletion_are_written_as_gone(tmp_path):
    """A queue deleted through A while B consumes it: B's consumer gets Basic.Cancel and
    B's last count record for the queue on the log says 0, so a count B wrote after the
    deletion (a consume that crossed it) is not kept by the others."""
    def client(gws: list[Gateway]):
        a, b = gws
        conn_a, conn_b = (pika.BlockingConnection(params(g.port)) for g in (a, b))
        conn_a.channel().queue_declare("del")
        eventually(conn_b, lambda: closed_with(
            lambda: conn_b.channel().queue_declare("del", passive=True)), None)
        ch_b = conn_b.channel()
        cancelled: list = []
        ch_b.add_on_cancel_callback(cancelled.append)
        ch_b.basic_consume("del", collect([]))
        wait_count(conn_a, "del", 1)
        conn_a.channel().queue_delete("del")
        pump([conn_b], lambda: cancelled)

        def last_count() -> int | None:
            counts = [r["c"] for r in _decl_records(a, "c", "del")]
            return counts[-1] if counts else None

        last = eventually(conn_a, last_count, 0)
        conn_a.close()
        conn_b.close()
        return last

    assert run_gateways(tmp_path, client, 2, CFG) == 0
