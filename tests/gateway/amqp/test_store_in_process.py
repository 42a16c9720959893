"""A gateway in the broker's process (`lmq serve`) stores pika's publishes through the
broker's send checks and put directly (core/broker/local_send.py): no SEND request, with
the broker's refusals kept (a message too large for the broker is still nacked)."""

from __future__ import annotations

import pika
import pytest

from core.broker.local_send import LocalSend
from core.client.api import MQClientAPI
from gateway.amqp.broker import AmqpBroker, AmqpBrokerConfig
from tests.gateway.amqp.broker_harness import Gateway, params, run_gateway

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
def test_pika_publishes_stored_without_send_requests(tmp_path, store_requests, in_process):
    count = 40

    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.queue_declare("stored")
        ch.confirm_delivery()
        for i in range(count):  # each confirmed: stored under the flush policy
            ch.basic_publish("", "stored", f"m{i}".encode())
        got = []
        for method, _, body in ch.consume("stored", inactivity_timeout=10):
            assert method is not None, "no delivery"
            got.append(body)
            ch.basic_ack(method.delivery_tag)
            if len(got) == count:
                break
        ch.cancel()
        conn.close()
        return got, gw.broker.local_send

    got, local = run_gateway(tmp_path, client, in_process=in_process)
    assert got == [f"m{i}".encode() for i in range(count)]
    if in_process:
        assert store_requests == []
        assert local.sends > 0
    else:
        assert store_requests


@pytest.mark.parametrize("in_process", [True, False])
def test_broker_refusal_nacks_the_publish(tmp_path, store_requests, in_process):
    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.queue_declare("small")
        ch.confirm_delivery()
        ch.basic_publish("", "small", b"fits")
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", "small", b"x" * 4096)
        conn.close()
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
