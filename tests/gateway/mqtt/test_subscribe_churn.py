"""Acknowledged QoS 1 messages under subscribe churn on shared topics (issue 9 §4).

Workers on a few common topics each run cycles of: connect, subscribe (QoS 1), SUBACK,
publish one QoS 1 message of their own, PUBACK, then wait for their own message to come
back, and disconnect. A message the gateway acknowledged must always arrive. Before the
fix, a session leaving a topic could drop the live LMQ state of a session that had just
joined it (`BrokerLink.release` forgot the state by name, not by identity), and that
session was never woken for its own message: about 1 % of cycles lost it.

The topic of each cycle comes from a seeded random generator; the seed is in the failure
message. The fast variant runs a few hundred cycles, the slow one thousands.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from gateway.mqtt.broker_link import BrokerLink
from gateway.mqtt.config import MqttConfig
from gateway.mqtt.packets import (
    Connack,
    Disconnect,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Subscription,
)
from tests.gateway.mqtt.server_harness import GatewayServer, RawClient

#: How long a worker waits for its own acknowledged message (it normally takes ms).
OWN_MESSAGE_WAIT_S = 10.0


def _cycle(port: int, client_id: str, topic: str, payload: bytes) -> str | None:
    """One churn cycle; returns what went wrong, or None."""
    c = RawClient(port, 4)
    try:
        if not isinstance(c.connect(client_id), Connack):
            return "no CONNACK"
        c.send(Subscribe(1, (Subscription(topic, 1),)))
        if c.recv_type(Suback) is None:
            return "no SUBACK"
        c.send(Publish(topic, payload, 1, packet_id=2))
        acked = found = False
        deadline = time.monotonic() + OWN_MESSAGE_WAIT_S
        while not (acked and found):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                p = c.recv(left)
            except TimeoutError:
                break
            if p is None:
                return "connection closed"
            if isinstance(p, Puback) and p.packet_id == 2:
                acked = True
            elif isinstance(p, Publish):
                if p.qos:
                    c.send(Puback(p.packet_id))
                found = found or p.payload == payload
        if not acked:
            return "no PUBACK"
        if not found:
            return "acknowledged but never delivered"
        c.send(Disconnect())
        return None
    finally:
        c.close()


def _churn(seed: int, workers: int, topics: int, cycles: int) -> None:
    problems: list[str] = []
    stop = threading.Event()
    lock = threading.Lock()
    with GatewayServer() as srv:
        def worker(w: int) -> None:
            rnd = random.Random(seed * 1000 + w)
            for i in range(cycles):
                if stop.is_set():
                    return
                topic = f"churn/{seed}/{rnd.randrange(topics)}"
                why = _cycle(srv.port, f"churn-{w}-{i}", topic, f"{w}:{i}".encode())
                if why is not None:
                    with lock:
                        problems.append(f"worker {w} cycle {i} on {topic}: {why}")
                    stop.set()  # one is enough: don't wait out every later loss

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not problems, f"seed {seed}: {problems}"


@pytest.mark.parametrize("seed", [1, 2])
def test_acknowledged_qos1_survives_subscribe_churn(seed):
    _churn(seed, workers=8, topics=2, cycles=30)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [3, 4])
def test_acknowledged_qos1_survives_subscribe_churn_long(seed):
    _churn(seed, workers=8, topics=5, cycles=600)


def test_release_of_a_forgotten_state_keeps_its_successor():
    """A cursor can still hold an LMQ state the link already forgot; releasing that old
    object must not drop the live state a newer reader registered under the same name."""
    link = BrokerLink(None, MqttConfig(), router=lambda topic: ())
    old = link.state("b", "%LMQ%m_x")
    link.release(old)  # nobody reads it: forgotten
    live = link.state("b", "%LMQ%m_x")
    assert live is not old
    live.watchers.add(object())
    link.release(old)
    assert link.state("b", "%LMQ%m_x") is live
