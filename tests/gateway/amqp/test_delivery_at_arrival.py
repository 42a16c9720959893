"""Delivery at arrival (docs/amqp.md): in process, a consumer parked in its pop gets a
message from the hand-off run at the end of the store that brought it (after the
publisher's confirm went out), written straight to its socket while its task sleeps;
what cannot be done so (prefetch full, a message to dead-letter, x-single-active-consumer,
cancel) goes through the consumer's task as before. Real broker, gateway and pika."""

from __future__ import annotations

import time

import pika
import pytest

from core.broker.local_send import LocalSend
from gateway.amqp import consume as consume_module
from gateway.amqp.wire import Wire
from tests.gateway.amqp import broker_harness, test_queue_args_pika
from tests.gateway.amqp.broker_harness import Gateway, params, run_gateway

#: Basic.Deliver's class and method ids as they open its method frame's payload.
_DELIVER = b"\x00\x3c\x00\x3c"


def _as_lmq_serve(gw: Gateway):
    """Stores without requests too (LocalSend), as `lmq serve` wires it; the POP service."""
    core = gw.broker.local_pop.broker
    gw.broker.local_send = LocalSend.of(core)
    return core.pop_service


def _parked_consumer(gw: Gateway, queue: str, on_message, prefetch: int = 0,
                     arguments: dict | None = None):
    """A pika connection consuming `queue` (declared) until its pop is parked: (the POP
    service, connection, channel, consumer tag)."""
    service = _as_lmq_serve(gw)
    conn = pika.BlockingConnection(params(gw.port))
    ch = conn.channel()
    ch.queue_declare(queue, arguments=arguments)
    if prefetch:
        ch.basic_qos(prefetch_count=prefetch)
    tag = ch.basic_consume(queue, on_message)
    gw.wait_for(lambda: service.polling >= 1)
    return service, conn, ch, tag


def _confirming_publisher(gw: Gateway):
    """Another pika connection, its channel in confirm mode: (connection, channel)."""
    pub = pika.BlockingConnection(params(gw.port))
    pch = pub.channel()
    pch.confirm_delivery()
    return pub, pch


def _consume_until(conn, got: list, n: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)


def test_lone_messages_reach_a_parked_consumer_without_waking_its_task(tmp_path):
    count = 40

    def client(gw: Gateway):
        got = []
        service, conn, _, _ = _parked_consumer(
            gw, "lone", lambda c, m, _p, body: (got.append((body, m.redelivered)),
                                                 c.basic_ack(m.delivery_tag)), 500)
        pops_before = gw.broker.local_pop.pops
        pub, pch = _confirming_publisher(gw)
        for i in range(count):
            pch.basic_publish("", "lone", b"m%d" % i)  # waits for its confirm
            _consume_until(conn, got, i + 1)
        pops = gw.broker.local_pop.pops - pops_before
        pub.close()
        deadline = time.monotonic() + 20  # every ack applied: nothing left in the queue
        while gw.call(gw.broker.message_count, gw.broker.queues["lone"]) and \
                time.monotonic() < deadline:
            time.sleep(0.02)
        left = gw.call(gw.broker.message_count, gw.broker.queues["lone"])
        conn.close()
        return got, pops, service.handoffs.parked, left

    got, pops, parked, left = run_gateway(tmp_path, client, in_process=True)
    assert left == 0
    assert got == [(b"m%d" % i, False) for i in range(count)]
    # Before: the consumer's task popped twice per message (the message, then nothing).
    assert parked >= count - 2
    assert pops <= count // 4, pops


def _raw_no_ack_consumers(port: int, queues: list[str]):
    """One raw client connection with a no-ack consumer of each queue (a channel each)."""
    from gateway.amqp.methods import BasicConsume
    from lmq.bench._amqp_load import RawClient

    c = RawClient("127.0.0.1", port)
    for q in queues:
        c.call(c.channel(), BasicConsume(queue=q, no_ack=True))
    return c


