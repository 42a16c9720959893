"""x-single-active-consumer and x-expires across two `lmq amqp` processes on one cluster (a
name server and an `apache_strict` broker): the gateway of the active consumer is killed
with -9 and the consumer on the other gateway takes over (gateway/amqp/sac.py); a queue
with x-expires that only the killed gateway used is deleted by the other once unused
(gateway/amqp/expiry.py)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pika
import pytest

from tests.gateway.amqp.broker_harness import params
from tests.gateway.amqp.test_cluster_queues import SAC, collect, pump
from tests.gateway.mqtt.cluster_support import Cluster, _Proc
from tests.gateway.mqtt.e2e_support import free_port, uid

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _gateway(root, name: str, namesrv_addr: str) -> tuple[_Proc, int]:
    port = free_port()
    proc = _Proc(root, name, ["amqp", "--namesrv-addr", namesrv_addr, "--host", "127.0.0.1",
                              "--amqp-port", str(port), "--log-level", "INFO"])
    proc.start()
    proc.wait_port(port)
    return proc, port


def _known(port: int, queue: str, known: bool = True, timeout_s: float = 30.0) -> None:
    """Until the gateway on `port` knows `queue` (the declaration log), or no longer does.
    Asked with Queue.Purge (the queues are empty then), which, unlike a passive declare, is
    no use of the queue for x-expires."""
    deadline = time.monotonic() + timeout_s
    conn = pika.BlockingConnection(params(port))
    try:
        while True:
            try:
                conn.channel().queue_purge(queue)
                found = True
            except pika.exceptions.ChannelClosedByBroker:
                found = False
            if found == known:
                return
            assert time.monotonic() < deadline, f"{queue} known={found} on {port}"
            conn.sleep(0.1)
    finally:
        conn.close()


@contextlib.contextmanager
def two_gateways(tmp_path) -> Iterator[tuple[_Proc, int, _Proc, int]]:
    """A name server, a strict broker and two `lmq amqp` processes: (proc, port) twice."""
    cluster = Cluster(tmp_path).start()
    procs: list[_Proc] = []
    try:
        gw_a, port_a = _gateway(tmp_path, "amqp-a", cluster.namesrv_addr)
        procs.append(gw_a)
        gw_b, port_b = _gateway(tmp_path, "amqp-b", cluster.namesrv_addr)
        procs.append(gw_b)
        yield gw_a, port_a, gw_b, port_b
    finally:
        for proc in procs:
            proc.stop()
        cluster.stop()


def test_kill_9_of_the_active_consumers_gateway_moves_delivery(tmp_path):
    with two_gateways(tmp_path) as (gw_a, port_a, gw_b, port_b):
        q = "sac-" + uid()
        conn_a = pika.BlockingConnection(params(port_a))
        conn_b = pika.BlockingConnection(params(port_b))
        conn_p = pika.BlockingConnection(params(port_b))
        ch_p = conn_p.channel()
        ch_p.confirm_delivery()
        conn_a.channel().queue_declare(q, arguments=SAC)
        # Used only through A (a consumer), known to B.
        exp = "exp-" + uid()
        ch_exp = conn_a.channel()
        ch_exp.queue_declare(exp, arguments={"x-expires": 2000})
        ch_exp.basic_consume(exp, collect([]))
        _known(port_b, q)
        _known(port_b, exp)
        got_a: list[bytes] = []
        got_b: list[bytes] = []
        conn_a.channel().basic_consume(q, collect(got_a))
        ch_p.basic_publish("", q, b"probe")
        pump([conn_a], lambda: got_a == [b"probe"], 30)  # A's consumer is the active one
        conn_b.channel().basic_consume(q, collect(got_b))
        first = [b"m%d" % i for i in range(10)]
        for body in first:
            ch_p.basic_publish("", q, body)
        pump([conn_a, conn_b], lambda: len(got_a) + len(got_b) >= 1 + len(first), 30)
        before = (got_a[1:], list(got_b))
        _known(port_b, exp)  # in use on A: alive, on both

        gw_a.kill9()
        killed = time.monotonic()
        # Publish until B's consumer receives (messages popped by A's dead gateway come
        # back only after their invisibility deadline in front of a strict broker).
        # Well before the dead gateway's lock lapses (the broker's lock_max_live_s, 60 s):
        # the other gateway unlocks it once the broker dropped the dead one from the group.
        n = 0
        while not got_b:
            assert time.monotonic() - killed < 30, "no take-over:\n" + gw_b.log_tail()
            ch_p.basic_publish("", q, b"wait%d" % n)
            n += 1
            conn_b.process_data_events(time_limit=0.2)
        takeover_s = time.monotonic() - killed
        settled = len(got_b)
        after = [b"n%d" % i for i in range(10)]
        for body in after:
            ch_p.basic_publish("", q, body)
        pump([conn_b], lambda: len(got_b) >= settled + len(after), 30)
        print(f"take-over after kill -9 of the active consumer's gateway: {takeover_s:.2f} s")
        _known(port_b, exp, known=False)  # unused since the kill: B deleted it
        conn_b.close()
        conn_p.close()
    assert before == (first, [])
    assert got_b[settled:] == after
