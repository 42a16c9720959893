"""x-single-active-consumer and x-expires across two gateways of one cluster
(gateway/amqp/sac.py, gateway/amqp/expiry.py): one consumer receives cluster-wide and the
next takes over when it goes; a queue used through one gateway is not deleted by the
other's timer, and an unused one is deleted once."""

from __future__ import annotations

import json
import logging
import time

import pika
import pytest

from gateway.amqp.broker import AmqpBrokerConfig
from gateway.amqp.decl_log import DECL_TOPIC
from tests.gateway.amqp.broker_harness import Gateway, params, run_gateways

pytestmark = pytest.mark.timeout(120)

SAC = {"x-single-active-consumer": True}


def pump(conns: list, until, timeout_s: float = 20.0) -> None:
    """Process the connections' events until `until()` holds."""
    deadline = time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < deadline, "condition not reached"
        for conn in conns:
            conn.process_data_events(time_limit=0.02)


def collect(into: list):
    def on_message(ch, method, _props, body):
        into.append(body)
        ch.basic_ack(method.delivery_tag)
    return on_message


def publish(ch, queue: str, bodies: list[bytes]) -> None:
    for body in bodies:
        ch.basic_publish("", queue, body)


STRICT = pytest.mark.parametrize("strict", [False, True], ids=["ours", "apache_strict"])


@STRICT
def test_single_active_consumer_is_single_across_gateways(tmp_path, strict):
    def client(gws: list[Gateway]):
        a, b = gws
        conn_a, conn_b, conn_p = (pika.BlockingConnection(params(g.port)) for g in (a, b, b))
        ch_a, ch_b, ch_p = conn_a.channel(), conn_b.channel(), conn_p.channel()
        ch_p.confirm_delivery()
        ch_a.queue_declare("sac", arguments=SAC)
        b.wait_for(lambda: "sac" in b.broker.queues)
        qa, qb = a.broker.queues["sac"], b.broker.queues["sac"]
        got_a: list[bytes] = []
        got_b: list[bytes] = []
        tag_a = ch_a.basic_consume("sac", collect(got_a))
        a.wait_for(lambda: a.broker.sac.active(qa))
        ch_b.basic_consume("sac", collect(got_b))
        first = [b"m%d" % i for i in range(20)]
        publish(ch_p, "sac", first)
        pump([conn_a, conn_b], lambda: len(got_a) + len(got_b) >= len(first))
        phase1 = (list(got_a), list(got_b))

        # The active consumer is cancelled: the one on the other gateway takes over.
        ch_a.basic_cancel(tag_a)
        started = time.monotonic()
        second = [b"n%d" % i for i in range(10)]
        publish(ch_p, "sac", second)
        pump([conn_a, conn_b], lambda: len(got_b) >= len(second))
        takeover_cancel = time.monotonic() - started
        phase2 = (got_a[len(first):], list(got_b))

        # A consumer on A again (waiting), then B's connection closes: A takes over.
        ch_a.basic_consume("sac", collect(got_a))
        pump([conn_a, conn_b], lambda: qa.lmq in a.broker.sac.wanted)
        conn_b.close()
        started = time.monotonic()
        third = [b"o%d" % i for i in range(10)]
        publish(ch_p, "sac", third)
        pump([conn_a], lambda: len(got_a) >= len(first) + len(third))
        takeover_close = time.monotonic() - started
        phase3 = got_a[len(first):]
        b.wait_for(lambda: not b.broker.sac.held)  # B gave its lock back
        conn_a.close()
        conn_p.close()
        print(f"take-over after cancel {takeover_cancel:.2f} s, after close "
              f"{takeover_close:.2f} s")
        return first, second, third, phase1, phase2, phase3, qb.lmq

    cfg = AmqpBrokerConfig(sac_retry_s=0.2, poll_ms=200)
    first, second, third, phase1, phase2, phase3, _ = run_gateways(
        tmp_path, client, 2, cfg, broker_kw={"apache_strict": strict})
    assert phase1 == (first, [])  # only the active consumer (on A) received
    assert phase2 == ([], second)  # after its cancel, only B's
    assert phase3 == third  # after B's connection closed, A's again


