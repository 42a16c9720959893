"""RocketMQ 5 POP in the broker: pop / ack / batch ack / change invisible time / nack,
redelivery after the deadline, long polling, disjoint concurrent consumers, LMQs.
A real broker on a free port (run_embedded) and the native PopClient."""

from __future__ import annotations

import trio

from core.client.pop_consumer import INIT_MODE_MAX, PopClient, PopStatus
from core.remoting.client import RemotingClient
from core.remoting.codec import RemotingCommand
from tests.core.broker.harness import run_embedded, send_request


async def send_n(client, addr, topic, n, queue_id=0, props=None, prefix="m"):
    for i in range(n):
        resp = await client.invoke(addr, send_request(
            topic, f"{prefix}{i}".encode(), queue_id=queue_id, properties=dict(props or {})))
        assert resp.code == 0, resp.remark


def popper(server, client, group="GID_POP"):
    b = server.broker
    return PopClient(client, b.broker_addr, b.config.broker_name, group)


def committed(server, group, topic, queue_id=0):
    return server.broker.offset_manager.query(group, topic, queue_id)


def test_pop_ack_fifo_and_consumed_offset(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        await send_n(client, addr, "PopT", 5)
        pc = popper(server, client)
        r = await pc.pop("PopT", max_nums=3, invisible_ms=60_000)
        assert r.status == PopStatus.FOUND
        assert [m.body for m in r.messages] == [b"m0", b"m1", b"m2"]
        assert all(m.delivery_count == 1 and not m.redelivered for m in r.messages)
        h = r.messages[0].handle.split(" ")
        assert len(h) == 8 and h[1] == str(r.pop_time) and h[2] == "60000"
        assert h[5] == server.broker.config.broker_name and h[6] == "0" and h[7] == "0"
        r2 = await pc.pop("PopT", max_nums=32, invisible_ms=60_000)
        assert [m.body for m in r2.messages] == [b"m3", b"m4"]
        # Nothing visible: in-flight messages are not handed out again.
        assert (await pc.pop("PopT", invisible_ms=60_000)).status == PopStatus.NO_NEW_MSG
        # Acks out of order: the consumed offset moves past the contiguous acked range.
        m0, m1, m2 = r.messages
        assert await pc.ack(m1) and await pc.ack(m2)
        assert committed(server, "GID_POP", "PopT") == 0
        assert await pc.ack(m0)
        assert committed(server, "GID_POP", "PopT") == 3
        assert not await pc.ack(m0)  # twice: no longer in flight
        for m in r2.messages:
            assert await pc.ack(m)
        assert committed(server, "GID_POP", "PopT") == 5
        assert (await pc.pop("PopT", invisible_ms=1)).status == PopStatus.NO_NEW_MSG

    run_embedded(body, tmp_path)


def test_all_queues_and_given_queue(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        for q in range(4):
            await send_n(client, addr, "PopQ", 2, queue_id=q, prefix=f"q{q}-")
        pc = popper(server, client)
        one = await pc.pop("PopQ", queue_id=2, invisible_ms=60_000)
        assert [m.body for m in one.messages] == [b"q2-0", b"q2-1"]
        assert {m.queue_id for m in one.messages} == {2}
        rest = await pc.pop("PopQ", invisible_ms=60_000)
        assert sorted(m.body for m in rest.messages) == sorted(
            f"q{q}-{i}".encode() for q in (0, 1, 3) for i in range(2))
        # A batch ack of everything (entries per queue and pop).
        await pc.batch_ack(one.messages + rest.messages)
        for q in range(4):
            assert committed(server, "GID_POP", "PopQ", q) == 2

    run_embedded(body, tmp_path)


def test_redelivery_after_deadline_with_long_poll(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        await send_n(client, addr, "PopR", 2)
        pc = popper(server, client)
        first = await pc.pop("PopR", invisible_ms=300)
        assert [m.body for m in first.messages] == [b"m0", b"m1"]
        assert await pc.ack(first.messages[1])
        # The long poll is woken by the deadline, not by a new message.
        again = await pc.pop("PopR", invisible_ms=60_000, poll_ms=10_000)
        assert [m.body for m in again.messages] == [b"m0"]
        m = again.messages[0]
        assert m.redelivered and m.delivery_count == 2
        assert m.message.properties["POP_CK"] == m.handle  # set by the broker
        assert m.handle != first.messages[0].handle
        assert not await pc.ack(first.messages[0])  # the stale handle acks nothing
        assert await pc.ack(m)
        assert committed(server, "GID_POP", "PopR") == 2

    run_embedded(body, tmp_path)


def test_nack_and_change_invisible_time(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        await send_n(client, addr, "PopN", 2)
        pc = popper(server, client)
        r = await pc.pop("PopN", invisible_ms=60_000)
        a, b = r.messages
        old_b = b.handle
        # Negative ack: visible again at once, delivery count + 1.
        assert await pc.nack(a)
        again = await pc.pop("PopN", invisible_ms=60_000)
        assert [m.body for m in again.messages] == [b"m0"]
        assert again.messages[0].delivery_count == 2
        assert not await pc.ack(a)  # the nacked handle is spent
        # Change invisible time: a new handle; the old one no longer works.
        assert await pc.change_invisible(b, 120_000)
        assert b.handle != old_b and b.handle.split(" ")[2] == "120000"
        assert (await pc.pop("PopN", invisible_ms=60_000)).status == PopStatus.NO_NEW_MSG
        stale = RemotingCommand.request(200051, {
            "consumerGroup": "GID_POP", "topic": "PopN", "queueId": "0",
            "extraInfo": old_b, "offset": "1"})
        assert (await client.invoke(addr, stale)).code == 208
        assert await pc.ack(b)
        assert await pc.ack(again.messages[0])
        assert committed(server, "GID_POP", "PopN") == 2

    run_embedded(body, tmp_path)


def test_long_poll_woken_by_send(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        await send_n(client, addr, "PopL", 1)
        pc = popper(server, client)
        assert await pc.ack((await pc.pop("PopL")).messages[0])
        got = []

        async def consumer(task_status=trio.TASK_STATUS_IGNORED):
            task_status.started()
            got.append(await pc.pop("PopL", poll_ms=15_000))

        async with trio.open_nursery() as nursery:
            await nursery.start(consumer)
            while server.broker.pop_service.polling == 0:
                await trio.sleep(0.01)
            await send_n(client, addr, "PopL", 1, prefix="late")
        assert [m.body for m in got[0].messages] == [b"late0"]

    run_embedded(body, tmp_path)


def test_concurrent_consumers_get_disjoint_messages(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        total = 60
        seen: list[bytes] = []

        async def consumer():
            pc = popper(server, client)
            while len(seen) < total:
                r = await pc.pop("PopC", max_nums=4, invisible_ms=60_000, poll_ms=500)
                for m in r.messages:
                    seen.append(m.body)
                    assert await pc.ack(m)

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(consumer)
            for q in range(4):
                await send_n(client, addr, "PopC", total // 4, queue_id=q, prefix=f"{q}-")
        assert len(seen) == total and len(set(seen)) == total

    run_embedded(body, tmp_path)


def test_lmq_pop_and_init_mode(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        props = {"INNER_MULTI_DISPATCH": "%LMQ%q1,%LMQ%q2"}
        await send_n(client, addr, "Telemetry", 3, props=props)
        pc = popper(server, client, "%LMQ%grp")
        r = await pc.pop("%LMQ%q2", invisible_ms=60_000)
        assert [(m.queue_id, m.queue_offset) for m in r.messages] == [(0, 0), (0, 1), (0, 2)]
        assert await pc.nack(r.messages[1])
        again = await pc.pop("%LMQ%q2", invisible_ms=60_000)
        assert [(m.body, m.queue_offset, m.delivery_count) for m in again.messages] == [
            (b"m1", 1, 2)]
        for m in (r.messages[0], r.messages[2], again.messages[0]):
            assert await pc.ack(m)
        assert committed(server, "%LMQ%grp", "%LMQ%q2") == 3
        # A new group with initMode MAX starts at the newest stored message (as Apache).
        late = popper(server, client, "GID_LATE")
        got = await late.pop("Telemetry", queue_id=0, init_mode=INIT_MODE_MAX)
        assert [m.body for m in got.messages] == [b"m2"]

    run_embedded(body, tmp_path, allow_inner_properties_without_acl=True)


def test_bad_requests_get_protocol_errors(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        await send_n(client, addr, "PopE", 1)
        base = {"consumerGroup": "GID_E", "topic": "PopE", "queueId": "-1", "maxMsgNums": "33",
                "invisibleTime": "1000", "pollTime": "0", "bornTime": "0", "initMode": "0"}
        r = await client.invoke(addr, RemotingCommand.request(200050, dict(base)))
        assert r.code == 29  # INVALID_PARAMETER, as Apache (> 32)
        r = await client.invoke(addr, RemotingCommand.request(
            200050, dict(base, maxMsgNums="1", queueId="9")))
        assert r.code == 29
        r = await client.invoke(addr, RemotingCommand.request(
            200050, dict(base, maxMsgNums="1", topic="NoSuchTopic")))
        assert r.code == 17
        for extra in ("1 2 3", "a b c d e f g h", "x" * 600):
            r = await client.invoke(addr, RemotingCommand.request(200051, {
                "consumerGroup": "GID_E", "topic": "PopE", "queueId": "0",
                "extraInfo": extra, "offset": "0"}))
            assert r.code == 29, extra
        r = await client.invoke(addr, RemotingCommand.request(200151, {}, b'{"acks": 5}'))
        assert r.code == 29
        r = await client.invoke(addr, RemotingCommand.request(
            200151, {}, b'{"acks": [{"c": "G", "t": "PopE", "r": "0", "q": 0, "so": 0,'
                        b' "pt": 1, "b": "!!"}]}'))
        assert r.code == 29
        # The broker still serves.
        pc = popper(server, client, "GID_E")
        assert [m.body for m in (await pc.pop("PopE")).messages] == [b"m0"]

    run_embedded(body, tmp_path)


def test_dead_letter_after_max_deliveries(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        await send_n(client, addr, "PopD", 2)
        pc = popper(server, client, "GID_DLQ")
        r = await pc.pop("PopD", invisible_ms=60_000)
        assert await pc.ack(r.messages[1])
        counts = [r.messages[0].delivery_count]
        m = r.messages[0]
        # retry_max_times=2: three deliveries in all (nacks and one expired deadline).
        assert await pc.nack(m)
        m = (await pc.pop("PopD", invisible_ms=100)).messages[0]
        counts.append(m.delivery_count)
        m = (await pc.pop("PopD", invisible_ms=60_000, poll_ms=10_000)).messages[0]
        counts.append(m.delivery_count)
        assert counts == [1, 2, 3]
        assert await pc.nack(m)
        # The revive timer moves it to %DLQ%GID_DLQ (no pop needed).
        with trio.fail_after(10):
            while server.broker.pop_service.dead_lettered == 0:
                await trio.sleep(0.02)
        dlq = popper(server, client, "GID_READ_DLQ")
        got = await dlq.pop("%DLQ%GID_DLQ", poll_ms=10_000)
        assert [x.body for x in got.messages] == [b"m0"]
        assert got.messages[0].message.properties["RETRY_TOPIC"] == "PopD"
        assert "POP_CK" not in server.broker.store.look_message(
            got.messages[0].message.commitlog_offset).properties
        assert committed(server, "GID_DLQ", "PopD") == 2
        assert (await pc.pop("PopD", invisible_ms=60_000)).status == PopStatus.NO_NEW_MSG
        assert not await pc.ack(m)

    run_embedded(body, tmp_path, retry_max_times=2)


def test_held_poll_on_all_queues_gets_an_expired_message(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        await send_n(client, addr, "PopV", 1, queue_id=1)
        pc = popper(server, client)
        r = await pc.pop("PopV", queue_id=1, invisible_ms=200)
        assert r.messages
        # A poll on all queues: the deadline of queue 1 passes while it is held.
        again = await pc.pop("PopV", invisible_ms=60_000, poll_ms=10_000)
        assert [(m.queue_id, m.delivery_count) for m in again.messages] == [(1, 2)]

    run_embedded(body, tmp_path)


def test_release_holder_explicitly_and_on_connection_close(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        name = server.broker.config.broker_name
        await send_n(client, addr, "PopH", 4)
        # Explicit: pops tagged with holderId, then released by id.
        tagged = PopClient(client, addr, name, "GID_H", holder_id="gw-1")
        r = await tagged.pop("PopH", max_nums=2, invisible_ms=600_000)
        assert [m.body for m in r.messages] == [b"m0", b"m1"]
        assert await tagged.ack(r.messages[0])
        other = PopClient(client, addr, name, "GID_H")
        assert await other.release_holder("gw-0") == 0
        assert await other.release_holder("gw-1") == 1
        again = await other.pop("PopH", max_nums=1, invisible_ms=600_000)
        assert [(m.body, m.delivery_count) for m in again.messages] == [(b"m1", 2)]
        assert not await tagged.ack(r.messages[1])  # the released handle is spent
        # On connection close: a gateway with its own connection registers as holder.
        gone = []
        async with RemotingClient(request_timeout=10.0) as gw_client:
            gw = PopClient(gw_client, addr, name, "GID_H")
            await gw.register_holder("gw-2")
            gone = (await gw.pop("PopH", invisible_ms=600_000)).messages
            assert [m.body for m in gone] == [b"m2", b"m3"]
        back = await other.pop("PopH", invisible_ms=600_000, poll_ms=10_000)
        assert [(m.body, m.redelivered) for m in back.messages] == [
            (b"m2", True), (b"m3", True)]
        bad = await client.invoke(addr, RemotingCommand.request(900002, {"holderId": "a b"}))
        assert bad.code == 29

    run_embedded(body, tmp_path)


def test_reject_without_requeue_dead_letters_at_once(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        await send_n(client, addr, "PopJ", 2)
        pc = popper(server, client, "GID_REJ")
        r = await pc.pop("PopJ", invisible_ms=60_000)
        assert await pc.reject(r.messages[0])
        assert not await pc.ack(r.messages[0])  # on its way to the DLQ
        assert await pc.ack(r.messages[1])
        dlq = popper(server, client, "GID_READ")
        with trio.fail_after(10):
            while server.broker.topic_config_manager.get("%DLQ%GID_REJ") is None:
                await trio.sleep(0.02)
        got = await dlq.pop("%DLQ%GID_REJ", poll_ms=10_000)
        assert [(m.body, m.message.reconsume_times) for m in got.messages] == [(b"m0", 1)]
        with trio.fail_after(10):
            while committed(server, "GID_REJ", "PopJ") != 2:
                await trio.sleep(0.02)
        assert (await pc.pop("PopJ", invisible_ms=1)).status == PopStatus.NO_NEW_MSG

    run_embedded(body, tmp_path)


def test_tag_filter_and_consumed_offset_past_filtered(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        for i, tag in enumerate(["A", "B", "A", "B"]):
            resp = await client.invoke(addr, send_request(
                "PopF", f"m{i}".encode(), properties={"TAGS": tag}))
            assert resp.code == 0
        pc = popper(server, client, "GID_F")
        r = await pc.pop("PopF", queue_id=0, exp_type="TAG", exp="A", invisible_ms=60_000)
        assert [m.body for m in r.messages] == [b"m0", b"m2"]
        for m in r.messages:
            assert await pc.ack(m)
        assert committed(server, "GID_F", "PopF") == 4  # filtered ones count as consumed

    run_embedded(body, tmp_path)
