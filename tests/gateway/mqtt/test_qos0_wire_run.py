"""A 3.x QoS 0 delivery's bytes are built per run of one topic and payload size
(outbound.merge_single_v3 keeps the fixed header and topic of the run): whatever the
topics and sizes of a run, every PUBLISH on the wire is the one the codec encodes (in
order per topic: topics are stored apart, their deliveries may interleave otherwise)."""

from __future__ import annotations

import socket

from gateway.mqtt.codec import MqttCodec
from gateway.mqtt.packets import Connect, Publish, Suback, Subscribe, Subscription
from tests.gateway.mqtt.server_harness import GatewayServer


def _client(port: int, cid: str) -> tuple[socket.socket, MqttCodec]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    codec = MqttCodec(protocol_version=4, role="client")
    sock.sendall(codec.encode(Connect(cid, 4)))
    return sock, codec


def test_qos0_deliveries_are_the_codecs_publishes_across_topic_and_size_changes():
    # the remaining length's encoding changes at 128 and 16,384 bytes: sizes on both
    # sides, repeated (a run) and alternating, with topics of different lengths
    sizes = [0, 0, 1, 100, 120, 121, 122, 122, 16370, 16371, 16372, 20000, 20000, 3, 3]
    topics = ["w/a", "w/a", "w/bb", "w/bb", "w/a", "w/ccc", "w/ccc", "w/a"]
    sent = [Publish(topics[i % len(topics)], bytes([i]) * n, 0, False, False, None)
            for i, n in enumerate(sizes + sizes[::-1])]
    with GatewayServer() as srv:
        sub, scodec = _client(srv.port, "sub")
        sub.sendall(scodec.encode(Subscribe(1, (Subscription("w/#", 0),))))
        pub, pcodec = _client(srv.port, "pub")
        got = b""
        while not any(type(p) is Suback for p in scodec.feed(sub.recv(65536))):
            pass
        want = b"".join(pcodec.encode(p) for p in sent)
        pub.sendall(want)  # one write: one publisher's run
        while len(got) < len(want):
            chunk = sub.recv(65536)
            assert chunk, "connection closed"
            got += chunk
        assert len(got) == len(want)
        per_topic: dict[str, list[bytes]] = {}
        for p in sent:
            per_topic.setdefault(p.topic, []).append(pcodec.encode(p))
        for p in MqttCodec(protocol_version=4, role="client").feed(got):
            assert scodec.encode(p) == per_topic[p.topic].pop(0)
        assert not any(per_topic.values())
        pub.close()
        sub.close()
