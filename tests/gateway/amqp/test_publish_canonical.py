"""Stored properties of a batch of publishes leave empty values out, so the store appends
each message's queue offsets to them as they are instead of decoding and re-encoding them
(core/store/put_batch.py `_plan_dicts`); what consumers see is unchanged."""

from __future__ import annotations

import pika
import pytest

import core.store.put_batch as put_batch
from core.store import speedups
from gateway.amqp.codec import MethodFrame, encode_content
from gateway.amqp.methods import BasicAck, BasicPublish
from gateway.amqp.properties import BasicProperties
from tests.gateway.amqp.broker_harness import confirm_client, params, run_gateway

COUNT = 24


def test_default_exchange_batches_skip_the_store_dict_path(tmp_path, monkeypatch):
    if speedups.split_batch is None:
        pytest.skip("the store's batch planner is the C one (core/_speedups.c)")
    decoded: list[str] = []
    original = put_batch.decode_properties

    def spy(text):
        if "AMQP_" in text:
            decoded.append(text)
        return original(text)

    monkeypatch.setattr(put_batch, "decode_properties", spy)

    def client(gw):
        c, ch = confirm_client(gw.port, "q")
        # Default exchange (an empty exchange name), every other one without properties.
        frames = [encode_content(ch, BasicPublish(routing_key="q"),
                                 BasicProperties(content_type="t/x") if i % 2
                                 else BasicProperties(), b"m%d" % i, 131072)
                  for i in range(COUNT)]
        c.sock.sendall(b"".join(frames))
        acked = 0
        while acked < COUNT:
            c._read()
            for ev in c.events:
                if type(ev) is MethodFrame and type(ev.method) is BasicAck:
                    acked = max(acked, ev.method.delivery_tag)
            c.events.clear()
        c.close()
        got = []
        with pika.BlockingConnection(params(gw.port)) as conn:
            pch = conn.channel()
            while (m := pch.basic_get("q", auto_ack=True))[0] is not None:
                got.append((m[0].exchange, m[0].routing_key, m[1].content_type, m[2]))
        return got

    got = run_gateway(tmp_path, client)
    assert got == [("", "q", "t/x" if i % 2 else None, b"m%d" % i) for i in range(COUNT)]
    assert decoded == []
