"""LMQ consumer: one `%LMQ%` queue read on every broker of the cluster, offsets per broker."""

from __future__ import annotations

from trio.testing import trio_test

from core.client import AdminClient, ClientInstance, LmqConsumer, Message, Producer
from core.common.properties import MessageConst
from tests.core.client.cluster import cluster, settle, wait_for


async def create_parent_topic(client) -> None:
    """The parent topic on both brokers, and wait until the name server routes to both."""
    await AdminClient(client).topic_create("LmqParentT", read_queue_nums=2, write_queue_nums=2)

    async def on_both():
        route = await client.api.get_route("LmqParentT")
        return route is not None and len(route.queue_datas) == 2
    await wait_for(on_both)


async def send_dispatched(client, n: int, start: int = 0) -> dict[str, int]:
    """Send to the parent topic (spread over both brokers) with two LMQs each; returns
    how many went to each broker."""
    per_broker: dict[str, int] = {}
    async with Producer(client, "PG_LMQ") as p:
        for i in range(start, start + n):
            m = Message("LmqParentT", b"d%d" % i)
            m.properties[MessageConst.INNER_MULTI_DISPATCH] = "%LMQ%dev1,%LMQ%dev2"
            r = await p.send(m)
            name = r.message_queue.broker_name
            per_broker[name] = per_broker.get(name, 0) + 1
    return per_broker


@trio_test
async def test_lmq_listener_reads_every_broker_and_keeps_offsets_per_broker():
    # Without ACL only in-process peers may multi-dispatch unless the broker allows it.
    async with cluster(2, allow_inner_properties_without_acl=True) as c, \
            ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await create_parent_topic(client)
        got: list[tuple[str, bytes, int]] = []

        def listener(msgs, ctx):
            for m in msgs:
                got.append((ctx.mq.broker_name, m.body, m.lmq_offsets()["%LMQ%dev1"]))

        consumer = LmqConsumer(client, "CG_LMQ", "%LMQ%dev1", listener,
                               consume_from_where="FIRST_OFFSET")
        async with consumer:
            assert {mq.broker_name for mq in consumer.queues()} == {"broker-a", "broker-b"}
            per_broker = await send_dispatched(client, 20)
            assert set(per_broker) == {"broker-a", "broker-b"}
            await wait_for(lambda: len(got) >= 20)
        assert sorted(b for _, b, _ in got) == sorted(b"d%d" % i for i in range(20))
        for broker, count in per_broker.items():
            offsets = [o for b, _, o in got if b == broker]
            assert offsets == list(range(count))  # in order within each broker
            assert all(m[1].startswith(b"d") for m in got)
        # The offsets were stored per broker at shutdown.
        for broker, addr in zip(["broker-a", "broker-b"], c.broker_addrs, strict=True):
            stored = await client.api.query_consumer_offset(addr, "CG_LMQ", "%LMQ%dev1", 0)
            assert stored == per_broker[broker]

        # A restart of the group continues after what was consumed.
        more = []
        consumer = LmqConsumer(client, "CG_LMQ", "%LMQ%dev1",
                               lambda msgs, ctx: more.extend(m.body for m in msgs))
        async with consumer:
            await send_dispatched(client, 6, start=100)
            await wait_for(lambda: len(more) >= 6)
            await settle(consumer)  # anything consumed twice would have arrived by now
        assert sorted(more) == sorted(b"d%d" % i for i in range(100, 106))


@trio_test
async def test_lmq_poll_mode():
    # Without ACL only in-process peers may multi-dispatch unless the broker allows it.
    async with cluster(2, allow_inner_properties_without_acl=True) as c, \
            ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await create_parent_topic(client)
        await send_dispatched(client, 10)
        consumer = LmqConsumer(client, "CG_LMQ_POLL", "%LMQ%dev2", consume_from_where="FIRST_OFFSET")
        got = []
        async with consumer:
            while len(got) < 10:
                batch = await consumer.poll(timeout=10)
                assert batch, "poll timed out"
                got.extend(m.body for m in batch)
            await consumer.commit()
        assert sorted(got) == sorted(b"d%d" % i for i in range(10))
        total = 0
        for addr in c.broker_addrs:
            total += await client.api.query_consumer_offset(addr, "CG_LMQ_POLL", "%LMQ%dev2", 0)
        assert total == 10
