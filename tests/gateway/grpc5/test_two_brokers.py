"""`run_proxy` (what `lmq proxy` runs) in front of a cluster of two brokers: sends spread
over both, a SimpleConsumer reads them all back through the one proxy."""

from __future__ import annotations

import functools
import threading

import trio

from core.client import ClientInstance
from core.client.pop_consumer import INIT_MODE_MAX, PopClient
from gateway.grpc5.config import GrpcConfig
from gateway.grpc5.standalone import run_proxy
from tests.core.broker.harness import free_port
from tests.core.client.cluster import cluster
from tests.gateway.grpc5.harness import drive, wait_port


def test_proxy_spreads_over_two_brokers(rmq5_python):
    port = free_port()
    ready, done = threading.Event(), threading.Event()
    box: dict = {}

    async def main() -> None:
        async with cluster(2) as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
            for addr in c.broker_addrs:
                await client.api.create_topic(addr, "TT", 2, 2)
            with trio.fail_after(30):  # both brokers registered the topic
                while True:
                    route = await client.api.get_route("TT")
                    if route is not None and len(route.queue_datas) == 2:
                        break
                    await trio.sleep(0.1)
            for name, addr in zip(("broker-a", "broker-b"), c.broker_addrs, strict=True):
                # The group's read position on both brokers (a new group starts at the end).
                await PopClient(client.remoting, addr, name, "GTT").pop(
                    "TT", init_mode=INIT_MODE_MAX)
            async with trio.open_nursery() as nursery:
                await nursery.start(functools.partial(run_proxy, c.namesrv_addr,
                                                      GrpcConfig(port=port)))
                ready.set()
                await trio.to_thread.run_sync(done.wait)
                box["sizes"] = [sum([await client.api.get_max_offset(a, "TT", q)
                                     for q in range(2)]) for a in c.broker_addrs]
                nursery.cancel_scope.cancel()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    try:
        assert ready.wait(60), "the cluster did not start"
        wait_port(port)
        endpoint = f"127.0.0.1:{port}"
        sent = drive(rmq5_python, endpoint=endpoint, op="produce", topic="TT",
                     bodies=[f"t{i}" for i in range(8)])
        got = drive(rmq5_python, endpoint=endpoint, op="simple", topic="TT", group="GTT",
                    want=8, await_s=1, deadline_s=30)
    finally:
        done.set()
        thread.join(60)
    assert sorted(m["id"] for m in got["messages"]) == sorted(sent["ids"])
    assert box["sizes"] == [4, 4]  # round robin over the four queues of two brokers


def test_receive_naming_no_broker_long_polls_every_broker():
    """A ReceiveMessage that names no broker waits on each broker in turn: a message
    sent to the first broker while it waits is received (it used to hold the poll on
    the last broker only and answer MESSAGE_NOT_FOUND)."""
    import grpc

    from gateway.grpc5.proto import messaging_pb2 as pb
    from gateway.grpc5.proto import messaging_pb2_grpc as pbg
    from tests.core.broker.harness import send_request

    port = free_port()
    box: dict = {}

    async def receive() -> None:
        req = pb.ReceiveMessageRequest(batch_size=4, auto_renew=False)
        req.group.name = "GNB"
        req.message_queue.topic.name = "TNB"
        req.message_queue.id = -1
        req.invisible_duration.FromSeconds(30)
        req.long_polling_timeout.FromSeconds(10)

        def call() -> list:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                return list(pbg.MessagingServiceStub(ch).ReceiveMessage(
                    req, metadata=(("x-mq-client-id", "nb"),), timeout=20))

        box["replies"] = await trio.to_thread.run_sync(call)

    async def main() -> None:
        async with cluster(2) as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
            for addr in c.broker_addrs:
                await client.api.create_topic(addr, "TNB", 1, 1)
            with trio.fail_after(30):
                while True:
                    route = await client.api.get_route("TNB")
                    if route is not None and len(route.queue_datas) == 2:
                        break
                    await trio.sleep(0.1)
            async with trio.open_nursery() as nursery:
                await nursery.start(functools.partial(run_proxy, c.namesrv_addr,
                                                      GrpcConfig(port=port)))
                async with trio.open_nursery() as inner:
                    inner.start_soon(receive)
                    # Until the receive is held at a broker (after its quick pass).
                    with trio.fail_after(20):
                        while not any(b.pop_service.polling for b in c.brokers):
                            await trio.sleep(0.05)
                    first = min(c.servers, key=lambda s: s.broker.config.broker_name)
                    resp = await client.remoting.invoke(first.broker.broker_addr,
                                                        send_request("TNB", b"on-a"))
                    assert resp.code == 0, resp.remark
                nursery.cancel_scope.cancel()

    trio.run(main)
    replies = box["replies"]
    assert replies[0].status.code == pb.OK
    assert [r.message.body for r in replies if r.HasField("message")] == [b"on-a"]