def test_fan_out_to_one_connections_consumers_is_one_socket_write(tmp_path, monkeypatch):
    from gateway.amqp.codec import Content

    queues = [f"fan-{i:02d}" for i in range(20)]
    writes: list[bytes] = []
    real = Wire._write

    def counting(sock, out):
        if _DELIVER in bytes(out):
            writes.append(bytes(out))
        return real(sock, out)

    monkeypatch.setattr(Wire, "_write", staticmethod(counting))

    def client(gw: Gateway):
        service = _as_lmq_serve(gw)
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        broker_harness.declare_fanout(ch, "afan", queues)
        ch.confirm_delivery()
        c = _raw_no_ack_consumers(gw.port, queues)
        gw.wait_for(lambda: service.polling >= len(queues))

        def deliveries_of(round_: int) -> int:
            writes.clear()
            ch.basic_publish("afan", "k", b"r%d" % round_)
            contents = []
            while len(contents) < len(queues):
                c._read()
                contents += [ev for ev in c.events if type(ev) is Content]
                c.events.clear()
            return len(writes)

        got = {round_: deliveries_of(round_) for round_ in range(3)}
        c.close()
        conn.close()
        return got, service.handoffs.parked

    got, parked = run_gateway(tmp_path, client, in_process=True)
    assert got == {0: 1, 1: 1, 2: 1}  # 20 deliveries, one write (20 without the shared one)
    assert parked >= 3 * len(queues)


def test_prefetch_holds_with_deliveries_at_arrival(tmp_path):
    def client(gw: Gateway):
        held = []
        service, conn, ch, _ = _parked_consumer(
            gw, "pfa", lambda _c, m, _p, body: held.append((m.delivery_tag, body)), 2)
        pub, pch = _confirming_publisher(gw)
        for i in range(5):
            pch.basic_publish("", "pfa", b"p%d" % i)
            conn.process_data_events(time_limit=0.05)
        conn.process_data_events(time_limit=0.5)  # room for a third, were prefetch ignored
        first = list(held)
        ch.basic_ack(held[-1][0], multiple=True)
        _consume_until(conn, held, 4)
        conn.process_data_events(time_limit=0.5)
        second = list(held)
        pub.close()
        conn.close()
        return first, second, service.handoffs.parked

    first, second, parked = run_gateway(tmp_path, client, in_process=True)
    assert [b for _, b in first] == [b"p0", b"p1"]
    assert [b for _, b in second] == [b"p0", b"p1", b"p2", b"p3"]
    assert parked >= 1  # p0 went at its arrival


@pytest.mark.parametrize("in_process", [True, False])
def test_raised_prefetch_frees_room_at_once(tmp_path, in_process):
    """Basic.Qos raising the prefetch of a consumer waiting for room: it delivers at once
    (as RabbitMQ), not at the next ack."""
    def client(gw: Gateway):
        held = []
        conn = pika.BlockingConnection(params(gw.port))
        ch = conn.channel()
        ch.queue_declare("rpq")
        ch.basic_qos(prefetch_count=1)
        ch.basic_consume("rpq", lambda _c, m, _p, body: held.append(body))
        pub, pch = _confirming_publisher(gw)
        for i in range(3):
            pch.basic_publish("", "rpq", b"q%d" % i)
        _consume_until(conn, held, 1)
        conn.process_data_events(time_limit=0.2)  # (a second would break the prefetch)
        first = list(held)
        ch.basic_qos(prefetch_count=3)  # nothing acknowledged: room for two more
        _consume_until(conn, held, 3)
        pub.close()
        conn.close()
        return first, held

    first, held = run_gateway(tmp_path, client, in_process=in_process)
    assert first == [b"q0"]
    assert held == [b"q0", b"q1", b"q2"]