def test_a_gateway_that_lost_its_lock_stops_at_its_next_renewal(tmp_path):
    """The broker gives the lock to another gateway (as after a broker restart, or a take-over
    from a gateway that seemed gone): the old holder's renewal is refused and it stops; what
    its POP in flight brought back is requeued, not delivered."""
    from core.client import MessageQueue
    from gateway.amqp.sac import LOCK_GROUP

    def client(gws: list[Gateway]):
        a, b = gws
        conn_a, conn_b, conn_p = (pika.BlockingConnection(params(g.port)) for g in (a, b, b))
        ch_p = conn_p.channel()
        ch_p.confirm_delivery()
        conn_a.channel().queue_declare("lost", arguments=SAC)
        b.wait_for(lambda: "lost" in b.broker.queues)
        qa, qb = a.broker.queues["lost"], b.broker.queues["lost"]
        got_a: list[bytes] = []
        got_b: list[bytes] = []
        conn_a.channel().basic_consume("lost", collect(got_a))
        a.wait_for(lambda: a.broker.sac.active(qa))
        conn_b.channel().basic_consume("lost", collect(got_b))
        mq = MessageQueue(qa.lmq, a.broker.broker_name, 0)
        a.call(a.client.api.unlock_batch_mq, a.addr, LOCK_GROUP, a.broker.routes.gateway_id,
               [mq])
        b.wait_for(lambda: b.broker.sac.active(qb))
        a.wait_for(lambda: not a.broker.sac.active(qa))
        bodies = [b"m%d" % i for i in range(10)]
        publish(ch_p, "lost", bodies)
        pump([conn_a, conn_b], lambda: len(got_a) + len(got_b) >= len(bodies))
        for conn in (conn_a, conn_b, conn_p):
            conn.close()
        return got_a, got_b, bodies

    cfg = AmqpBrokerConfig(sac_retry_s=0.2, sac_renew_s=0.3, poll_ms=200)
    got_a, got_b, bodies = run_gateways(tmp_path, client, 2, cfg)
    assert got_a == [] and sorted(got_b) == sorted(bodies)


def _decl_records(gw: Gateway, op: str, name: str) -> list[dict]:
    out = []
    for m in gw.lmq_messages(DECL_TOPIC):
        r = json.loads(m.body)
        if r.get("o") == op and r.get("n") == name:
            out.append(r)
    return out


@STRICT
def test_x_expires_counts_uses_on_every_gateway_and_deletes_once(tmp_path, caplog, strict):
    """Declared on A with x-expires; used only through B (Basic.Get, then a consumer) for
    longer than x-expires: A's timer does not delete it. Unused, it is deleted once,
    gone on both gateways, with no warning."""
    expires_ms = 1500

    def client(gws: list[Gateway]):
        a, b = gws
        conn_a = pika.BlockingConnection(params(a.port))
        conn_b = pika.BlockingConnection(params(b.port))
        ch_a, ch_b = conn_a.channel(), conn_b.channel()
        ch_a.queue_declare("exp", arguments={"x-expires": expires_ms})
        b.wait_for(lambda: "exp" in b.broker.queues)
        used_until = time.monotonic() + 2 * expires_ms / 1000
        while time.monotonic() < used_until:  # Basic.Get through B only
            ch_b.basic_get("exp", auto_ack=True)
            conn_b.sleep(expires_ms / 5000)
        alive_after_gets = "exp" in a.broker.queues
        tag = ch_b.basic_consume("exp", collect([]))
        held_until = time.monotonic() + 2 * expires_ms / 1000
        conn_b.sleep(held_until - time.monotonic())  # a consumer on B only
        alive_after_consumer = "exp" in a.broker.queues and "exp" in b.broker.queues
        ch_b.basic_cancel(tag)
        for g in (a, b):  # unused now: deleted, and both gateways know it
            g.wait_for(lambda g=g: "exp" not in g.broker.queues)
        deletes = _decl_records(a, "q-", "exp")
        deleted_by = (a.broker.expiry.deleted, b.broker.expiry.deleted)
        conn_a.close()
        conn_b.close()
        return alive_after_gets, alive_after_consumer, len(deletes), sorted(deleted_by)

    with caplog.at_level(logging.WARNING, logger="gateway.amqp"):
        got = run_gateways(tmp_path, client, 2, broker_kw={"apache_strict": strict})
    assert got == (True, True, 1, [0, 1])
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("gateway.amqp")
                and r.levelno >= logging.WARNING]
    # Only the strict broker's one line about Apache mode (one per gateway).
    assert [w for w in warnings if "POP extensions" not in w] == []
