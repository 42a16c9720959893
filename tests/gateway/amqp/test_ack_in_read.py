"""Basic.Acks in process are applied by the connection's own task at the end of the read
that brought them: one `LocalPop.ack` (one journal write) per read, whatever the number
of acks and queues in it, no ack task round and no coroutine per ack
(docs/amqp.md, "The acknowledgement's path")."""

from __future__ import annotations

import pytest

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
from tests.gateway.amqp import test_consume_in_process as in_proc
from tests.gateway.amqp.broker_harness import Gateway, run_gateway
from tests.gateway.amqp.test_consume_in_process import pop_requests  # noqa: F401 (fixture)


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


@pytest.mark.parametrize("in_process", [True, False])
def test_pika_acks_in_the_reading_task_or_the_ack_task(tmp_path, monkeypatch, request,
                                                        in_process):
    """The pika consume-and-ack run of test_consume_in_process: in process every read's
    acks are one LocalPop.ack; over TCP they still go to the ack task (BATCH_ACK)."""
    seen = _spies(monkeypatch)
    in_proc.test_consume_and_acks_in_process_send_no_pop_requests(
        tmp_path, request.getfixturevalue("pop_requests"), in_process)
    assert seen["handled"] == []  # no coroutine per ack either way
    if in_process:
        assert seen["rounds"] == []
        assert [n for n, _ in seen["local"]] == seen["reads"]
    else:
        assert seen["local"] == [] and sum(seen["rounds"]) == sum(seen["reads"])


def test_local_ack_entries_of_one_delivery_and_of_several():
    from core.client.pop_consumer import PopClient, PopMessage

    pop = PopClient(None, "127.0.0.1:1", "broker-a", "GID_AMQP%LMQ%q")

    def delivery(qid: int, offset: int, pop_time: int, first: int) -> PopMessage:
        # The receipt handle: the pop's first offset, pop time, invisible time, ..., offset.
        return PopMessage(None, "%LMQ%q", qid, offset,
                          f"{first} {pop_time} 30000 0 0 broker-a {qid} {offset}")

    one = delivery(0, 7, 1_700_000_000_123, 7)
    assert pop.local_ack_entries([one]) == [("GID_AMQP%LMQ%q", "%LMQ%q", 0,
                                             1_700_000_000_123, [7])]
    # One entry per queue and pop, its offsets together.
    several = [delivery(0, 7, 5, 7), delivery(1, 3, 5, 3), delivery(0, 8, 5, 7),
               delivery(0, 9, 6, 9)]
    assert sorted(pop.local_ack_entries(several)) == [
        ("GID_AMQP%LMQ%q", "%LMQ%q", 0, 5, [7, 8]), ("GID_AMQP%LMQ%q", "%LMQ%q", 0, 6, [9]),
        ("GID_AMQP%LMQ%q", "%LMQ%q", 1, 5, [3])]
