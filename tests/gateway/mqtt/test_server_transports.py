"""MQTT over WebSocket (subprotocol "mqtt") and TLS, with paho clients."""

from __future__ import annotations

import ssl

import pytest

from tests.gateway.mqtt.server_harness import Client, GatewayServer
from tests.tls_certs import certs

__all__ = ["certs"]  # fixture used below


@pytest.fixture(scope="module")
def server(certs):
    cert, key = certs
    with GatewayServer(ws_port=0, tls_port=0, certfile=cert, keyfile=key) as srv:
        yield srv


@pytest.mark.parametrize("version", [4, 5])
def test_websocket_client(server, version):
    ws_port = server.gateway.ports["ws"]
    sub = Client(ws_port, f"ws-sub-{version}", version, transport="websockets")
    assert sub.rc == 0
    sub.subscribe("ws/t", 1)
    tcp = Client(server.port, f"ws-tcp-{version}", version)
    tcp.publish("ws/t", b"over websocket " * 100, 1)
    assert sub.get().payload == b"over websocket " * 100
    sub.publish("ws/back", b"x", 1)  # and the other way round
    sub.disconnect()
    tcp.disconnect()


def test_websocket_wrong_path_refused(server):
    ws_port = server.gateway.ports["ws"]
    c = Client(ws_port, "ws-badpath", 4, transport="websockets", ws_path="/nope", connect=False)
    from paho.mqtt.client import WebsocketConnectionError

    with pytest.raises(WebsocketConnectionError):  # our 404 answer to the handshake
        c.connect(timeout=3)


def test_tls_client(server, certs):
    cert, _ = certs
    tls_port = server.gateway.ports["tls"]
    sub = Client(tls_port, "tls-sub", 5, tls=dict(ca_certs=cert, cert_reqs=ssl.CERT_REQUIRED))
    assert sub.rc == 0
    sub.subscribe("tls/t", 2)
    pub = Client(server.port, "tls-pub", 5)
    pub.publish("tls/t", b"secret", 2)
    assert sub.get().payload == b"secret"
    sub.disconnect()
    pub.disconnect()
