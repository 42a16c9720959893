"""A gateway in the broker's process (`lmq serve`) pops and acknowledges through the POP
service directly (`AmqpBroker.attach_local`, core/broker/pop/local.py): no POP_MESSAGE and
no BATCH_ACK request, with every POP rule kept (the pika tests of test_broker_pika.py run
again on that path)."""

from __future__ import annotations

import functools
import signal
import time

import pika
import pytest

from core.client.pop_consumer import PopClient
from core.remoting.codes import RequestCode
from tests.gateway.amqp import broker_harness, test_broker_pika
from tests.gateway.amqp.broker_harness import Gateway, params, run_gateway
from tests.gateway.amqp.test_serve_amqp import _stop, start_with_pika

POP_CODES = (RequestCode.POP_MESSAGE, RequestCode.BATCH_ACK_MESSAGE, RequestCode.ACK_MESSAGE)


@pytest.fixture
def pop_requests(monkeypatch) -> list[int]:
    """The codes of the POP / ack requests the gateway's POP clients send."""
    sent: list[int] = []
    original = PopClient._invoke

    async def spy(self, cmd, extra_s=0.0):
        if cmd.code in POP_CODES:
            sent.append(cmd.code)
        return await original(self, cmd, extra_s)

    monkeypatch.setattr(PopClient, "_invoke", spy)
    return sent


@pytest.mark.parametrize("in_process", [True, False])
def test_consume_and_acks_in_process_send_no_pop_requests(tmp_path, pop_requests, in_process):
    count = 30

    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.queue_declare("inproc")
        ch.confirm_delivery()
        for i in range(count):
            ch.basic_publish("", "inproc", f"m{i}".encode())
        ch.basic_qos(prefetch_count=5)
        got = []
        for method, _, body in ch.consume("inproc", inactivity_timeout=10):
            assert method is not None, "no delivery"
            got.append(body)
            ch.basic_ack(method.delivery_tag)
            if len(got) == count:
                break
        ch.cancel()
        # Every ack applied in the broker: nothing left unacknowledged in the queue.
        queue = gw.broker.queues["inproc"]
        gw.wait_for(lambda: gw.broker.local_pop is None or gw.broker.local_pop.ack_rounds > 0)
        left = gw.call(gw.broker.message_count, queue)
        conn.close()
        return got, left, gw.broker.local_pop

    got, left, local = run_gateway(tmp_path, client, in_process=in_process)
    assert got == [f"m{i}".encode() for i in range(count)]
    assert left == 0
    if in_process:
        assert pop_requests == []
        assert local.pops > 0 and local.ack_rounds > 0
    else:  # the same run over requests: what the in-process path saves
        assert RequestCode.POP_MESSAGE in pop_requests
        assert RequestCode.BATCH_ACK_MESSAGE in pop_requests


@pytest.mark.parametrize("in_process", [True, False])
def test_tx_commit_ok_comes_after_the_acks_were_applied(tmp_path, monkeypatch, in_process):
    """Basic.Ack is not answered, but Tx.CommitOk is: it goes out only once the ack round
    holding the transaction's acks has ended (the ack then survives a kill -9)."""
    import trio

    from gateway.amqp.broker_io import BrokerTraffic

    ended: list[int] = []
    original = BrokerTraffic._ack_batch

    async def slow_round(self, batch):
        await trio.sleep(0.2)  # a round still running when the commit arrives
        await original(self, batch)
        ended.append(len(batch))

    monkeypatch.setattr(BrokerTraffic, "_ack_batch", slow_round)

    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.queue_declare("txq")
        ch.basic_publish("", "txq", b"one")
        ch.tx_select()
        method, _, _ = ch.basic_get("txq")
        assert method is not None
        ch.basic_ack(method.delivery_tag)
        ch.tx_commit()
        seen = list(ended)  # read as soon as CommitOk arrived
        conn.close()
        return seen

    assert run_gateway(tmp_path, client, in_process=in_process) == [1]


@pytest.mark.parametrize("test", [
    test_broker_pika.test_consume_ack_round_trip_and_nack_requeue_redelivers,
    test_broker_pika.test_basic_get_and_unacked_requeued_on_close,
    test_broker_pika.test_acks_reach_the_broker_and_unacked_come_back_after_the_deadline,
    test_broker_pika.test_recover_requeues_and_auto_delete_queue_goes_with_its_last_consumer,
    test_broker_pika.test_transactions_hold_publishes_and_acks_until_commit,
], ids=lambda t: t.__name__[5:40])
def test_pop_rules_hold_in_process(tmp_path, monkeypatch, pop_requests, test):
    """Nack/requeue, redelivered flags, requeue on close, deadlines, recover, tx: the
    same outcomes through the in-process API."""
    monkeypatch.setattr(test_broker_pika, "run_gateway",
                        functools.partial(broker_harness.run_gateway, in_process=True))
    test(tmp_path)
    assert RequestCode.POP_MESSAGE not in pop_requests


