"""A `$share` message a member holds unacknowledged (POP mode, several gateways) has its
invisible time renewed (CHANGE_MESSAGE_INVISIBLETIME, gateway/mqtt/shared.py), so the
broker does not hand it to another member while it is held. A real gateway and broker in
one process (server_harness), put in POP mode as when another gateway joins; short
invisible and renewal times for the test."""

from __future__ import annotations

import time

from gateway.mqtt import shared
from tests.gateway.mqtt.e2e_support import Client, uid
from tests.gateway.mqtt.server_harness import GatewayServer


def test_held_share_message_is_not_handed_out_again(monkeypatch) -> None:
    monkeypatch.setattr(shared, "SHARE_INVISIBLE_MS", 1500)
    monkeypatch.setattr(shared, "SHARE_RENEW_S", 0.5)
    monkeypatch.setattr(shared, "SHARE_REPOLL_S", 0.2)  # a revived message is found fast
    made: list[Client] = []
    with GatewayServer() as srv:
        srv.call(srv.gateway.link.share_lmqs)
        try:
            topic, group = f"renew/{uid()}", f"g{uid()}"
            lazy = Client(srv.port)
            made.append(lazy)
            lazy.connect()
            lazy.paho.manual_ack_set(True)  # holds what it gets
            lazy.subscribe(f"$share/{group}/{topic}", qos=1)
            pub = Client(srv.port)
            made.append(pub)
            pub.connect()
            assert pub.publish(topic, b"held", qos=1) == 0
            got = lazy.receive_one()
            assert got.payload == b"held"
            other = Client(srv.port)
            made.append(other)
            other.connect()
            other.subscribe(f"$share/{group}/{topic}", qos=1)
            time.sleep(4.5)  # three invisible times: the broker would have revived it
            assert other.messages.empty() and lazy.messages.empty(), "handed out again"
            lazy.paho.ack(got.mid, 1)
            assert pub.publish(topic, b"next", qos=1) == 0
            nxt = other.drain() + lazy.drain()
            assert [m.payload for m in nxt] == [b"next"]
        finally:
            for c in made:
                c.close()