def test_message_to_dead_letter_is_left_to_the_consumers_task_in_order(tmp_path, monkeypatch):
    """A hand-off that pops a message which must be dead-lettered (here: any body "bad",
    as if expired) delivers what precedes it and leaves it and the rest of its pop to the
    consumer's task: dead-lettered, the rest delivered in order."""
    real = consume_module.delivery_fault

    def fault(queue, m, now):
        return "expired" if m.body == b"bad" else real(queue, m, now)

    monkeypatch.setattr(consume_module, "delivery_fault", fault)

    def client(gw: Gateway):
        got = []
        service, conn, ch, _ = _parked_consumer(
            gw, "dl", lambda c, m, _p, body: (got.append(body), c.basic_ack(m.delivery_tag)),
            arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "parking"})
        ch.queue_declare("parking")
        pub, pch = _confirming_publisher(gw)
        props = pika.BasicProperties(expiration="600000")  # (checked at delivery)
        for body in (b"ok1", b"bad", b"ok2"):
            pch.basic_publish("", "dl", body, props)
        _consume_until(conn, got, 2)
        pub.close()
        deadline = time.monotonic() + 20
        dead = None
        while dead is None and time.monotonic() < deadline:
            method, _, dead = ch.basic_get("parking", auto_ack=True)
            if method is None:
                conn.process_data_events(time_limit=0.05)
        conn.close()
        return got, dead, service.handoffs.runs

    got, dead, runs = run_gateway(tmp_path, client, in_process=True)
    assert got == [b"ok1", b"ok2"]
    assert dead == b"bad"
    assert runs >= 1


@pytest.mark.parametrize("test", [
    test_queue_args_pika.test_single_active_consumer_gets_everything_until_it_cancels,
    test_queue_args_pika.test_rejected_and_past_delivery_limit_are_dead_lettered_with_the_dlx_key,
], ids=lambda t: t.__name__[5:40])
def test_queue_rules_hold_with_deliveries_at_arrival(tmp_path, monkeypatch, test):
    """x-single-active-consumer and dead-lettering, consumers parked in process."""
    def run(tmp, client_fn, *a, **kw):
        def wrapped(gw):
            _as_lmq_serve(gw)
            return client_fn(gw)
        return broker_harness.run_gateway(tmp, wrapped, *a, in_process=True, **kw)

    monkeypatch.setattr(test_queue_args_pika, "run_gateway", run)
    test(tmp_path)


def test_cancelled_consumer_takes_nothing_at_arrival(tmp_path):
    def client(gw: Gateway):
        got = []
        _, conn, ch, tag = _parked_consumer(
            gw, "cx", lambda _c, m, _p, body: got.append(("a", body)))
        ch.basic_cancel(tag)  # its task still parked (it notices within poll_ms)
        ch.confirm_delivery()
        ch.basic_publish("", "cx", b"after-cancel")
        ch2 = conn.channel()
        ch2.basic_consume("cx", lambda c, m, _p, body: (got.append(("b", body)),
                                                         c.basic_ack(m.delivery_tag)))
        _consume_until(conn, got, 1)
        conn.process_data_events(time_limit=0.3)
        conn.close()
        return got

    assert run_gateway(tmp_path, client, in_process=True) == [("b", b"after-cancel")]



def test_hand_off_that_raises_leaves_its_pop_to_the_consumers_task(tmp_path, monkeypatch):
    """A hand-off whose frames fail sends nothing and takes no delivery tag: its messages
    go to the consumer's task (here the failure is a one-off, so the task delivers them,
    tag 1 first), not left invisible until their deadline with a tag nobody got."""
    original = consume_module.Deliveries._frames
    failed = []

    def frames(self, consumer, messages, start, parts):
        if not failed:  # the first delivery is the hand-off's (the consumer is parked)
            failed.append(True)
            original(self, consumer, messages, start, parts)  # (takes its tags)
            raise RuntimeError("a hand-off's frames failed")
        return original(self, consumer, messages, start, parts)

    monkeypatch.setattr(consume_module.Deliveries, "_frames", frames)

    def client(gw: Gateway):
        got = []
        service, conn, ch, _ = _parked_consumer(
            gw, "hr", lambda c, m, _p, body: (got.append((m.delivery_tag, body)),
                                               c.basic_ack(m.delivery_tag)))
        pub, pch = _confirming_publisher(gw)
        pch.basic_publish("", "hr", b"m0")
        pch.basic_publish("", "hr", b"m1")
        _consume_until(conn, got, 2)
        pub.close()
        conn.close()
        return got, service.handoffs.runs

    got, runs = run_gateway(tmp_path, client, in_process=True)
    assert failed and runs >= 1
    assert got == [(1, b"m0"), (2, b"m1")]


