"""Pull consumer (explicit queues and offsets) and the poll-style LitePullConsumer."""

from __future__ import annotations

import trio
from trio.testing import trio_test, wait_all_tasks_blocked

from core.client import (
    ClientInstance,
    LitePullConsumer,
    Message,
    MessageQueue,
    Producer,
    PullConsumer,
    PullStatus,
)
from tests.core.client.cluster import cluster


async def send_tagged(client, topic: str, items: list[tuple[str, bytes]], queue: int | None = 0):
    async with Producer(client, "PG_" + topic) as p:
        for tag, body in items:
            m = Message(topic, body)
            m.tags = tag
            if queue is None:
                await p.send(m)
            else:
                await p.send_to_queue(m, MessageQueue(topic, "broker-a", queue))


@trio_test
async def test_pull_statuses_and_exact_tag_check():
    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await client.api.create_topic(c.broker_addrs[0], "PullT", 2, 2)
        pc = PullConsumer(client, "CG_PULL")
        mq = MessageQueue("PullT", "broker-a", 0)
        r = await pc.pull(mq, "*", 0)
        assert r.status is PullStatus.NO_NEW_MSG
        r = await pc.pull(mq, "*", 5)
        assert r.status is PullStatus.OFFSET_ILLEGAL and r.next_begin_offset == 0

        await send_tagged(client, "PullT", [("A", b"a0"), ("B", b"b0"), ("A", b"a1")])
        r = await pc.pull(mq, "*", 0, 2)
        assert r.status is PullStatus.FOUND and [m.body for m in r.messages] == [b"a0", b"b0"]
        assert r.next_begin_offset == 2 and r.max_offset == 3
        assert r.messages[0].properties["MAX_OFFSET"] == "3"
        r = await pc.pull(mq, "A", 0)
        assert [m.body for m in r.messages] == [b"a0", b"a1"]
        assert r.next_begin_offset == 3
        r = await pc.pull(mq, "C", 0)
        assert r.status is PullStatus.NO_MATCHED_MSG
        r = await pc.pull(mq, "A || B", 1)
        assert [m.body for m in r.messages] == [b"b0", b"a1"]
        r = await pc.pull(mq, "*", 3)
        assert r.status is PullStatus.NO_NEW_MSG
        r = await pc.pull(mq, "*", 9)
        assert r.status is PullStatus.OFFSET_ILLEGAL and r.next_begin_offset == 3
        assert await pc.max_offset(mq) == 3 and await pc.min_offset(mq) == 0
        first = (await pc.pull(mq, "*", 0, 1)).messages[0]
        assert await pc.search_offset(mq, first.store_timestamp) == 0

        assert await pc.fetch_consume_offset(mq) in (-1, 0)
        await pc.update_consume_offset(mq, 2)
        assert await pc.fetch_consume_offset(mq) == 2


@trio_test
async def test_pull_block_if_not_found_waits_for_a_message():
    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await client.api.create_topic(c.broker_addrs[0], "BlockT", 1, 1)
        pc = PullConsumer(client, "CG_BLOCK")
        mq = MessageQueue("BlockT", "broker-a", 0)
        result = []

        async def pull():
            result.append(await pc.pull_block_if_not_found(mq, "*", 0, suspend=10))

        async with trio.open_nursery() as n:
            n.start_soon(pull)
            # Broker and client share this trio run: once all tasks are blocked, an answer
            # the broker would give at once has arrived.
            await wait_all_tasks_blocked()
            assert result == [] and c.brokers[0].pull_hold_service.held == 1
            await send_tagged(client, "BlockT", [("", b"hello")])
        [r] = result
        assert r.status is PullStatus.FOUND and r.messages[0].body == b"hello"


@trio_test
async def test_lite_pull_subscribe_poll_and_commit():
    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await client.api.create_topic(c.broker_addrs[0], "LiteT", 4, 4)
        await send_tagged(client, "LiteT", [("A", b"m%d" % i) for i in range(20)], queue=None)
        consumer = LitePullConsumer(client, "CG_LITE", consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                                    auto_commit=False)
        consumer.subscribe("LiteT", "A")
        got = []
        async with consumer:
            while len(got) < 20:
                batch = await consumer.poll(timeout=10)
                assert batch, "poll timed out"
                got.extend(batch)
            await consumer.commit()
            assert len(consumer.assignment()) == 4
            committed = {mq: await consumer.committed(mq) for mq in consumer.assignment()}
        assert sorted(m.body for m in got) == sorted(b"m%d" % i for i in range(20))
        pc = PullConsumer(client, "X")
        for mq, off in committed.items():
            assert off == await pc.max_offset(mq)


@trio_test
async def test_lite_pull_assign_and_seek():
    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await client.api.create_topic(c.broker_addrs[0], "AssignT", 2, 2)
        await send_tagged(client, "AssignT", [("", b"q0-%d" % i) for i in range(5)], queue=0)
        await send_tagged(client, "AssignT", [("", b"q1-%d" % i) for i in range(5)], queue=1)
        mq0 = MessageQueue("AssignT", "broker-a", 0)
        consumer = LitePullConsumer(client, "CG_ASSIGN", consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        consumer.assign([mq0])
        async with consumer:
            got = []
            while len(got) < 5:
                got.extend(await consumer.poll(timeout=10))
            assert [m.body for m in got] == [b"q0-%d" % i for i in range(5)]
            await consumer.seek(mq0, 3)
            again = []
            while len(again) < 2:
                again.extend(await consumer.poll(timeout=10))
            assert [m.body for m in again] == [b"q0-3", b"q0-4"]
