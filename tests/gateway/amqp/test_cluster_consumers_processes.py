"""Consumers and exclusive queues across two `lmq amqp` processes on one cluster (a name
server and an `apache_strict` broker; gateway/amqp/presence.py): the gateway that owned an
exclusive queue and was the only consumer of an auto-delete queue is killed with -9; the
other gateway deletes both once the dead one has been out of the gateways' group for
`presence_gone_s` (defaults)."""

from __future__ import annotations

import time

import pika
import pytest

from tests.gateway.amqp.broker_harness import params
from tests.gateway.amqp.test_cluster_consumers import closed_with
from tests.gateway.amqp.test_cluster_queues import collect
from tests.gateway.amqp.test_cluster_queues_processes import two_gateways
from tests.gateway.mqtt.e2e_support import uid

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _passive(port: int, queue: str) -> int | None:
    """The reply code of a passive declare of `queue` through the gateway on `port`."""
    conn = pika.BlockingConnection(params(port))
    try:
        return closed_with(lambda: conn.channel().queue_declare(queue, passive=True))
    finally:
        if conn.is_open:
            conn.close()


def _until(port: int, queue: str, code: int | None, timeout_s: float) -> float:
    """Seconds until the passive declare answers `code` (AssertionError after timeout_s)."""
    started = time.monotonic()
    while (got := _passive(port, queue)) != code:
        assert time.monotonic() - started < timeout_s, f"{queue}: {got}, not {code}"
        time.sleep(0.1)
    return time.monotonic() - started


def test_kill_9_of_the_owner_and_last_consumer_deletes_its_queues(tmp_path):
    bound_s = 60.0  # presence_gone_s + presence_check_s (35 s by default), with room
    with two_gateways(tmp_path) as (gw_a, port_a, _gw_b, port_b):
        ad, ex, kept = "ad-" + uid(), "ex-" + uid(), "kept-" + uid()
        conn_a = pika.BlockingConnection(params(port_a))
        ch = conn_a.channel()
        ch.queue_declare(ad, auto_delete=True)
        ch.basic_consume(ad, collect([]))
        ch.queue_declare(ex, exclusive=True)
        ch.queue_declare(kept, auto_delete=True)  # never consumed: stays
        _until(port_b, ex, 405, 30)  # B knows A's exclusive queue
        _until(port_b, ad, None, 30)
        before = (_passive(port_b, ex), _passive(port_b, ad))
        gw_a.kill9()
        ex_s = _until(port_b, ex, 404, bound_s)
        ad_s = _until(port_b, ad, 404, bound_s)
        print(f"after kill -9: exclusive queue gone in {ex_s:.1f} s, auto-delete queue "
              f"in {ex_s + ad_s:.1f} s")
        kept_code = _passive(port_b, kept)
        conn_b = pika.BlockingConnection(params(port_b))
        conn_b.channel().queue_declare(ex, exclusive=True)  # the name is free again
        conn_b.close()
    assert before == (405, None)
    assert kept_code is None
