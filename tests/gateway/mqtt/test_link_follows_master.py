"""A publish whose broker address went stale (its master was replaced by a slave after a
failover, docs/ha.md) is stored at the broker name's current master: the broker link reads
the cluster again as soon as a send cannot connect, not at its next periodic refresh."""

from __future__ import annotations

import socket

from tests.gateway.mqtt.server_harness import Client, GatewayServer, wait_for


def _dead_address() -> str:
    with socket.socket() as s:  # a port nobody listens on once this closes
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_publish_reaches_the_current_master_after_the_address_went_stale():
    with GatewayServer() as srv:
        link = srv.gateway.link
        (name, live), = link.brokers.items()
        link.brokers[name] = _dead_address()  # what a failover leaves behind
        stored, failed = link.stats["stored"], link.stats["failed"]
        pub = Client(srv.port)
        try:
            pub.publish("stale/addr", b"x", qos=1)
            assert wait_for(lambda: link.stats["stored"] > stored
                            or link.stats["failed"] > failed)
            assert link.stats["stored"] == stored + 1 and link.stats["failed"] == failed
            assert link.brokers[name] == live
        finally:
            pub.disconnect()
