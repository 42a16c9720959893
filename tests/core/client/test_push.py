"""Push consumer against a real broker: round trip, filters, broadcasting, rebalance,
orderly consumption, retry and DLQ."""

from __future__ import annotations

import os
import time

import pytest
import trio
from trio.testing import trio_test, wait_all_tasks_blocked

from core.client import (
    ClientInstance,
    ConsumeStatus,
    Message,
    MessageQueue,
    Producer,
    PullConsumer,
    PushConsumer,
)
from core.common.names import dlq_topic, retry_topic
from tests.core.client.cluster import cluster, settle, wait_for


async def produce(client, topic: str, n: int, *, tag_of=lambda i: None, props_of=lambda i: None,
                  prefix: str = "m") -> list[bytes]:
    bodies = []
    async with Producer(client, "PG_" + topic) as p:
        for i in range(n):
            m = Message(topic, f"{prefix}{i}".encode())
            if tag_of(i):
                m.tags = tag_of(i)
            for k, v in (props_of(i) or {}).items():
                m.properties[k] = v
            await p.send(m)
            bodies.append(m.body)
    return bodies


async def group_offsets(client, group: str, topic: str) -> dict[MessageQueue, tuple[int, int]]:
    """queue -> (consumer offset at the broker, max offset)."""
    pc = PullConsumer(client, group)
    return {mq: (await pc.fetch_consume_offset(mq), await pc.max_offset(mq))
            for mq in await pc.fetch_subscribe_message_queues(topic)}


@trio_test
async def test_round_trip_commits_offsets_at_shutdown():
    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await client.api.create_topic(c.broker_addrs[0], "PushT", 4, 4)
        got: list[bytes] = []

        async def listener(msgs, ctx):
            got.extend(m.body for m in msgs)
            return ConsumeStatus.SUCCESS

        consumer = PushConsumer(client, "CG_PUSH", listener, consume_from_where="FIRST_OFFSET")
        consumer.subscribe("PushT", "*")
        async with consumer:
            sent = await produce(client, "PushT", 40)
            await wait_for(lambda: len(got) >= 40)
        assert sorted(got) == sorted(sent)
        offsets = await group_offsets(client, "CG_PUSH", "PushT")
        assert all(committed == maximum for committed, maximum in offsets.values())


@trio_test
async def test_sync_listener_runs_in_a_thread_and_tag_filter_applies():
    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await client.api.create_topic(c.broker_addrs[0], "TagT", 4, 4)
        got = []

        def listener(msgs, ctx):  # plain function: called in a worker thread
            got.extend((m.tags, m.body) for m in msgs)

        consumer = PushConsumer(client, "CG_TAG", listener, consume_from_where="FIRST_OFFSET")
        consumer.subscribe("TagT", "A || B")
        async with consumer:
            await produce(client, "TagT", 30, tag_of=lambda i: "ABC"[i % 3])
            await wait_for(lambda: len(got) >= 20)
            await settle(consumer)  # whatever else the broker would deliver has arrived
        assert len(got) == 20 and {t for t, _ in got} == {"A", "B"}


@trio_test
async def test_sql92_subscription():
    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await client.api.create_topic(c.broker_addrs[0], "SqlT", 2, 2)
        got = []

        async def listener(msgs, ctx):
            got.extend(int(m.properties["n"]) for m in msgs)

        consumer = PushConsumer(client, "CG_SQL", listener, consume_from_where="FIRST_OFFSET")
        consumer.subscribe("SqlT", "n >= 7 AND color = 'red'", "SQL92")
        async with consumer:
            await produce(client, "SqlT", 12, props_of=lambda i: {"n": str(i),
                                                                 "color": "red" if i % 2 else "blue"})
            await wait_for(lambda: len(got) >= 3)
            await settle(consumer)
        assert sorted(got) == [7, 9, 11]


