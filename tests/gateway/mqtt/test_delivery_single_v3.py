"""The lean delivery path of one QoS 0/1 subscription of a 3.x session
(outbound.merge_single_v3): the order, the QoS downgrade (min of published and granted),
the in-flight window and the acknowledgements are those of the general merge."""

from __future__ import annotations

import socket

from gateway.mqtt.codec import MqttCodec
from gateway.mqtt.packets import Connect, Puback, Publish, Suback, Subscribe, Subscription
from tests.gateway.mqtt.server_harness import GatewayServer


def _client(port: int, cid: str) -> tuple[socket.socket, MqttCodec]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    codec = MqttCodec(protocol_version=4, role="client")
    sock.sendall(codec.encode(Connect(cid, 4)))
    return sock, codec


def _packets(sock: socket.socket, codec: MqttCodec, want, n: int) -> list:
    got: list = []
    while len(got) < n:
        chunk = sock.recv(65536)
        assert chunk, "connection closed"
        got += [p for p in codec.feed(chunk) if type(p) is want]
    return got


def test_a_qos1_subscription_gets_mixed_qos_in_order_within_its_window():
    with GatewayServer(max_inflight_out=3) as srv:
        sub, scodec = _client(srv.port, "sub")
        sub.sendall(scodec.encode(Subscribe(1, (Subscription("mix/#", 1),))))
        assert _packets(sub, scodec, Suback, 1)[0].reason_codes == (1,)
        pub, pcodec = _client(srv.port, "pub")
        qos = [i % 2 for i in range(20)]  # QoS 0 and 1 alternating
        pub.sendall(b"".join(pcodec.encode(Publish("mix/t", bytes([i]), q, False, False,
                                                   i + 1 if q else None))
                             for i, q in enumerate(qos)))
        got: list[Publish] = []
        acked = 0
        while len(got) < len(qos):
            got += _packets(sub, scodec, Publish, 1)
            unacked = [p for p in got if p.qos == 1][acked:]
            assert len(unacked) <= 3  # the window holds
            sub.sendall(b"".join(scodec.encode(Puback(p.packet_id)) for p in unacked))
            acked += len(unacked)
        assert [p.payload for p in got] == [bytes([i]) for i in range(20)]
        assert [p.qos for p in got] == qos
        pub.close()
        sub.close()
