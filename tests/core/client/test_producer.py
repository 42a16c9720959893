"""Producer against a real broker: send modes, batches, compression, limits, ordering,
topic auto-creation, delay levels."""

from __future__ import annotations

import pytest
import trio
from trio.testing import trio_test

from core.client import (
    ClientInstance,
    ClientStateError,
    Message,
    MQClientError,
    Producer,
    PullConsumer,
    PullStatus,
    SendStatus,
)
from core.common.sysflag import MessageSysFlag
from core.remoting.codes import ResponseCode
from tests.core.client.cluster import cluster, wait_for


async def pull_all(client: ClientInstance, topic: str, group: str = "CHECK") -> list:
    pc = PullConsumer(client, group)
    out = []
    for mq in await pc.fetch_subscribe_message_queues(topic):
        offset = 0
        while True:
            r = await pc.pull(mq, "*", offset, 32)
            if r.status is not PullStatus.FOUND:
                break
            out.extend(r.messages)
            offset = r.next_begin_offset
    return out


@trio_test
async def test_sync_async_callback_oneway_sends_round_trip():
    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        async with Producer(client, "PG_MODES") as p:
            m = Message("ModesT", b"sync", properties={"color": "red"})
            m.tags = "TagA"
            m.keys = ["k1", "k2"]
            r = await p.send(m)
            assert r.status is SendStatus.SEND_OK
            assert r.msg_id == m.uniq_key and r.offset_msg_id and r.queue_offset == 0

            fut = p.send_async(Message("ModesT", b"async"))
            r2 = await fut.result()
            assert r2.status is SendStatus.SEND_OK and fut.done

            got = []
            done = trio.Event()

            def cb(result, error):
                got.append((result, error))
                done.set()

            p.send_async(Message("ModesT", b"callback"), cb)
            await done.wait()
            assert got[0][1] is None and got[0][0].status is SendStatus.SEND_OK

            await p.send_oneway(Message("ModesT", b"oneway"))
            big = bytes(range(256)) * 64  # 16 KiB: compressed on the wire
            await p.send(Message("ModesT", big))

        async def all_there():
            return len(await pull_all(client, "ModesT")) == 5
        await wait_for(all_there)
        msgs = {m.body: m for m in await pull_all(client, "ModesT")}
        assert set(msgs) == {b"sync", b"async", b"callback", b"oneway", big}
        s = msgs[b"sync"]
        assert s.tags == "TagA" and s.keys == ["k1", "k2"] and s.properties["color"] == "red"
        assert s.msg_id == r.msg_id
        assert not msgs[big].sys_flag & MessageSysFlag.COMPRESSED  # inflated for the consumer
        assert len({m.msg_id for m in msgs.values()}) == 5


@trio_test
async def test_batch_is_stored_as_consecutive_messages():
    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        async with Producer(client, "PG_BATCH") as p:
            batch = [Message("BatchT", b"b%d" % i) for i in range(10)]
            for i, m in enumerate(batch):
                m.tags = "even" if i % 2 == 0 else "odd"
            r = await p.send_batch(batch)
            assert r.status is SendStatus.SEND_OK
            assert r.msg_id.split(",") == [m.uniq_key for m in batch]
            with pytest.raises(MQClientError):
                await p.send_batch([Message("BatchT", b"x"), Message("OtherT", b"y")])
            delayed = Message("BatchT", b"x")
            delayed.delay_level = 2
            with pytest.raises(MQClientError):
                await p.send_batch([delayed])
        msgs = [m for m in await pull_all(client, "BatchT")]
        assert [m.body for m in msgs] == [b"b%d" % i for i in range(10)]
        assert {m.queue_id for m in msgs} == {r.message_queue.queue_id}
        assert [m.queue_offset for m in msgs] == list(range(r.queue_offset, r.queue_offset + 10))
        assert [m.tags for m in msgs][:2] == ["even", "odd"]


@trio_test
async def test_limits_and_validation_give_clear_errors():
    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        p = Producer(client, "PG_LIMITS")
        with pytest.raises(ClientStateError):
            await p.send(Message("LimitT", b"x"))
        async with p:
            with pytest.raises(MQClientError) as err:
                await p.send(Message("LimitT", b"x" * (4 * 1024 * 1024 + 1)))
            assert err.value.code == ResponseCode.MESSAGE_ILLEGAL
            assert "max_message_size" in str(err.value)
            with pytest.raises(MQClientError, match="zero"):
                await p.send(Message("LimitT", b""))
            with pytest.raises(MQClientError, match="illegal characters"):
                await p.send(Message("bad topic", b"x"))
            with pytest.raises(MQClientError, match="forbidden"):
                await p.send(Message("SCHEDULE_TOPIC_XXXX", b"x"))
            # Exactly at the limit is fine (and compressed on the wire).
            r = await p.send(Message("LimitT", b"y" * (4 * 1024 * 1024)))
            assert r.status is SendStatus.SEND_OK


@trio_test
async def test_orderly_sends_keep_a_key_on_one_queue():
    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        async with Producer(client, "PG_ORDER") as p:
            queues = {}
            for i in range(30):
                key = f"order-{i % 3}"
                r = await p.send_orderly(Message("OrderT", f"{key}:{i}".encode()), key)
                queues.setdefault(key, set()).add(r.message_queue)
            assert all(len(q) == 1 for q in queues.values())
        msgs = await pull_all(client, "OrderT")
        per_key: dict[str, list[int]] = {}
        for m in sorted(msgs, key=lambda m: (m.queue_id, m.queue_offset)):
            key, _, i = m.body.decode().partition(":")
            per_key.setdefault(key, []).append(int(i))
        assert all(seq == sorted(seq) for seq in per_key.values())
        assert sum(map(len, per_key.values())) == 30


@trio_test
async def test_topic_is_auto_created_through_tbw102():
    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        assert await client.api.get_route("FreshTopic") is None
        async with Producer(client, "PG_AUTO") as p:
            r = await p.send(Message("FreshTopic", b"first"))
            assert r.status is SendStatus.SEND_OK
            assert r.message_queue.queue_id < p.default_topic_queue_nums

        async def routed():
            return await client.api.get_route("FreshTopic") is not None
        await wait_for(routed)
        route = await client.api.get_route("FreshTopic")
        assert route.queue_datas[0].write_queue_nums == 4


@trio_test
async def test_delay_level_message_arrives_later():
    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await client.api.create_topic(c.broker_addrs[0], "DelayT", 4, 4)
        async with Producer(client, "PG_DELAY") as p:
            m = Message("DelayT", b"later")
            m.delay_level = 1  # 1 s
            r = await p.send(m)
            assert r.status is SendStatus.SEND_OK
            # Right after the send it is not in the topic yet, but in the schedule topic.
            assert await pull_all(client, "DelayT") == []

        async def arrived():
            return [x.body for x in await pull_all(client, "DelayT")] == [b"later"]
        await wait_for(arrived, timeout=15)
