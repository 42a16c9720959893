"""Basic.Acks in process are applied by the connection's own task at the end of the read
that brought them: one `LocalPop.ack` (one journal write) per read, whatever the number
of acks and queues in it, no ack task round and no coroutine per ack
(docs/amqp.md, "The acknowledgement's path")."""

from __future__ import annotations

import pika

from core.broker.pop.local import LocalPop
from gateway.amqp.broker_io import BrokerTraffic
from gateway.amqp.codec import encode_content, encode_method_frame
from gateway.amqp.connection import MethodReceived, ServerConnection
from gateway.amqp.methods import (
    BasicAck,
    BasicConsume,
    BasicPublish,
    BasicQos,
    ConfirmSelect,
    QueueDeclare,
)
from gateway.amqp.properties import BasicProperties
from gateway.amqp.session import AmqpSession
from lmq.bench._amqp_load import RawClient
from tests.gateway.amqp.broker_harness import Gateway, params, run_gateway


def _spies(monkeypatch) -> dict[str, list]:
    """Per read: the Basic.Acks it carried; per LocalPop.ack call: (offsets, entries);
    ack task rounds; Basic.Acks that reached the coroutine `handle`."""
    seen: dict[str, list] = {"reads": [], "local": [], "rounds": [], "handled": []}
    receive, local_ack = ServerConnection.receive_data, LocalPop.ack
    batch, handle = BrokerTraffic._ack_batch, AmqpSession.handle

    def receive_data(self, data, now):
        events = receive(self, data, now)
        acks = sum(1 for e in events if type(e) is MethodReceived and
                   type(e.method) is BasicAck)
        if acks:
            seen["reads"].append(acks)
        return events

    def ack(self, entries):
        seen["local"].append((sum(len(e[4]) for e in entries), len(entries)))
        return local_ack(self, entries)

    async def ack_batch(self, items):
        seen["rounds"].append(len(items))
        await batch(self, items)

    async def handled(self, event):
        if type(event) is MethodReceived and type(event.method) is BasicAck:
            seen["handled"].append(event.method.delivery_tag)
        await handle(self, event)

    monkeypatch.setattr(ServerConnection, "receive_data", receive_data)
    monkeypatch.setattr(LocalPop, "ack", ack)
    monkeypatch.setattr(BrokerTraffic, "_ack_batch", ack_batch)
    monkeypatch.setattr(AmqpSession, "handle", handled)
    return seen


def test_acks_of_one_read_are_one_local_ack_across_queues(tmp_path, monkeypatch):
    seen = _spies(monkeypatch)
    queues, per_queue = ["ra", "rb", "rc"], 20

    def client(gw: Gateway):
        c = RawClient("127.0.0.1", gw.port)
        ch = c.channel()
        for q in queues:
            c.call(ch, QueueDeclare(queue=q))
        c.call(ch, ConfirmSelect())
        c.sock.sendall(b"".join(
            encode_content(ch, BasicPublish(routing_key=q), BasicProperties(), b"x", 131072)
            for q in queues for _ in range(per_queue)))
        confirmed = 0
        while confirmed < len(queues) * per_queue:
            confirmed = c._expect(ch, "BasicAck").delivery_tag
        consumer = RawClient("127.0.0.1", gw.port)
        tags: dict[int, list[int]] = {}
        for q in queues:
            cch = consumer.channel()
            consumer.call(cch, BasicQos(prefetch_count=1000))
            consumer.call(cch, BasicConsume(queue=q))
            tags[cch] = []
        while True:  # (deliveries may have come with the set-up's answers)
            for ev in consumer.events:
                if type(ev).__name__ == "Content":
                    tags[ev.channel].append(ev.method.delivery_tag)
            consumer.events.clear()
            if sum(map(len, tags.values())) == len(queues) * per_queue:
                break
            consumer._read()
        # Every delivery acknowledged on its own, all in one write.
        consumer.sock.sendall(b"".join(encode_method_frame(c_, BasicAck(t, False))
                                       for c_, ts in tags.items() for t in ts))
        gw.wait_for(lambda: sum(n for n, _ in seen["local"]) >= len(queues) * per_queue)
        left = [gw.call(gw.broker.message_count, gw.broker.queues[q]) for q in queues]
        consumer.close()
        c.close()
        return left

    left = run_gateway(tmp_path, client, in_process=True)
    assert left == [0, 0, 0]
    assert seen["rounds"] == []  # the ack task never woke
    assert seen["handled"] == []  # no coroutine per ack
    # One LocalPop.ack per read that carried acks, holding exactly that read's acks.
    assert [n for n, _ in seen["local"]] == seen["reads"]
    assert max(entries for _, entries in seen["local"]) >= 2  # queues share the call


def test_pika_acks_applied_in_the_reading_task(tmp_path, monkeypatch):
    seen = _spies(monkeypatch)
    count = 30

    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.queue_declare("pk")
        ch.confirm_delivery()
        for i in range(count):
            ch.basic_publish("", "pk", f"m{i}".encode())
        ch.basic_qos(prefetch_count=1)  # each delivery waits for the previous ack
        got = []
        for method, _, body in ch.consume("pk", inactivity_timeout=10):
            assert method is not None, "no delivery"
            got.append(body)
            ch.basic_ack(method.delivery_tag)
            if len(got) == count:
                break
        ch.cancel()
        gw.wait_for(lambda: sum(n for n, _ in seen["local"]) >= count)
        left = gw.call(gw.broker.message_count, gw.broker.queues["pk"])
        conn.close()
        return got, left

    got, left = run_gateway(tmp_path, client, in_process=True)
    assert got == [f"m{i}".encode() for i in range(count)] and left == 0
    assert seen["rounds"] == [] and seen["handled"] == []
    assert [n for n, _ in seen["local"]] == seen["reads"]


def test_acks_over_tcp_still_go_to_the_ack_task(tmp_path, monkeypatch):
    seen = _spies(monkeypatch)

    def client(gw: Gateway):
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.queue_declare("tq")
        ch.confirm_delivery()
        ch.basic_publish("", "tq", b"x")
        method, _, _ = ch.basic_get("tq")
        ch.basic_ack(method.delivery_tag)
        gw.wait_for(lambda: sum(seen["rounds"]) >= 1)
        left = gw.call(gw.broker.message_count, gw.broker.queues["tq"])
        conn.close()
        return left

    assert run_gateway(tmp_path, client) == 0
    assert seen["local"] == [] and seen["handled"] == []