def test_prefetch_bounds_in_process_deliveries(tmp_path, pop_requests):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.queue_declare("pf")
        ch.confirm_delivery()
        for i in range(6):
            ch.basic_publish("", "pf", f"p{i}".encode())
        ch.basic_qos(prefetch_count=2)
        held = []
        ch.basic_consume("pf", lambda _c, m, _p, body: held.append((m.delivery_tag, body)))
        deadline = time.monotonic() + 10
        while len(held) < 2 and time.monotonic() < deadline:
            conn.process_data_events(0.1)
        conn.process_data_events(0.5)  # room for a third, were prefetch ignored
        first = list(held)
        ch.basic_ack(held[-1][0], multiple=True)
        while len(held) < 4 and time.monotonic() < deadline:
            conn.process_data_events(0.1)
        conn.close()
        return first, held

    first, held = run_gateway(tmp_path, client, in_process=True)
    assert [b for _, b in first] == [b"p0", b"p1"]
    assert [b for _, b in held[:4]] == [b"p0", b"p1", b"p2", b"p3"]
    assert RequestCode.POP_MESSAGE not in pop_requests


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_durable_queue_redelivers_after_kill_9_of_lmq_serve(tmp_path):
    """`lmq serve` pops in process; a delivery never acknowledged when the process is
    killed with -9 comes back (redelivered, once its invisibility deadline passed) after
    a restart, an acknowledged one never. Basic.Ack is not answered, so the test acks in
    a transaction: Tx.CommitOk comes once the ack holds (as with RabbitMQ)."""
    config = tmp_path / "amqp.toml"
    config.write_text("invisible_ms = 2000\n")

    def start():
        return start_with_pika(tmp_path, "--amqp-config", str(config))

    proc, conn = start()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("dur", durable=True)
        for body in (b"acked", b"unacked"):
            ch.basic_publish("", "dur", body, pika.BasicProperties(delivery_mode=2))
        consumer = conn.channel()  # a confirm-mode channel cannot use transactions
        consumer.tx_select()
        seen = []
        for method, _, body in consumer.consume("dur", inactivity_timeout=20):
            assert method is not None, "no delivery"
            seen.append((body, method.redelivered))
            if body == b"acked":
                consumer.basic_ack(method.delivery_tag)
                consumer.tx_commit()
            if len(seen) == 2:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        _stop(proc)
    assert seen == [(b"acked", False), (b"unacked", False)]
    proc, conn = start()
    try:
        ch = conn.channel()
        ch.queue_declare("dur", durable=True)
        back = []
        for method, _, body in ch.consume("dur", inactivity_timeout=10 if not back else 1):
            if method is None:
                break
            back.append((body, method.redelivered))
            ch.basic_ack(method.delivery_tag)
        conn.close()
    finally:
        assert _stop(proc) == 0
    assert back == [(b"unacked", True)]


def test_fanned_out_deliveries_of_one_connection_share_a_socket_write(tmp_path, monkeypatch):
    """A publish to a fanout exchange reaches the consumers of its queues together; those
    on one connection write their deliveries with one socket write, not one each (the
    writes counted at the socket: a hand-off's `Wire.write_now` and a task's flush both
    end in `Wire._write`)."""
    from gateway.amqp.codec import Content
    from gateway.amqp.methods import BasicConsume
    from gateway.amqp.wire import Wire
    from lmq.bench._amqp_load import RawClient

    queues = [f"w-{i:02d}" for i in range(20)]
    writes: list[tuple] = []  # the peer address of each socket write
    original_write = Wire._write

    def counting_write(sock, out):
        writes.append(sock.getpeername())
        return original_write(sock, out)

    monkeypatch.setattr(Wire, "_write", staticmethod(counting_write))

    def client(gw: Gateway):
        with pika.BlockingConnection(params(gw.port)) as conn:
            ch = conn.channel()
            broker_harness.declare_fanout(ch, "wfan", queues)
            c = RawClient("127.0.0.1", gw.port)
            peer = c.sock.getsockname()
            for q in queues:
                c.call(c.channel(), BasicConsume(queue=q, no_ack=True))
            gw.wait_for(lambda: gw.broker.local_pop.service.polling >= len(queues))
            ch.confirm_delivery()
            got = {}
            for round_ in range(3):
                writes.clear()
                ch.basic_publish("wfan", "k", f"r{round_}".encode())
                seen = 0
                while seen < len(queues):
                    c._read()
                    seen += sum(type(ev) is Content for ev in c.events)
                    c.events.clear()
                got[round_] = sum(1 for w in writes if w == peer)
            c.close()
            return got

    got = run_gateway(tmp_path, client, in_process=True)
    # 20 consumers reached by each publish: without the shared write, 20 writes each.
    assert all(1 <= n <= len(queues) // 4 for n in got.values()), got
