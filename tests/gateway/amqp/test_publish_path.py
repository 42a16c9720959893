"""The publish path's two ways in (`AmqpSession.publish_now` for the common publish, the
`handle` coroutine for the rest): a real gateway, pipelined publishes of both kinds on one
channel, confirms and returns in publish order."""

from __future__ import annotations

import pika

from gateway.amqp.codec import Content, MethodFrame, encode_content, encode_method_frame
from gateway.amqp.connection import ContentReceived
from gateway.amqp.methods import (
    BasicAck,
    BasicNack,
    BasicPublish,
    BasicReturn,
    ConfirmSelect,
    QueueDeclare,
)
from gateway.amqp.properties import BasicProperties
from gateway.amqp.session import AmqpSession
from lmq.bench._amqp_load import RawClient
from tests.gateway.amqp.broker_harness import confirm_client, params, run_gateway


def _publish(ch: int, key: str, body: bytes, mandatory: bool = False) -> bytes:
    return encode_content(ch, BasicPublish(routing_key=key, mandatory=mandatory),
                          BasicProperties(delivery_mode=2), body, 131072)


def test_mixed_publishes_keep_their_confirm_order(tmp_path):
    def client(gw):
        c = RawClient("127.0.0.1", gw.port)
        ch = c.channel()
        c.call(ch, QueueDeclare(queue="plain"))
        c.call(ch, QueueDeclare(queue="one", arguments={"x-max-length": 1,
                                                        "x-overflow": "reject-publish"}))
        c.call(ch, ConfirmSelect())
        # One write: plain publishes (taken at once), a mandatory one to no queue (Return,
        # then its ack), two to a full reject-publish queue (ack, then nack), plain again.
        c.sock.sendall(b"".join([
            _publish(ch, "plain", b"p1"), _publish(ch, "nowhere", b"r", mandatory=True),
            _publish(ch, "plain", b"p2"), _publish(ch, "one", b"o1"),
            _publish(ch, "one", b"o2"), _publish(ch, "plain", b"p3"),
        ]))
        seen: list = []  # ("return", body) or (tag, "ack" | "nack"), in arrival order
        while len(seen) < 7:
            c._read()
            for ev in c.events:
                m = ev.method
                if type(ev) is Content and type(m) is BasicReturn:
                    seen.append(("return", ev.body))
                elif type(ev) is MethodFrame and type(m) in (BasicAck, BasicNack):
                    done = max([t for t, _ in seen if t != "return"], default=0)
                    last = m.delivery_tag if m.multiple else done + 1
                    kind = "ack" if type(m) is BasicAck else "nack"
                    seen += [(t, kind) for t in range(done + 1, last + 1)]
            c.events.clear()
        c.close()
        with pika.BlockingConnection(params(gw.port)) as conn:
            pch = conn.channel()
            bodies = []
            while (got := pch.basic_get("plain", auto_ack=True))[0] is not None:
                bodies.append(got[2])
        return seen, bodies

    seen, bodies = run_gateway(tmp_path, client)
    confirms = [c for c in seen if c[0] != "return"]
    assert confirms == [(1, "ack"), (2, "ack"), (3, "ack"), (4, "ack"), (5, "nack"),
                        (6, "ack")]
    assert seen.index(("return", b"r")) < seen.index((2, "ack"))  # Return first
    assert bodies == [b"p1", b"p2", b"p3"]


def test_plain_publishes_are_taken_without_the_coroutine_path(tmp_path, monkeypatch):
    handled: list = []
    original = AmqpSession.handle

    async def counting(self, event):
        if type(event) is ContentReceived:
            handled.append(event.content.method.routing_key)
        await original(self, event)

    monkeypatch.setattr(AmqpSession, "handle", counting)

    def client(gw):
        c, ch = confirm_client(gw.port, "q")
        c.sock.sendall(b"".join(_publish(ch, "q", b"%d" % i) for i in range(50)) +
                       _publish(ch, "missing", b"x") +
                       encode_method_frame(ch, ConfirmSelect()))
        c._expect(ch, "ConfirmSelectOk")  # after the 51 publishes: all were handled
        c.close()

    run_gateway(tmp_path, client)
    # The first publish learns the write permission on the default exchange; after it
    # only the unroutable one takes the slow path.
    assert handled == ["q", "missing"]
