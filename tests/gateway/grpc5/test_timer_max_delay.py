"""`timer_max_delay_s`: a delivery time further ahead than the broker's limit is refused
with the protocol's error (4.x: MESSAGE_ILLEGAL, as Apache's broker; 5.x:
ILLEGAL_DELIVERY_TIME), not pulled in and delivered early; `lmq proxy
--timer-max-delay-s` sets the front end's own limit (docs/grpc.md "Delivery times")."""

from __future__ import annotations

import time

import grpc
import pytest

from core.client import Producer
from core.client.errors import MQBrokerError
from core.common.message import Message
from core.remoting.codes import ResponseCode
from gateway.grpc5.proto import messaging_pb2 as pb
from gateway.grpc5.proto import messaging_pb2_grpc as pbg
from lmq.cli import build_parser
from tests.core.broker.harness import free_port
from tests.gateway.grpc5.harness import GrpcCluster, wait_port
from tests.gateway.grpc5.test_processes import _lmq, _stop
from tests.gateway.grpc5.test_wire import _message, _send

pytestmark = pytest.mark.timeout(120)

BROKER_LIMIT_S = 120


def _now_ms() -> int:
    return int(time.time() * 1000)


def test_a_4x_send_beyond_the_brokers_limit_is_refused(tmp_path):
    with GrpcCluster(tmp_path, timer_max_delay_s=BROKER_LIMIT_S) as cluster:
        cluster.create_topic("T_far")

        async def send(client, ahead_s: int):
            msg = Message("T_far", b"later")
            # The form a 5.x front end sends over 4.x: a level and the exact time.
            msg.properties["DELAY"] = "3"
            msg.properties["TIMER_DELIVER_MS"] = str(_now_ms() + ahead_s * 1000)
            try:
                async with Producer(client, "PG_far") as p:
                    return (await p.send(msg)).status.name
            except MQBrokerError as exc:
                return exc.code

        async def both(client):
            return [await send(client, BROKER_LIMIT_S // 2),
                    await send(client, BROKER_LIMIT_S * 2)]

        near, far = cluster.with_client(both)
        assert near == "SEND_OK"
        assert far == ResponseCode.MESSAGE_ILLEGAL
        # Nothing of the refused one was stored: one scheduled message only.
        store = cluster.server.broker.store
        assert sum(len(store.units("SCHEDULE_TOPIC_XXXX", q, 0, 10)) for q in range(18)) == 1


def test_proxy_timer_max_delay_flag(tmp_path):
    parser = build_parser()
    assert parser.parse_args(["proxy"]).timer_max_delay_s == 3 * 86_400
    assert parser.parse_args(["proxy", "--timer-max-delay-s", "600"]).timer_max_delay_s == 600
    with pytest.raises(SystemExit):
        parser.parse_args(["proxy", "--timer-max-delay-s", "0"])
    with GrpcCluster(tmp_path, timer_max_delay_s=BROKER_LIMIT_S) as cluster:
        cluster.create_topic("W")
        port = free_port()
        proxy = _lmq("proxy", "--namesrv-addr", cluster.namesrv_addr, "--grpc-port",
                     str(port), "--timer-max-delay-s", str(BROKER_LIMIT_S * 5))
        try:
            wait_port(port, proc=proxy)
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pbg.MessagingServiceStub(channel)

                def send(ahead_s: int) -> pb.Status:
                    return _send(stub, _message(message_type=pb.DELAY,
                                                delivery_timestamp=_now_ms() + ahead_s * 1000)
                                 ).status

                assert send(BROKER_LIMIT_S // 2).code == pb.OK
                # Within the proxy's limit, beyond the broker's: the broker refuses it
                # (before: pulled in to the broker's limit, and delivered early).
                refused = send(BROKER_LIMIT_S * 2)
                assert refused.code == pb.ILLEGAL_DELIVERY_TIME
                assert "broker refused" in refused.message
                # Beyond the proxy's own limit (the flag): refused by the proxy.
                refused = send(BROKER_LIMIT_S * 10)
                assert refused.code == pb.ILLEGAL_DELIVERY_TIME
                assert "broker" not in refused.message
        finally:
            _stop(proxy)
