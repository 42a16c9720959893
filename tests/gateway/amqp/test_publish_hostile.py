"""Hostile publish streams (valid publishes cut, flipped, padded: what the publish scanner
and the frame decoder meet first) on connections of their own never hold up a publisher
on another connection: its confirms keep coming, and new connections are served."""

from __future__ import annotations

import random
import socket

from gateway.amqp.codec import encode_content
from gateway.amqp.methods import BasicPublish
from gateway.amqp.properties import BasicProperties
from lmq.bench._amqp_load import RawClient
from tests.gateway.amqp.broker_harness import confirm_client, run_gateway
from tests.gateway.amqp.test_publish_scan import _mutate, _publish

HOSTILE = 25
CONNECTION_CLOSE = b"\x00\x0a\x00\x32"  # the ids of connection.close


def test_hostile_publish_streams_do_not_hold_up_other_publishers(tmp_path):
    def client(gw):
        rng = random.Random(11)
        good, ch = confirm_client(gw.port, "steady")
        frame = encode_content(ch, BasicPublish(routing_key="steady"), BasicProperties(),
                               b"ok", good.frame_max)
        tags, closed = [], 0
        try:
            for _ in range(HOSTILE):
                bad = RawClient("127.0.0.1", gw.port)
                bad_ch = bad.channel()
                stream = b"".join(_publish(rng, bad_ch) for _ in range(rng.randrange(1, 6)))
                bad.sock.sendall(_mutate(rng, stream) + _mutate(rng, stream))
                good.sock.sendall(frame)  # meanwhile: confirmed as always
                tags.append(good._expect(ch, "BasicAck").delivery_tag)
                bad.sock.shutdown(socket.SHUT_WR)  # then the server ends it either way
                bad.sock.settimeout(10)
                answer = b""
                try:
                    while chunk := bad.sock.recv(65536):
                        answer += chunk
                except ConnectionError:
                    pass
                closed += CONNECTION_CLOSE in answer  # refused with a reply code
                bad.close()
            fresh, fresh_ch = confirm_client(gw.port, "steady")
            fresh.close()
        finally:
            good.close()
        return tags, closed, fresh_ch

    tags, closed, fresh_ch = run_gateway(tmp_path, client, in_process=True)
    assert tags == list(range(1, HOSTILE + 1))
    assert closed > 0 and fresh_ch == 1  # some were refused; a new client is served