@trio_test
async def test_broadcasting_delivers_everything_to_every_member(tmp_path):
    async with cluster() as c:
        async with ClientInstance(namesrv_addr=c.namesrv_addr, offset_store_dir=str(tmp_path),
                                  instance_name="one") as c1, \
                ClientInstance(namesrv_addr=c.namesrv_addr, offset_store_dir=str(tmp_path),
                               instance_name="two") as c2:
            await c1.api.create_topic(c.broker_addrs[0], "BcastT", 4, 4)
            got = {"one": [], "two": []}
            consumers = []
            for name, cl in (("one", c1), ("two", c2)):
                async def listener(msgs, ctx, name=name):
                    got[name].extend(m.body for m in msgs)
                pc = PushConsumer(cl, "CG_BCAST", listener, message_model="BROADCASTING",
                                  consume_from_where="FIRST_OFFSET")
                pc.subscribe("BcastT")
                await pc.start()
                consumers.append(pc)
            sent = await produce(c1, "BcastT", 20)
            await wait_for(lambda: len(got["one"]) >= 20 and len(got["two"]) >= 20)
            for pc in consumers:
                await pc.shutdown()
        assert sorted(got["one"]) == sorted(sent) == sorted(got["two"])
        for name in ("one", "two"):
            assert os.path.exists(tmp_path / name / "CG_BCAST" / "offsets.json")


@pytest.mark.slow
@trio_test
async def test_rebalance_when_a_consumer_joins_and_leaves_loses_nothing():
    async with cluster() as c:
        async with ClientInstance(namesrv_addr=c.namesrv_addr) as producer_client, \
                ClientInstance(namesrv_addr=c.namesrv_addr) as c1, \
                ClientInstance(namesrv_addr=c.namesrv_addr) as c2:
            await producer_client.api.create_topic(c.broker_addrs[0], "RebalT", 8, 8)
            received: dict[str, list[bytes]] = {"c1": [], "c2": []}

            def make(name):
                async def listener(msgs, ctx):
                    received[name].extend(m.body for m in msgs)
                return listener

            first = PushConsumer(c1, "CG_REBAL", make("c1"), consume_from_where="FIRST_OFFSET")
            first.subscribe("RebalT")
            second = PushConsumer(c2, "CG_REBAL", make("c2"), consume_from_where="FIRST_OFFSET")
            second.subscribe("RebalT")
            sent: list[bytes] = []

            async with Producer(producer_client, "PG_REBAL") as p:
                async def send(n, start):
                    for i in range(start, start + n):
                        m = Message("RebalT", b"r%d" % i)
                        await p.send(m)
                        sent.append(m.body)
                        await trio.sleep(0.005)

                await first.start()
                await send(100, 0)
                await second.start()  # joins: NOTIFY_CONSUMER_IDS_CHANGED -> rebalance
                def owned(consumer):
                    return {mq for mq in consumer.pq_table if mq.topic == "RebalT"}
                await wait_for(lambda: len(owned(first)) == 4 and len(owned(second)) == 4)
                assert not owned(first) & owned(second)
                await send(100, 100)
                await first.shutdown()  # leaves: offsets persisted, queues move to second
                await wait_for(lambda: len(owned(second)) == 8)
                await send(100, 200)
                await wait_for(lambda: set(received["c1"]) | set(received["c2"]) >= set(sent),
                               timeout=30)
            await second.shutdown()
        assert received["c1"] and received["c2"]
        everything = received["c1"] + received["c2"]
        assert set(everything) == set(sent)
        # Duplicates only around the hand-overs: far fewer than the traffic.
        assert len(everything) - len(set(everything)) < 50


@trio_test
async def test_orderly_consumption_per_key():
    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await client.api.create_topic(c.broker_addrs[0], "OrderlyT", 4, 4)
        got: dict[str, list[int]] = {}
        in_flight: dict[MessageQueue, int] = {}
        overlap = []

        async def listener(msgs, ctx):
            in_flight[ctx.mq] = in_flight.get(ctx.mq, 0) + 1
            if in_flight[ctx.mq] > 1:
                overlap.append(ctx.mq)
            await trio.sleep(0.001)
            for m in msgs:
                key, _, i = m.body.decode().partition(":")
                got.setdefault(key, []).append(int(i))
            in_flight[ctx.mq] -= 1

        consumer = PushConsumer(client, "CG_ORDERLY", listener, orderly=True,
                                consume_from_where="FIRST_OFFSET", consume_concurrency=8)
        consumer.subscribe("OrderlyT")
        async with consumer, Producer(client, "PG_ORDERLY") as p:
            for i in range(120):
                key = f"k{i % 6}"
                await p.send_orderly(Message("OrderlyT", f"{key}:{i}".encode()), key)
            await wait_for(lambda: sum(map(len, got.values())) >= 120)
            assert all(pq.locked for pq in consumer.pq_table.values())
        assert not overlap
        for seq in got.values():
            assert seq == sorted(seq) and len(seq) == 20


