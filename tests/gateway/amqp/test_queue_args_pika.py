"""Queue arguments applied (TTL, expiration, length limits, dead-lettering, x-expires,
single active consumer), driven by pika over a real broker (docs/amqp.md "Queue
arguments")."""

from __future__ import annotations

import time

import pika
import pika.exceptions
import pytest

from gateway.amqp.queue_args import parse_queue_args
from tests.gateway.amqp.broker_harness import Gateway, params, run_gateway
from tests.gateway.amqp.test_broker_pika import _closed_with

pytestmark = pytest.mark.timeout(120)


def _drain(ch, queue: str) -> list:
    """Every message of `queue` by Basic.Get (acknowledged): (body, properties)."""
    out = []
    while True:
        m, props, body = ch.basic_get(queue, auto_ack=True)
        if m is None:
            return out
        out.append((body, props))


def _wait_expired(ms: int) -> None:
    # The TTL clock is the broker's store time: waiting longer than the TTL is all the
    # test needs (no upper bound is asserted).
    time.sleep(ms / 1000 + 0.05)


def test_invalid_and_unsupported_arguments_are_refused_with_406(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        out = {}
        for label, args in (("negative ttl", {"x-message-ttl": -1}),
                            ("string ttl", {"x-message-ttl": "10"}),
                            ("zero expires", {"x-expires": 0}),
                            ("bool max-length", {"x-max-length": True}),
                            ("overflow", {"x-overflow": "drop-tail"}),
                            ("dlrk without dlx", {"x-dead-letter-routing-key": "k"}),
                            ("sac not bool", {"x-single-active-consumer": 1}),
                            ("limit on classic", {"x-delivery-limit": 1}),
                            ("priority", {"x-max-priority": 10}),
                            ("stream", {"x-queue-type": "stream"})):
            out[label] = _closed_with(
                lambda a=args, n=label: conn.channel().queue_declare(
                    "q-" + n.replace(" ", "-"), arguments=a))
        ch = conn.channel()
        ch.queue_declare("plain")

        def bad_expiration():
            ch.basic_publish("", "plain", b"x", pika.BasicProperties(expiration="soon"))
            ch.queue_declare("plain", passive=True)  # a round trip reads the close

        out["expiration"] = _closed_with(bad_expiration)
        ch = conn.channel()
        ch.queue_declare("ttl", arguments={"x-message-ttl": 100})
        out["inequivalent"] = _closed_with(
            lambda: ch.queue_declare("ttl", arguments={"x-message-ttl": 200}))
        alive = conn.is_open
        declared = sorted(gw.broker.queues)
        conn.close()
        return out, alive, declared

    out, alive, declared = run_gateway(tmp_path, client)
    assert {k: code for k, (code, _) in out.items()} == dict.fromkeys(out, 406)
    assert out["negative ttl"][1] == ("PRECONDITION_FAILED - invalid arg 'x-message-ttl' for "
                                      "queue 'q-negative-ttl' in vhost '/': "
                                      "{value_negative,-1}")
    assert "not supported" in out["priority"][1]
    assert out["expiration"][1] == "PRECONDITION_FAILED - invalid expiration 'soon': no_integer"
    assert out["string ttl"][1].endswith("in vhost '/': \"expected integer, got longstr\"")
    assert alive
    assert declared == ["plain", "ttl"]  # nothing refused was declared


def test_parse_accepts_what_rabbitmq_accepts():
    args = parse_queue_args("q", {"x-message-ttl": 0, "x-expires": 1, "x-max-length": 0,
                                  "x-overflow": b"reject-publish",
                                  "x-dead-letter-exchange": "",
                                  "x-dead-letter-routing-key": "dead",
                                  "x-single-active-consumer": True, "x-queue-type": "classic",
                                  "x-custom": [1, 2]})
    assert (args.message_ttl, args.expires, args.max_length, args.overflow, args.dlx,
            args.dlrk, args.single_active) == (0, 1, 0, "reject-publish", "", "dead", True)


def test_expired_messages_are_not_delivered_and_go_to_the_dead_letter_exchange(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.exchange_declare("dlx", "fanout")
        ch.queue_declare("dead")
        ch.queue_bind("dead", "dlx")
        ch.queue_declare("work", arguments={"x-message-ttl": 50,
                                            "x-dead-letter-exchange": "dlx"})
        ch.queue_declare("plain")  # no TTL, no DLX: per-message expiration drops
        ch.basic_publish("", "work", b"old", pika.BasicProperties(headers={"n": 1}))
        ch.basic_publish("", "plain", b"short", pika.BasicProperties(expiration="20"))
        ch.basic_publish("", "plain", b"long", pika.BasicProperties(expiration="600000"))
        _wait_expired(50)
        ch.basic_publish("", "work", b"fresh")
        work = _drain(ch, "work")
        plain = _drain(ch, "plain")
        dead = _drain(ch, "dead")
        conn.close()
        return work, plain, dead, dict(gw.broker.policy.stats)

    work, plain, dead, stats = run_gateway(tmp_path, client)
    assert [b for b, _ in work] == [b"fresh"]
    assert [b for b, _ in plain] == [b"long"]
    assert plain[0][1].expiration == "600000"  # delivered with its property
    assert [b for b, _ in dead] == [b"old"]
    headers = dead[0][1].headers
    assert headers["n"] == 1
    death = headers["x-death"][0]
    assert (death["reason"], death["queue"], death["exchange"], death["routing-keys"],
            death["count"]) == ("expired", "work", "", ["work"], 1)
    assert headers["x-first-death-reason"] == "expired"
    assert stats["expired"] == 2 and stats["dead_lettered"] == 1


def test_rejected_and_past_delivery_limit_are_dead_lettered_with_the_dlx_key(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.queue_declare("parking")
        ch.queue_declare("jobs", durable=True, arguments={
            "x-queue-type": "quorum", "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "parking", "x-delivery-limit": 1})
        ch.basic_publish("amq.direct", "none", b"unroutable")
        ch.basic_publish("", "jobs", b"bad", pika.BasicProperties(expiration="600000"))
        ch.basic_publish("", "jobs", b"flaky")
        m, _, body = ch.basic_get("jobs")
        ch.basic_reject(m.delivery_tag, requeue=False)
        for _ in range(2):  # returned twice: past a limit of 1
            m, _, _ = ch.basic_get("jobs")
            ch.basic_nack(m.delivery_tag, requeue=True)
        left = _drain(ch, "jobs")
        parked = _drain(ch, "parking")
        conn.close()
        return body, left, parked

    first, left, parked = run_gateway(tmp_path, client)
    assert first == b"bad" and left == []
    assert [b for b, _ in parked] == [b"bad", b"flaky"]
    bad, flaky = (p for _, p in parked)
    assert bad.headers["x-death"][0]["reason"] == "rejected"
    assert bad.expiration is None  # removed so the copy does not expire again
    assert bad.headers["x-death"][0]["original-expiration"] == "600000"
    assert flaky.headers["x-death"][0]["reason"] == "delivery_limit"


def test_max_length_reject_publish_nacks_and_drop_head_dead_letters_the_oldest(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("overflow")
        ch.queue_declare("bounded", arguments={"x-max-length": 2,
                                               "x-overflow": "reject-publish"})
        ch.queue_declare("rolling", arguments={"x-max-length": 2,
                                               "x-dead-letter-exchange": "",
                                               "x-dead-letter-routing-key": "overflow"})
        nacked = []
        for i in range(3):
            try:
                ch.basic_publish("", "bounded", str(i).encode())
            except pika.exceptions.NackError:
                nacked.append(i)
        for i in range(4):
            ch.basic_publish("", "rolling", str(i).encode())
        result = {q: [b for b, _ in _drain(ch, q)] for q in ("bounded", "rolling", "overflow")}
        conn.close()
        return nacked, result

    nacked, result = run_gateway(tmp_path, client)
    assert nacked == [2]
    assert result == {"bounded": [b"0", b"1"], "rolling": [b"2", b"3"],
                      "overflow": [b"0", b"1"]}


def test_unused_queue_expires_and_a_consumed_one_does_not(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.queue_declare("idle", arguments={"x-expires": 100})
        ch.queue_declare("busy", arguments={"x-expires": 100})
        ch.basic_consume("busy", lambda *a: None)
        gw.wait_for(lambda: "idle" not in gw.broker.queues)
        idle = _closed_with(lambda: conn.channel().queue_declare("idle", passive=True))
        busy_alive = "busy" in gw.broker.queues  # held by its consumer past 100 ms
        conn.close()
        gw.wait_for(lambda: "busy" not in gw.broker.queues)  # unused once it went
        return idle[0], busy_alive

    assert run_gateway(tmp_path, client) == (404, True)


def test_single_active_consumer_gets_everything_until_it_cancels(tmp_path):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.queue_declare("sac", arguments={"x-single-active-consumer": True})
        got: list[tuple[str, bytes]] = []

        def on(name):
            def cb(ch_, method, _props, body):
                got.append((name, body))
                ch_.basic_ack(method.delivery_tag)
            return cb

        first = ch.basic_consume("sac", on("a"))
        ch2 = conn.channel()
        ch2.basic_consume("sac", on("b"))
        for i in range(4):
            ch.basic_publish("", "sac", b"%d" % i)
        deadline = time.monotonic() + 20
        while len(got) < 4 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        ch.basic_cancel(first)
        for i in range(4, 6):
            ch.basic_publish("", "sac", b"%d" % i)
        while len(got) < 6 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        conn.close()
        return got

    got = run_gateway(tmp_path, client)
    assert got[:4] == [("a", b"0"), ("a", b"1"), ("a", b"2"), ("a", b"3")]
    assert got[4:] == [("b", b"4"), ("b", b"5")]
