"""Embedded (`lmq serve`): the MQTT gateway stores its publishes through LocalSend, with no
SEND request through the in-process transport; detached, the same through requests
(core/broker/local_send.py, docs/store-api.md "In process")."""

from __future__ import annotations

import pytest

from core.broker.processors.send import decode_send_header
from core.remoting.codes import RequestCode
from tests.gateway.mqtt.server_harness import Client, GatewayServer

pytestmark = pytest.mark.timeout(60)

_SEND_CODES = {RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2,
               RequestCode.SEND_BATCH_MESSAGE}


def _count_sends(gw: GatewayServer) -> list[int]:
    """Count the SEND requests to the gateway's store topic that the broker's processor
    table hands its send handler (any transport; the gateway's route log and session
    state are other topics)."""
    table = gw.server.broker.table
    store_topic = gw.mqtt_config.store_topic
    sends = [0]
    for code in _SEND_CODES:
        handler, inline = table.lookup(code)

        async def counting(ctx, cmd, handler=handler):
            if decode_send_header(cmd).topic == store_topic:
                sends[0] += 1
            return await handler(ctx, cmd)

        table.register(code, counting, inline=inline)
    return sends


def _round_trip(gw: GatewayServer, topic: str, n: int) -> list[bytes]:
    sub = Client(gw.port, "sub-" + topic)
    pub = Client(gw.port, "pub-" + topic)
    try:
        sub.subscribe(topic, qos=1)
        for i in range(n):
            pub.publish(topic, b"m%d" % i, qos=1 if i % 2 else 0)
        return sorted(m.payload for m in sub.get_all(n))
    finally:
        pub.disconnect()
        sub.disconnect()


def test_publishes_stored_without_send_requests_then_through_them_detached():
    with GatewayServer() as gw:
        sends = _count_sends(gw)
        link = gw.gateway.link
        assert link.local_send is not None
        got = _round_trip(gw, "local/a", 10)
        assert got == sorted(b"m%d" % i for i in range(10))
        assert sends[0] == 0
        assert link.local_send.sends >= 1
        assert link.stats["stored"] >= 10

        gw.call(setattr, link, "local_send", None)  # detached: requests again
        got = _round_trip(gw, "local/b", 10)
        assert got == sorted(b"m%d" % i for i in range(10))
        assert sends[0] >= 1


def test_a_broker_refusal_reaches_the_publisher(monkeypatch):
    """A message the broker refuses (too large for its max_message_size) is not acked as
    stored: a v5 publisher gets the same reason code with and without LocalSend."""
    codes = []
    with GatewayServer() as gw:
        gw.server.broker.config.max_message_size = 1000
        link = gw.gateway.link
        for attach in (True, False):
            if not attach:
                gw.call(setattr, link, "local_send", None)
            pub = Client(gw.port, f"big-{attach}", version=5)
            try:
                info = pub.publish("big/x", b"x" * 2000, qos=1, wait=False)
                _mid, rc = pub.acks.get(timeout=10)
                info.wait_for_publish(10)
                codes.append(rc)
            finally:
                pub.disconnect()
    assert codes[0] == codes[1]
    assert codes[0] != 0
