"""Acknowledgements of many queues' deliveries go to the broker in one BATCH_ACK request
(its entries name their own consumer groups), not one request per queue."""

from __future__ import annotations

import pika

from core.client.pop_consumer import PopClient
from core.remoting.codes import RequestCode
from gateway.amqp.codec import Content, encode_method_frame
from gateway.amqp.methods import BasicAck, BasicConsume, BasicQos
from lmq.bench._amqp_load import RawClient
from tests.gateway.amqp.broker_harness import declare_fanout, params, run_gateway

QUEUES = [f"fan-{i:02d}" for i in range(20)]


def test_acks_of_many_queues_share_one_request(tmp_path, monkeypatch):
    requests: list[int] = []
    original = PopClient._invoke

    async def spy(self, cmd, extra_s=0.0):
        if cmd.code == RequestCode.BATCH_ACK_MESSAGE:
            requests.append(cmd.code)
        return await original(self, cmd, extra_s)

    monkeypatch.setattr(PopClient, "_invoke", spy)

    def client(gw):
        with pika.BlockingConnection(params(gw.port)) as conn:
            ch = conn.channel()
            declare_fanout(ch, "fan", QUEUES)
            c = RawClient("127.0.0.1", gw.port)
            channels = {}
            for q in QUEUES:
                n = c.channel()
                c.call(n, BasicQos(prefetch_count=10))
                c.call(n, BasicConsume(queue=q))
                channels[n] = q
            ch.confirm_delivery()
            ch.basic_publish("fan", "k", b"one")
            last: dict[int, int] = {}
            while len(last) < len(QUEUES):
                c._read()
                for ev in c.events:
                    if type(ev) is Content:
                        last[ev.channel] = ev.method.delivery_tag
                c.events.clear()
            # Every queue's ack in one write: one read, one ack round.
            c.sock.sendall(b"".join(encode_method_frame(n, BasicAck(tag, False))
                                    for n, tag in last.items()))
            c.close()  # anything not acknowledged by now would be requeued
            return [ch.basic_get(q, auto_ack=True)[2] for q in QUEUES]

    left = run_gateway(tmp_path, client)
    assert left == [None] * len(QUEUES)  # all acknowledged, none requeued
    assert 1 <= len(requests) < len(QUEUES) // 2, requests