@trio_test
async def test_orderly_failure_is_retried_in_place():
    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await client.api.create_topic(c.broker_addrs[0], "OrdRetryT", 1, 1)
        seen = []

        async def listener(msgs, ctx):
            body = msgs[0].body
            seen.append((body, msgs[0].reconsume_times))
            ctx.suspend_time = 0.05
            if body == b"m1" and msgs[0].reconsume_times < 2:
                return ConsumeStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
            return ConsumeStatus.SUCCESS

        consumer = PushConsumer(client, "CG_ORDRETRY", listener, orderly=True,
                                consume_from_where="FIRST_OFFSET")
        consumer.subscribe("OrdRetryT")
        async with consumer:
            await produce(client, "OrdRetryT", 3)
            await wait_for(lambda: len(seen) >= 5)
        assert seen == [(b"m0", 0), (b"m1", 0), (b"m1", 1), (b"m1", 2), (b"m2", 0)]


@pytest.mark.slow
@trio_test
async def test_failed_messages_are_retried_then_dead_lettered():
    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await client.api.create_topic(c.broker_addrs[0], "RetryT", 2, 2)
        deliveries: dict[bytes, list[tuple[int, str]]] = {}

        async def listener(msgs, ctx):
            m = msgs[0]
            deliveries.setdefault(m.body, []).append((m.reconsume_times, m.topic))
            ctx.delay_level = 1  # retry after 1 s instead of 10 s
            if m.body == b"ok-after-one" and m.reconsume_times >= 1:
                return ConsumeStatus.SUCCESS
            raise RuntimeError("cannot handle it")

        consumer = PushConsumer(client, "CG_RETRY", listener, consume_from_where="FIRST_OFFSET",
                                max_reconsume_times=2)
        consumer.subscribe("RetryT")
        async with consumer:
            async with Producer(client, "PG_RETRY") as p:
                await p.send(Message("RetryT", b"poison"))
                await p.send(Message("RetryT", b"ok-after-one"))
            await wait_for(lambda: len(deliveries.get(b"poison", [])) >= 3
                           and len(deliveries.get(b"ok-after-one", [])) >= 2, timeout=40)

            dlq = MessageQueue(dlq_topic("CG_RETRY"), "broker-a", 0)

            async def dead_lettered():
                return await client.api.get_max_offset(c.broker_addrs[0], dlq.topic, 0) >= 1
            await wait_for(dead_lettered, timeout=20)
        assert deliveries[b"poison"][:3] == [(0, "RetryT"), (1, "RetryT"), (2, "RetryT")]
        assert deliveries[b"ok-after-one"][:2] == [(0, "RetryT"), (1, "RetryT")]
        assert retry_topic("CG_RETRY") in consumer.subs
        pc = PullConsumer(client, "CG_DLQ_READER")
        r = await pc.pull(dlq, "*", 0)
        assert [m.body for m in r.messages] == [b"poison"]


# The client sends RocketMQ 5's setZeroIfNotFound=false, so the broker answers 22 for a
# new group and the client's consumeFromWhere decides where it starts.
@pytest.mark.parametrize("where", ["LAST_OFFSET", "TIMESTAMP"])
@trio_test
async def test_new_group_starts_where_consume_from_where_says(where):
    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await client.api.create_topic(c.broker_addrs[0], "WhereT", 2, 2)
        await produce(client, "WhereT", 6, prefix="old")
        await trio.sleep(0.05)
        since = time.time_ns() // 1_000_000
        got = []

        async def listener(msgs, ctx):
            got.extend(m.body for m in msgs)

        consumer = PushConsumer(client, "CG_WHERE_" + where, listener,
                                consume_from_where=where, consume_timestamp_ms=since)
        consumer.subscribe("WhereT")
        async with consumer:
            await wait_for(lambda: len([mq for mq in consumer.pq_table if mq.topic == "WhereT"]) == 2)
            await produce(client, "WhereT", 4, prefix="new")
            await wait_for(lambda: len(got) >= 4)
            await settle(consumer)
        assert sorted(got) == [b"new0", b"new1", b"new2", b"new3"]


