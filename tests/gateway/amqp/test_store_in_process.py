"""A gateway in the broker's process (`lmq serve`) stores pika's publishes through the
broker's send checks and put directly (core/broker/local_send.py): no SEND request, with
the broker's refusals kept (a message too large for the broker is still nacked)."""

from __future__ import annotations

import pika
import pytest

from core.broker.local_send import LocalSend
from core.client.api import MQClientAPI
from gateway.amqp.broker import AmqpBroker, AmqpBrokerConfig
from tests.gateway.amqp import test_consume_in_process
from tests.gateway.amqp.broker_harness import Gateway, params, run_gateway
from tests.gateway.amqp.test_consume_in_process import pop_requests  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def store_requests(monkeypatch) -> list[int]:
    """Attach LocalSend as gateway/amqp/embedded.py does (with `in_process`), and record
    the SEND requests the gateway's client sends to the AMQP store topic."""
    attach = AmqpBroker.attach_local

    def attach_local(self, core_broker):
        attach(self, core_broker)
        self.local_send = LocalSend.of(core_broker)

    monkeypatch.setattr(AmqpBroker, "attach_local", attach_local)
    sent: list[int] = []
    original = MQClientAPI.send_message
    store_topic = AmqpBrokerConfig().store_topic

    async def spy(self, addr, mq, ext, body, **kw):
        if mq.topic == store_topic:
            sent.append(len(body))
        return await original(self, addr, mq, ext, body, **kw)

    monkeypatch.setattr(MQClientAPI, "send_message", spy)
    return sent


@pytest.mark.parametrize("in_process", [True, False])
def test_pika_publishes_stored_without_send_requests(tmp_path, store_requests, pop_requests,  # noqa: F811
                                                     in_process):
    """test_consume_in_process's pika round trip (publishes confirmed, consumed, acked),
    with LocalSend attached: no store request in process, requests when detached."""
    test_consume_in_process.test_consume_and_acks_in_process_send_no_pop_requests(
        tmp_path, pop_requests, in_process)
    assert bool(store_requests) is not in_process


@pytest.mark.parametrize("in_process", [True, False])
def test_broker_refusal_nacks_the_publish(tmp_path, store_requests, in_process):
    def client(gw: Gateway):
        with pika.BlockingConnection(params(gw.port)) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("small")
            ch.basic_publish("", "small", b"fits")
            with pytest.raises(pika.exceptions.NackError):
                ch.basic_publish("", "small", b"x" * 4096)
        return gw.broker.stats["failed"]

    failed = run_gateway(tmp_path, client, in_process=in_process,
                         broker_kw={"max_message_size": 2048})
    assert failed >= 1


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_confirmed_publishes_survive_kill_9_of_lmq_serve_with_sync_flush(tmp_path):
    """`lmq serve --flush sync` stores in process; what pika saw confirmed before the
    process was killed with -9 is all there after a restart."""
    from tests.gateway.amqp.test_serve_amqp import _stop, start_with_pika

    count = 200
    proc, conn = start_with_pika(tmp_path, "--flush", "sync")
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("dur-store", durable=True)
        for i in range(count):  # each confirmed (pika raises on a nack)
            ch.basic_publish("", "dur-store", f"d{i}".encode(),
                             pika.BasicProperties(delivery_mode=2))
        proc.kill()  # -9, right after the last confirm
        proc.wait(30)
    finally:
        _stop(proc)
    proc, conn = start_with_pika(tmp_path, "--flush", "sync")
    try:
        ch = conn.channel()
        got = []
        for method, _, body in ch.consume("dur-store", inactivity_timeout=10):
            if method is None:
                break
            got.append(body)
            ch.basic_ack(method.delivery_tag)
            if len(got) == count:
                break
        conn.close()
    finally:
        _stop(proc)
    assert got == [f"d{i}".encode() for i in range(count)]
