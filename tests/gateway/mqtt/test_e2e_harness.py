"""The acceptance harness itself: what its paho `Client` puts on the wire.

`test_per_topic_order_is_kept[0]` once saw two QoS 0 messages of one publisher arrive
swapped. The swap was the harness's: paho 2.x writes a PUBLISH from the calling thread
(publish() -> loop_write(), since our I/O thread is not paho's `loop_start` thread) and
from the I/O thread (loop() -> loop_write()), and `_packet_write` takes a packet off its
queue and sends it without a lock. The I/O thread could take message 46, be preempted,
and the caller send message 47 first. Here that interleaving is driven on purpose.
"""

from __future__ import annotations

import threading

from tests.gateway.mqtt.e2e_support import TIMEOUT, clients, gateway, uid

__all__ = ["clients", "gateway"]  # fixtures used below

#: How long the held write waits for a writer that would overtake it.
HOLD_S = 0.5


def test_publishes_reach_the_wire_in_call_order_with_two_writer_threads(clients):
    topic = f"e2e/harness/order/{uid()}"
    sub, pub = clients(), clients()
    sub.connect()
    sub.subscribe(topic, qos=2)
    pub.connect()
    c = pub.paho
    held = threading.Event()  # "first" is off paho's queue, its write is held here
    overtaken = threading.Event()  # "second" was written meanwhile
    send = c._sock_send

    def sock_send(buf):
        data = bytes(buf)
        if data.endswith(b"first") and not held.is_set():
            held.set()
            overtaken.wait(HOLD_S)  # a writer that does not wait for this one goes first
            return send(buf)
        n = send(buf)
        if data.endswith(b"second"):
            overtaken.set()
        return n

    c._sock_send = sock_send
    # "first" is written by another thread (as paho's I/O thread does); "second" is
    # published only once "first" was taken off the queue, so it must follow it.
    other = threading.Thread(target=pub.publish, args=(topic, b"first"), kwargs={"wait": False})
    other.start()
    assert held.wait(TIMEOUT)
    pub.publish(topic, b"second", wait=False)
    other.join(TIMEOUT)
    got = sub.receive(2)
    assert [m.payload for m in got] == [b"first", b"second"]
