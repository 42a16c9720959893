"""Load generator of `lmq bench amqp`: a small blocking AMQP 0-9-1 client of our own
(frames built and read with `gateway/amqp/codec.py`, publishes pre-encoded once) and
pika's BlockingConnection, each in its own worker process.

A worker runs one role until its deadline and returns counts taken at the start and the
end of the measured window (`Window`): the parent turns them into rates. Nothing here
decodes more than it must: deliveries are counted from Deliver frames and acknowledged
with one `multiple` Basic.Ack per socket read.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from gateway.amqp.codec import (
    AmqpDecoder,
    Content,
    MethodFrame,
    encode_content,
    encode_method_frame,
)
from gateway.amqp.methods import (
    BasicAck,
    BasicConsume,
    BasicNack,
    BasicPublish,
    BasicQos,
    ChannelOpen,
    ConfirmSelect,
    ConnectionOpen,
    ConnectionStartOk,
    ConnectionTune,
    ConnectionTuneOk,
    ExchangeDeclare,
    QueueBind,
    QueueDeclare,
)
from gateway.amqp.properties import BasicProperties
from lmq.bench._measure import Measure, Sync, Window

__all__ = ["RawClient", "Sync", "Window", "worker"]

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
_READ = 256 * 1024


class RawClient:
    """One blocking connection; `call` waits for a method's answer (set-up only)."""

    def __init__(self, host: str, port: int, user: str = "guest", password: str = "guest"):
        self.sock = socket.create_connection((host, port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = AmqpDecoder("client", frame_max=131072)
        self.events: list[Any] = []
        self.sock.sendall(PROTOCOL_HEADER)
        self._expect(0, "ConnectionStart")
        resp = f"\0{user}\0{password}"
        self.send(0, ConnectionStartOk({"product": "lmq-bench"}, "PLAIN", resp, "en_US"))
        tune = self._expect(0, "ConnectionTune")
        assert isinstance(tune, ConnectionTune)
        self.frame_max = min(tune.frame_max or 131072, 131072)
        self.send(0, ConnectionTuneOk(tune.channel_max or 2047, self.frame_max, 0))
        self.decoder.frame_max = self.frame_max
        self.send(0, ConnectionOpen("/"))
        self._expect(0, "ConnectionOpenOk")
        self.channels = 0

    def send(self, channel: int, method: Any) -> None:
        self.sock.sendall(encode_method_frame(channel, method))

    def _read(self) -> None:
        data = self.sock.recv(_READ)
        if not data:
            raise ConnectionError("server closed the connection")
        self.events.extend(self.decoder.feed(data))

    def _expect(self, channel: int, name: str) -> Any:
        while True:
            for i, ev in enumerate(self.events):
                if type(ev) is MethodFrame and ev.channel == channel:
                    method = ev.method
                    if type(method).__name__ == name:
                        del self.events[i]
                        return method
                    if type(method).__name__ in ("ChannelClose", "ConnectionClose"):
                        raise RuntimeError(f"closed: {method.reply_code} {method.reply_text}")
            self._read()

    def call(self, channel: int, method: Any) -> Any:
        self.send(channel, method)
        return self._expect(channel, type(method).__name__ + "Ok")

    def channel(self) -> int:
        self.channels += 1
        self.call(self.channels, ChannelOpen())
        return self.channels

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def declare(client: RawClient, ch: int, queue: str, durable: bool = False) -> None:
    client.call(ch, QueueDeclare(queue=queue, durable=durable))


def setup_fanout(client: RawClient, ch: int, exchange: str, queues: list[str]) -> None:
    client.call(ch, ExchangeDeclare(exchange=exchange, exchange_type="topic"))
    for q in queues:
        client.call(ch, QueueDeclare(queue=q))
        client.call(ch, QueueBind(queue=q, exchange=exchange, routing_key="bench.#"))


def raw_publisher(host: str, port: int, exchange: str, key: str, size: int, persistent: bool,
                  window: int, fan: int, sync: Sync, warmup: float, duration: float) -> Window:
    """Publish with confirms, at most `window` unconfirmed and at most `window` messages
    ahead of the consumers (each publish counts `fan` deliveries), until the window
    closes."""
    c = RawClient(host, port)
    ch = c.channel()
    c.call(ch, ConfirmSelect())
    props = BasicProperties(content_type="application/octet-stream",
                            delivery_mode=2 if persistent else 1)
    frame = encode_content(ch, BasicPublish(exchange=exchange, routing_key=key), props,
                           os.urandom(size), c.frame_max)
    batch = 16
    frames = frame * batch
    sent = confirmed = 0
    consumed = sync.consumed
    clock = Measure(Window("publisher"), sync, warmup, duration)
    while clock.running(confirmed):
        if sent - confirmed + batch <= window:
            if (sent + batch) * fan - consumed.value <= window * fan:
                c.sock.sendall(frames)
                sent += batch
                continue
            if sent == confirmed:
                time.sleep(0.0005)  # consumers behind: wait for them, not for the server
                continue
        c._read()
        for ev in c.events:
            if type(ev) is MethodFrame:
                m = ev.method
                if type(m) is BasicAck or type(m) is BasicNack:
                    confirmed = max(confirmed, m.delivery_tag) if m.multiple else confirmed + 1
        c.events.clear()
    w = clock.finish(confirmed)
    w.extra["sent"] = sent
    c.close()
    return w


def raw_consumer(host: str, port: int, queues: list[str], prefetch: int, sync: Sync,
                 warmup: float, duration: float) -> Window:
    """Consume `queues` (a channel each), manual acks: one `multiple` ack per read."""
    c = RawClient(host, port)
    by_channel = {}
    for q in queues:
        ch = c.channel()
        c.call(ch, BasicQos(prefetch_count=prefetch))
        c.call(ch, BasicConsume(queue=q))
        by_channel[ch] = 0
    got = 0
    consumed = sync.consumed
    clock = Measure(Window("consumer"), sync, warmup, duration)
    c.sock.settimeout(0.2)
    while clock.running(got):
        try:
            c._read()
        except TimeoutError:
            continue
        last: dict[int, int] = {}
        for ev in c.events:
            if type(ev) is Content:
                got += 1
                last[ev.channel] = ev.method.delivery_tag
        c.events.clear()
        consumed.value = got
        if last:
            c.sock.sendall(b"".join(encode_method_frame(ch, BasicAck(tag, True))
                                    for ch, tag in last.items()))
    w = clock.finish(got)
    c.close()
    return w


def pika_publisher(host: str, port: int, queue: str, size: int, window: int, sync: Sync,
                   warmup: float, duration: float) -> Window:
    """pika BlockingConnection with confirm_delivery: each publish waits for its confirm."""
    import pika

    conn = pika.BlockingConnection(pika.ConnectionParameters(host, port))
    ch = conn.channel()
    ch.confirm_delivery()
    body = os.urandom(size)
    n = 0
    consumed = sync.consumed
    clock = Measure(Window("pika-publisher"), sync, warmup, duration)
    while clock.running(n):
        if n - consumed.value >= window:
            time.sleep(0.0005)
            continue
        ch.basic_publish("", queue, body)
        n += 1
    w = clock.finish(n)
    conn.close()
    return w


def pika_consumer(host: str, port: int, queue: str, prefetch: int, sync: Sync,
                  warmup: float, duration: float) -> Window:
    """pika BlockingConnection, basic_consume, one basic_ack per message."""
    import pika

    conn = pika.BlockingConnection(pika.ConnectionParameters(host, port))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=prefetch)
    count = [0]

    consumed = sync.consumed

    def on(ch_, method, _props, _body):
        count[0] += 1
        consumed.value = count[0]
        ch_.basic_ack(method.delivery_tag)

    ch.basic_consume(queue, on)
    clock = Measure(Window("pika-consumer"), sync, warmup, duration)
    while clock.running(count[0]):
        conn.process_data_events(time_limit=0.05)
    w = clock.finish(count[0])
    conn.close()
    return w


def declare_many(host: str, port: int, prefix: str, count: int) -> Window:
    """Declare `count` queues (pipelined in groups), for the memory phase."""
    c = RawClient(host, port)
    ch = c.channel()
    w = Window("declarer")
    t = time.monotonic()
    group = 100
    for base in range(0, count, group):
        names = [f"{prefix}{i}" for i in range(base, min(base + group, count))]
        c.sock.sendall(b"".join(encode_method_frame(ch, QueueDeclare(queue=n)) for n in names))
        for _ in names:
            c._expect(ch, "QueueDeclareOk")
    w.end = w.total = count
    w.extra["seconds"] = time.monotonic() - t
    c.close()
    return w


ROLES = {"raw_publisher": raw_publisher, "raw_consumer": raw_consumer,
         "pika_publisher": pika_publisher, "pika_consumer": pika_consumer,
         "declare_many": declare_many}


def worker(cpus: tuple[int, ...], role: str, args: tuple, out) -> None:
    """Process entry: pin, run the role, put its Window on `out`."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    try:
        out.put(ROLES[role](*args))
    except Exception as exc:  # reported, not raised: the parent prints it
        out.put(Window(role, error=f"{type(exc).__name__}: {exc}"))