@trio_test
async def test_broker_requests_running_info_and_offset_reset():
    """GET_CONSUMER_RUNNING_INFO and RESET_CONSUMER_CLIENT_OFFSET as a broker sends them."""
    import json

    from core.remoting.codec import RemotingCommand
    from core.remoting.codes import RequestCode

    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await client.api.create_topic(c.broker_addrs[0], "ResetT", 1, 1)
        got = []

        async def listener(msgs, ctx):
            got.extend(m.body for m in msgs)

        consumer = PushConsumer(client, "CG_RESET", listener, consume_from_where="FIRST_OFFSET")
        consumer.subscribe("ResetT")
        async with consumer:
            await produce(client, "ResetT", 5)
            await wait_for(lambda: len(got) >= 5)

            cmd = RemotingCommand.request(RequestCode.GET_CONSUMER_RUNNING_INFO,
                                          {"consumerGroup": "CG_RESET", "clientId": client.client_id})
            resp = await client.processors.process(None, cmd)
            info = json.loads(resp.body)
            assert info["properties"]["clientId"] == client.client_id
            assert {q["topic"] for q in info["mqTable"]} == {"ResetT", retry_topic("CG_RESET")}

            body = json.dumps({"offsetTable": [
                {"topic": "ResetT", "brokerName": "broker-a", "queueId": 0, "offset": 2}]}).encode()
            cmd = RemotingCommand.request(RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
                                          {"topic": "ResetT", "group": "CG_RESET",
                                           "timestamp": "0", "isForce": "true"}, body)
            await client.processors.process(None, cmd)
            await wait_for(lambda: len(got) >= 8)
        assert sorted(got[5:]) == [b"m2", b"m3", b"m4"]


@trio_test
async def test_flow_control_caps_what_a_queue_caches():
    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await client.api.create_topic(c.broker_addrs[0], "FlowT", 1, 1)
        await produce(client, "FlowT", 100)
        release = trio.Event()
        got = []

        async def listener(msgs, ctx):
            await release.wait()
            got.extend(m.body for m in msgs)

        consumer = PushConsumer(client, "CG_FLOW", listener, consume_from_where="FIRST_OFFSET",
                                pull_batch_size=8, pull_threshold_for_queue=10, consume_concurrency=4)
        consumer.subscribe("FlowT")
        async with consumer:
            mq = MessageQueue("FlowT", "broker-a", 0)
            await wait_for(lambda: mq in consumer.pq_table and consumer.pq_table[mq].msg_count > 10)
            # Every task blocked (the listeners on `release`, the pull loop pausing): any pull
            # flow control let through has been answered and cached by now.
            await wait_all_tasks_blocked()
            assert consumer.pq_table[mq].msg_count <= 10 + 8
            release.set()
            await wait_for(lambda: len(got) >= 100)
        assert len(set(got)) == 100


@trio_test
async def test_admin_reset_moves_a_live_group_back():
    """INVOKE_BROKER_TO_RESET_OFFSET: the broker commits the new offsets and pushes them to
    the running member, which consumes the topic again instead of overwriting the reset."""
    from core.client import AdminClient

    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await client.api.create_topic(c.broker_addrs[0], "LiveResetT", 2, 2)
        got: list[bytes] = []

        async def listener(msgs, ctx):
            got.extend(m.body for m in msgs)

        consumer = PushConsumer(client, "CG_LIVE_RESET", listener, consume_from_where="FIRST_OFFSET")
        consumer.subscribe("LiveResetT")
        async with consumer:
            sent = await produce(client, "LiveResetT", 6)
            await wait_for(lambda: len(got) >= 6)
            rows = await AdminClient(client).reset_offset_by_time("CG_LIVE_RESET", "LiveResetT", 0)
            assert sorted((r["queueId"], r["newOffset"]) for r in rows) == [(0, 0), (1, 0)]
            await wait_for(lambda: len(got) >= 12, timeout=15)
        assert sorted(got) == sorted(sent * 2)
