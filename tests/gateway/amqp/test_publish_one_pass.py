"""A publisher that waits for each confirm (pika's BlockingConnection) costs the gateway
one trio scheduler pass per message: the publish is read, stored in-process and confirmed
by the connection's own task (AmqpSession.store_queued), not handed to the store loop (a
second task, a second pass). Busy publishers still use the store loop: their reads fill
the buffer, and the next read overlaps the store. The publishes of one read that repeat the previous
one reuse its routing, until the task awaits (a method in between routes again)."""

from __future__ import annotations

import trio

from gateway.amqp.codec import encode_content
from gateway.amqp.methods import BasicPublish
from gateway.amqp.properties import BasicProperties
from tests.gateway.amqp.broker_harness import confirm_client, run_gateway

MESSAGES = 300


class _Passes(trio.abc.Instrument):
    """Scheduler passes: trio waits for I/O once per pass of its run loop."""

    def __init__(self) -> None:
        self.passes = 0

    def before_io_wait(self, timeout: float) -> None:
        self.passes += 1


def test_a_publish_waiting_for_its_confirm_costs_one_scheduler_pass(tmp_path):
    def client(gw):
        c, ch = confirm_client(gw.port, "one.pass")
        frame = encode_content(ch, BasicPublish(routing_key="one.pass"), BasicProperties(),
                               b"x" * 1024, c.frame_max)
        try:
            for _ in range(20):  # warm up (first stores create the queue's files)
                c.sock.sendall(frame)
                c._expect(ch, "BasicAck")
            counter = _Passes()

            async def add() -> None:
                trio.lowlevel.add_instrument(counter)

            async def remove() -> None:
                trio.lowlevel.remove_instrument(counter)

            gw.call(add)
            tags = []
            for _ in range(MESSAGES):
                c.sock.sendall(frame)
                tags.append(c._expect(ch, "BasicAck").delivery_tag)
            gw.call(remove)
        finally:
            c.close()
        return counter.passes, tags

    passes, tags = run_gateway(tmp_path, client, in_process=True)
    assert tags == list(range(21, 21 + MESSAGES))  # every publish confirmed, in order
    # Two passes per message before (the store loop's task ran in a pass of its own);
    # the margin is for the harness's timers (route log heartbeats, the flush timer).
    assert passes < 1.4 * MESSAGES, passes / MESSAGES


def test_a_bind_between_two_publishes_of_one_read_routes_the_second(tmp_path):
    """Publishes of one read that repeat the previous one reuse its routing; a method in
    between (here a bind, sent in the same segment) makes the next publish route again."""
    from gateway.amqp.codec import encode_method_frame
    from gateway.amqp.methods import ExchangeDeclare, QueueBind, QueueDeclare

    def client(gw):
        c, ch = confirm_client(gw.port, "route.a")
        try:
            c.call(ch, QueueDeclare(queue="route.b"))
            c.call(ch, ExchangeDeclare(exchange="route.x", exchange_type="direct"))
            c.call(ch, QueueBind(queue="route.a", exchange="route.x", routing_key="k"))
            pub = encode_content(ch, BasicPublish(exchange="route.x", routing_key="k"),
                                 BasicProperties(), b"m", c.frame_max)
            c.sock.sendall(pub + pub + encode_method_frame(
                ch, QueueBind(queue="route.b", exchange="route.x", routing_key="k")) +
                pub + pub)
            tags = []
            while len(tags) < 1 or tags[-1] < 4:
                tags.append(c._expect(ch, "BasicAck").delivery_tag)
            c._expect(ch, "QueueBindOk")
            counts = [c.call(ch, QueueDeclare(queue=q, passive=True)).message_count
                      for q in ("route.a", "route.b")]
        finally:
            c.close()
        return counts

    assert run_gateway(tmp_path, client, in_process=True) == [4, 2]
