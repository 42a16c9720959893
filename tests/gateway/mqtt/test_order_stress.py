"""Per-topic order (MQTT 4.6) through the whole delivery path, at its edges.

Raw-socket clients (one writer each, so the order on the wire is the order sent) publish
seeded random mixes of QoS 0 and 1 on a few topics each, in random write sizes, while
subscribers read them through a wildcard and through overlapping filters of one session
(the k-way merge). The gateway runs with a tiny `backpressure_lag`, `pull_batch`,
`max_out_buffer` and memory of recent LMQ entries, so the delivery gate closes, readers
fall out of the recent entries and pull, and pumps stop on a full output buffer. Every
subscriber must get every message, and each topic's messages in the order they were sent
(a swap of predicted LMQ offsets or of a pulled batch fails it).
"""

from __future__ import annotations

import random
import socket
import threading
import time

import pytest

from gateway.mqtt import lmq_state
from gateway.mqtt._encoding import encode_packet
from gateway.mqtt.packets import Connack, Puback, Publish, Suback, Subscribe, Subscription
from tests.gateway.mqtt.server_harness import GatewayServer, RawClient

PUBLISHERS = 3
TOPICS_PER_PUBLISHER = 3
MESSAGES_PER_PUBLISHER = 300
WAIT_S = 20.0


def _publisher(port: int, seed: int, p: int, errors: list[str]) -> None:
    rnd = random.Random(seed * 100 + p)
    c = RawClient(port, 4)
    try:
        if not isinstance(c.connect(f"ord-pub-{seed}-{p}"), Connack):
            errors.append(f"publisher {p}: no CONNACK")
            return
        wire = b""
        pid = 0
        for i in range(MESSAGES_PER_PUBLISHER):
            topic = f"ord/{seed}/{p}/{rnd.randrange(TOPICS_PER_PUBLISHER)}"
            qos = rnd.randrange(2)
            if qos:
                pid = pid % 65535 + 1
            wire += encode_packet(
                Publish(topic, f"{p}:{i}".encode(), qos, packet_id=pid if qos else None), 4)
            if rnd.random() < 0.2:  # writes of random sizes: many PUBLISHes per read, or one
                c.send_raw(wire)
                wire = b""
        c.send_raw(wire)
        # Half-close and read until the server closes: it read everything we sent (a close
        # with unread PUBACKs could reset the connection under the last PUBLISHes).
        c.sock.shutdown(socket.SHUT_WR)
        if not c.closed(WAIT_S):
            errors.append(f"publisher {p}: the server did not close after our EOF")
    finally:
        c.close()


def _subscriber(port: int, seed: int, name: str, filters: list[str], expected: int,
                ready: threading.Event, got: dict[str, list[str]], errors: list[str]) -> None:
    c = RawClient(port, 4)
    try:
        if not isinstance(c.connect(f"ord-sub-{seed}-{name}"), Connack):
            errors.append(f"{name}: no CONNACK")
            return
        c.send(Subscribe(1, tuple(Subscription(f, 2) for f in filters)))
        if c.recv_type(Suback) is None:
            errors.append(f"{name}: no SUBACK")
            return
        ready.set()
        n = 0
        deadline = time.monotonic() + WAIT_S
        while n < expected:
            left = deadline - time.monotonic()
            try:
                p = c.recv(max(left, 0.001))
            except TimeoutError:
                errors.append(f"{name}: received {n} of {expected}")
                return
            if p is None:
                errors.append(f"{name}: connection closed after {n} of {expected}")
                return
            if isinstance(p, Publish):
                if p.qos:
                    c.send(Puback(p.packet_id))
                got.setdefault(p.topic, []).append(p.payload.decode())
                n += 1
    finally:
        c.close()


def _check_order(name: str, got: dict[str, list[str]], errors: list[str]) -> None:
    for topic, payloads in got.items():
        seq = [int(x.split(":")[1]) for x in payloads]
        if seq != sorted(seq) or len(set(seq)) != len(seq):
            first = next(i for i in range(1, len(seq)) if seq[i] <= seq[i - 1])
            errors.append(f"{name}: {topic} out of order at {first}: {seq[first - 1:first + 2]}")


#: (seed, backpressure_lag, recent LMQ entries kept): the first closes the delivery gate
#: often, the second has readers fall out of the recent entries and pull most of them.
CASES = [(1, 4, 8), (2, 16, 4)]


@pytest.mark.parametrize(("seed", "lag", "recent"), CASES, ids=["gate", "pulls"])
def test_per_topic_order_at_the_delivery_edges(seed, lag, recent, monkeypatch):
    monkeypatch.setattr(lmq_state, "RECENT_ENTRIES", recent)
    with GatewayServer(backpressure_lag=lag, pull_batch=3, max_out_buffer=512,
                       store_queues=2) as srv:
        total = PUBLISHERS * MESSAGES_PER_PUBLISHER
        subs = {
            "all": ([f"ord/{seed}/#"], total),
            # overlapping filters of one session: each message once, merged by store order
            "merge": ([f"ord/{seed}/+/0", f"ord/{seed}/#"], total),
        }
        errors: list[str] = []
        results: dict[str, dict[str, list[str]]] = {name: {} for name in subs}
        threads = []
        for name, (filters, expected) in subs.items():
            ready = threading.Event()
            t = threading.Thread(target=_subscriber, args=(srv.port, seed, name, filters, expected,
                                                           ready, results[name], errors))
            t.start()
            threads.append(t)
            assert ready.wait(WAIT_S), f"{name} did not subscribe"
        pubs = [threading.Thread(target=_publisher, args=(srv.port, seed, p, errors))
                for p in range(PUBLISHERS)]
        for t in pubs:
            t.start()
        for t in pubs + threads:
            t.join(WAIT_S * 2)
        for name in subs:
            _check_order(name, results[name], errors)
        assert not errors, f"seed {seed}: {errors}"
