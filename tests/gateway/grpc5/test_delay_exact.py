"""A 5.x DELAY message is delivered at its delivery_timestamp, not rounded up to the next
delay level (docs/grpc.md "Delivery times"): the official producer asks for ~3 s ahead
(the client gives whole seconds), which the default levels (1s 5s ...) used to turn into
5 s; the cascade (1 s hops) delivers it on time."""

from __future__ import annotations

import time

import grpc
import pytest

from gateway.grpc5.proto import messaging_pb2 as pb
from gateway.grpc5.proto import messaging_pb2_grpc as pbg
from tests.gateway.grpc5.harness import GrpcCluster, drive
from tests.gateway.grpc5.test_wire import _message, _send


@pytest.mark.slow  # the official client in a subprocess, a few seconds of delay
def test_delay_is_delivered_at_its_time(rmq5_python, tmp_path):
    topic = "T_exact"
    with GrpcCluster(tmp_path) as cluster:
        cluster.create_topic(topic)
        drive(rmq5_python, endpoint=cluster.endpoint, op="produce", topic=topic,
              bodies=["later"], delay_s=3)
        store = cluster.server.broker.store
        queues = cluster.server.broker.topic_config_manager.get(topic).write_queue_nums
        deadline = time.monotonic() + 20
        found = None
        while found is None:
            assert time.monotonic() < deadline, "the delayed message never arrived"
            for q in range(queues):
                units = store.units(topic, q, 0, 1)
                if units:
                    found = store.look_message(units[0][0])
            time.sleep(0.05)
        target = int(found.properties["TIMER_DELIVER_MS"])
        late = found.store_timestamp - target
        assert 0 <= late <= 1500, late  # rounded up to 5 s it was 2-3 s late


def test_delivery_time_limit_follows_the_broker(tmp_path):
    """timer_max_delay_s: the front end refuses what its broker would pull in."""
    with GrpcCluster(tmp_path, timer_max_delay_s=60) as cluster:
        cluster.create_topic("W")
        with grpc.insecure_channel(cluster.endpoint) as channel:
            stub = pbg.MessagingServiceStub(channel)
            now = int(time.time() * 1000)
            far = _send(stub, _message(message_type=pb.DELAY, delivery_timestamp=now + 120_000))
            assert far.status.code == pb.ILLEGAL_DELIVERY_TIME
            near = _send(stub, _message(message_type=pb.DELAY, delivery_timestamp=now + 30_000))
            assert near.status.code == pb.OK
            assert near.entries[0].recall_handle  # scheduled, so recallable
