"""A broker restarted under load loses no QoS 1 message (issue 12, "Done when"): two `lmq
mqtt` gateways on a cluster of two brokers in `apache_strict` mode, QoS 1 publishers on
both gateways running while one broker is killed with -9 and started again; every
publish the gateway acknowledged (PUBACK 0x00) reaches the persistent QoS 1 subscribers
on both gateways at least once. Real processes, paho clients (cluster_support.py)."""

from __future__ import annotations

import queue
import threading
import time

import pytest
from paho.mqtt.packettypes import PacketTypes

from tests.gateway.mqtt.cluster_support import Cluster, clients
from tests.gateway.mqtt.e2e_support import Client, props, uid

__all__ = ["clients"]  # fixtures used below

pytestmark = pytest.mark.slow

#: Topics per publisher: crc32(topic) spreads them over the store queues of both brokers.
TOPICS = 8
#: How long the subscribers may take to catch up once the publishers stopped.
CATCH_UP_S = 90.0


class _Publisher(threading.Thread):
    """Publishes QoS 1 one at a time until stopped; `acked` holds the payloads the
    gateway answered with PUBACK 0x00 (an error code or no answer is not a promise)."""

    def __init__(self, port: int, name: str, prefix: str) -> None:
        super().__init__(daemon=True)
        self.port, self.label, self.prefix = port, name, prefix
        self.stop_flag = threading.Event()
        self.acked: list[tuple[bytes, float]] = []
        self.refused = 0
        self.client = Client(port, version=5)

    def run(self) -> None:
        i = 0
        self.client.connect()
        while not self.stop_flag.is_set():
            payload = f"{self.label}-{i}".encode()
            topic = f"{self.prefix}/{self.label}/{i % TOPICS}"
            i += 1
            try:
                rc = self.client.publish(topic, payload, qos=1)
            except AssertionError:  # no PUBACK in time, or the connection ended
                self.refused += 1
                if not self.client.is_connected():
                    self.client.connect()
                continue
            if rc == 0:
                self.acked.append((payload, time.monotonic()))
            else:
                self.refused += 1
                time.sleep(0.05)


def _missing(sub: Client, want: set[bytes], seen: set[bytes], timeout: float) -> set[bytes]:
    deadline = time.monotonic() + timeout
    while not want <= seen and time.monotonic() < deadline:
        try:
            seen.add(sub.messages.get(timeout=0.5).payload)
        except queue.Empty:
            pass
    return want - seen


@pytest.mark.parametrize("victim", [0, 1], ids=["state-broker", "other-broker"])
def test_broker_killed_and_restarted_under_load_loses_no_qos1_message(
        tmp_path_factory: pytest.TempPathFactory, clients, victim: int) -> None:
    """Broker 0 holds the route log, client registry and session records as well as
    store queues; broker 1 only store queues and LMQs."""
    c = Cluster(tmp_path_factory.mktemp("cluster"), brokers=2).start()
    pubs: list[_Publisher] = []
    try:
        a = c.gateway({"state_flush_interval_s": 0.1})
        b = c.gateway({"state_flush_interval_s": 0.1})
        prefix = f"load/{uid()}"
        subs = []
        for gw in (a, b):
            s = Client(gw.port, client_id="keep-" + uid(), version=5)
            clients.append(s)
            s.connect(clean_start=False, properties=props(PacketTypes.CONNECT,
                                                          SessionExpiryInterval=3600))
            assert s.subscribe(f"{prefix}/#", qos=1) == [1]
            subs.append(s)
        pubs = [_Publisher(a.port, "pa", prefix), _Publisher(b.port, "pb", prefix)]
        for p in pubs:
            clients.append(p.client)
            p.start()
        time.sleep(1.5)
        c.kill9_broker(victim)
        killed = time.monotonic()
        time.sleep(2.0)
        c.restart_broker(victim)
        restarted = time.monotonic()
        time.sleep(4.0)
        for p in pubs:
            p.stop_flag.set()
        for p in pubs:
            p.join(30)
        acked = {payload for p in pubs for payload, _ in p.acked}
        before = sum(1 for p in pubs for _, t in p.acked if t < killed)
        after = sum(1 for p in pubs for _, t in p.acked if t > restarted)
        print(f"\n[restart] broker {victim}: {len(acked)} acked ({before} before the kill, "
              f"{after} after the restart), {sum(p.refused for p in pubs)} refused")
        assert before > 0 and after > 0, (before, after)
        for gw_name, s in zip("AB", subs, strict=True):
            seen: set[bytes] = set()
            missing = _missing(s, acked, seen, CATCH_UP_S)
            assert not missing, (f"subscriber on {gw_name} lacks {len(missing)} of "
                                 f"{len(acked)} acked messages, e.g. {sorted(missing)[:5]}"
                                 f"\n{c.logs()}")
    finally:
        for p in pubs:
            p.stop_flag.set()
        c.stop()
