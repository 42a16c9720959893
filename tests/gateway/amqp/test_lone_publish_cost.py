"""A lone publish's way from the gateway to its stored record and confirm, counted
(docs/amqp.md "pika round, the publish side"): Python calls of one in-process store, and
the confirm's Basic.Ack frame packed in one call."""

from __future__ import annotations

import random
import sys

import pika
import pytest

from core.broker.local_send import LocalSend
from gateway.amqp.broker import AmqpBroker
from gateway.amqp.codec import encode_method_frame
from gateway.amqp.methods import BasicAck
from gateway.amqp.properties import BasicProperties
from gateway.amqp.publish_store import ack_frame
from tests.gateway.amqp.broker_harness import Gateway, params, run_gateway

pytestmark = pytest.mark.timeout(120)

#: Python function calls one lone in-process store may make (store_batch to the put and
#: its arrival listeners). It was 38 before the send properties memo and the put's
#: inlined multi-dispatch; 21 with them (a few spare for listeners added later).
CALLS_PER_STORE = 28


def test_confirm_frame_is_the_method_tables():
    rnd = random.Random(13)
    cases = [(1, 1), (65535, 2**64 - 1), (0, 0)]
    cases += [(rnd.randrange(1 << 16), rnd.randrange(1 << 64)) for _ in range(500)]
    for channel, tag in cases:
        assert ack_frame(channel, tag) == encode_method_frame(channel, BasicAck(tag, True))


def test_a_lone_in_process_store_makes_few_python_calls(tmp_path, monkeypatch):
    attach = AmqpBroker.attach_local

    def attach_local(self, core_broker):  # as gateway/amqp/embedded.py does
        attach(self, core_broker)
        self.local_send = LocalSend.of(core_broker)

    monkeypatch.setattr(AmqpBroker, "attach_local", attach_local)
    counted: dict[str, int] = {}

    def client(gw: Gateway) -> None:
        with pika.BlockingConnection(params(gw.port)) as conn:
            conn.channel().queue_declare("lone")

        async def stores() -> None:
            broker = gw.broker
            assert broker.local_send is not None
            pb = broker.stored_properties("", "lone", BasicProperties(), b"",
                                          broker.route("", "lone", None))
            item = [(pb, b"x" * 1024, None, 1, None)]
            for _ in range(5):  # first stores fill the caches
                assert await broker.store_batch(0, item)

            def profile(frame, event, arg):
                if event == "call":
                    counted[frame.f_code.co_qualname] = counted.get(frame.f_code.co_qualname,
                                                                    0) + 1
            sys.setprofile(profile)
            try:
                for _ in range(50):
                    await broker.store_batch(0, item)
            finally:
                sys.setprofile(None)
            assert broker.local_send.sends == 55

        gw.call(stores)

    run_gateway(tmp_path, client, in_process=True)
    per_store = sum(counted.values()) / 50
    assert per_store <= CALLS_PER_STORE, sorted(counted.items(), key=lambda kv: -kv[1])
    # The properties are not decoded again, the put does not go through its helpers, and
    # a put with nothing to wait for (no HA, group commit or topic being written) returns.
    for name in ("decode_properties", "PutPath._encode_props", "PutPath._dispatch_multi",
                 "BrokerController._after_put"):
        assert name not in counted, name
