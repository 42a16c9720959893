"""Basic.Acks in process are applied by the connection's own task at the end of the read
that brought them: one `LocalPop.ack` (one journal write) per read, whatever the number
of acks and queues in it, no ack task round and no coroutine per ack
(docs/amqp.md, "The acknowledgement's path")."""

from __future__ import annotations

import time

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


@pytest.mark.parametrize("in_process", [True, False])
def test_no_ack_deliveries_are_acknowledged_per_pop(tmp_path, monkeypatch, in_process):
    """A no-ack consumer's deliveries are acknowledged in the broker once written, per pop:
    in process one LocalPop.ack per pop (its task's or a hand-off's), no ack task round;
    over TCP through the ack task."""
    seen = _spies(monkeypatch)
    before, after = 40, 5  # stored before the consume (task pops), then one by one

    def client(gw: Gateway):
        c = RawClient("127.0.0.1", gw.port)
        ch = c.channel()
        c.call(ch, QueueDeclare(queue="na"))
        c.call(ch, ConfirmSelect())

        def publish(n: int) -> None:
            c.sock.sendall(b"".join(encode_content(ch, BasicPublish(routing_key="na"),
                                                   BasicProperties(), b"x", 131072)
                                    for _ in range(n)))

        publish(before)
        while c._expect(ch, "BasicAck").delivery_tag < before:
            pass
        consumer = RawClient("127.0.0.1", gw.port)
        consumer.call(consumer.channel(), BasicConsume(queue="na", no_ack=True))
        got = 0

        def take(total: int) -> int:
            n = got
            while True:
                n += sum(1 for ev in consumer.events if type(ev).__name__ == "Content")
                consumer.events.clear()
                if n >= total:
                    return n
                consumer._read()

        got = take(before)
        for i in range(after):
            if in_process:  # parked again: this one goes through a hand-off
                gw.wait_for(lambda: gw.broker.local_pop.service.polling >= 1)
            publish(1)
            got = take(before + i + 1)
        queue = gw.broker.queues["na"]
        deadline = time.monotonic() + 20
        while gw.call(gw.broker.message_count, queue) and time.monotonic() < deadline:
            time.sleep(0.01)  # (over TCP the ack task's request may still be on its way)
        left = gw.call(gw.broker.message_count, queue)
        consumer.close()
        c.close()
        return got, left

    assert run_gateway(tmp_path, client, in_process=in_process) == (before + after, 0)
    if in_process:
        assert seen["rounds"] == []  # the ack task never woke
        assert sum(n for n, _ in seen["local"]) == before + after
        assert len(seen["local"]) < before + after  # per pop, not per message
    else:
        assert seen["local"] == [] and sum(seen["rounds"]) == before + after