def test_wire_write_now_keeps_what_the_kernel_did_not_take_for_the_next_flush():
    import trio
    import trio.testing

    class Meter:
        bytes_out = 0

    async def main():
        a, b = trio.socket.socketpair()
        stream = trio.SocketStream(a)
        queued: list[bytes] = []

        def take() -> bytes:
            out = b"".join(queued)
            queued.clear()
            return out

        meter = Meter()
        wire = Wire(stream, take, 65536, meter)
        assert wire.can_write_now()
        queued.append(b"first")
        assert wire.write_now()
        big = bytes(range(256)) * 40_000  # more than the socket pair buffers
        queued.append(big)
        assert not wire.write_now()  # part of it went; the rest waits for a flush
        assert not wire.can_write_now()
        queued.append(b"later")
        got = bytearray()

        async def read_all():
            while len(got) < len(b"first") + len(big) + len(b"later"):
                got.extend(await b.recv(1 << 16))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all)
            await wire.flush()
        assert bytes(got) == b"first" + big + b"later"  # in order, nothing twice
        assert meter.bytes_out == len(got)
        assert wire.can_write_now()
        b.close()
        await stream.aclose()
        assert wire.can_write_now()  # (a closed socket: write_now raises, as flush does)
        queued.append(b"x")
        with pytest.raises(trio.ClosedResourceError):
            wire.write_now()

    trio.run(main)


def test_pipelined_fan_out_with_prefetch_and_multiple_acks_delivers_everything(tmp_path):
    """The bench's fan-out shape, small: confirms pipelined, 10 queues on one consumer
    connection with prefetch 5 and one `multiple` ack per read: hand-offs that fill the
    room, wake the task for more, or find the room full all end with every message
    delivered once, in order per queue."""
    from gateway.amqp.codec import Content, encode_content, encode_method_frame
    from gateway.amqp.methods import BasicAck, BasicConsume, BasicPublish, BasicQos
    from gateway.amqp.properties import EMPTY_PROPERTIES
    from lmq.bench._amqp_load import RawClient

    queues = [f"pf-{i}" for i in range(10)]
    count = 200

    def client(gw: Gateway):
        service = _as_lmq_serve(gw)
        with pika.BlockingConnection(params(gw.port)) as conn:
            broker_harness.declare_fanout(conn.channel(), "pfan", queues)
        c = RawClient("127.0.0.1", gw.port)
        for q in queues:
            ch = c.channel()
            c.call(ch, BasicQos(prefetch_count=5))
            c.call(ch, BasicConsume(queue=q))
        gw.wait_for(lambda: service.polling >= len(queues))
        pc, pch = broker_harness.confirm_client(gw.port, queues[0])
        pc.sock.sendall(b"".join(  # pipelined: the confirms are not waited for
            encode_content(pch, BasicPublish(exchange="pfan", routing_key=""),
                           EMPTY_PROPERTIES, b"%d" % i, pc.frame_max) for i in range(count)))
        got: dict[int, list[bytes]] = {}
        deadline = time.monotonic() + 30
        while sum(map(len, got.values())) < count * len(queues) and \
                time.monotonic() < deadline:
            c._read()
            last = {}
            for ev in c.events:
                if type(ev) is Content:
                    got.setdefault(ev.channel, []).append(ev.body)
                    last[ev.channel] = ev.method.delivery_tag
            c.events.clear()
            c.sock.sendall(b"".join(encode_method_frame(ch, BasicAck(tag, True))
                                    for ch, tag in last.items()))
        c.close()
        pc.close()
        return got, service.handoffs.runs

    got, runs = run_gateway(tmp_path, client, in_process=True)
    assert len(got) == len(queues)
    assert all(bodies == [b"%d" % i for i in range(count)] for bodies in got.values())
    assert runs > 0
