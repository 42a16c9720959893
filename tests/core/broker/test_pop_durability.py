"""POP state across a broker killed with -9 (a real `python -m lmq serve` process):
nothing acknowledged comes back, unacknowledged messages come back after their
deadline (at once when it passed or they were nacked), old handles stay valid."""

from __future__ import annotations

import trio

from core.client.pop_consumer import PopClient, PopStatus
from core.remoting.client import RemotingClient
from core.remoting.codec import RemotingCommand
from tests.core.broker.harness import ServerProcess, send_request


def run(fn, *args):
    async def main():
        async with RemotingClient(request_timeout=10.0) as client:
            return await fn(client, *args)

    return trio.run(main)


def test_pop_state_survives_kill_9(tmp_path):
    data = tmp_path / "data"
    server = ServerProcess(data).start()

    async def before(client):
        pc = PopClient(client, server.broker_addr, server.broker_name, "GID_DUR")
        for i in range(6):
            r = await client.invoke(server.broker_addr, send_request(
                "PopDur", f"m{i}".encode(), queue_id=0))
            assert r.code == 0, r.remark
        first = await pc.pop("PopDur", queue_id=0, max_nums=5, invisible_ms=120_000)
        second = await pc.pop("PopDur", queue_id=0, max_nums=5, invisible_ms=300)
        msgs = first.messages + second.messages
        assert [m.body for m in msgs] == [f"m{i}".encode() for i in range(6)]
        for i in (0, 2, 4):
            assert await pc.ack(msgs[i])
        assert await pc.nack(msgs[1])
        # A gateway's deliveries, held by its id (released after the restart).
        for i in range(2):
            r = await client.invoke(server.broker_addr, send_request(
                "PopDurH", f"h{i}".encode(), queue_id=0))
            assert r.code == 0, r.remark
        gw = PopClient(client, server.broker_addr, server.broker_name, "GID_DUR",
                       holder_id="gw-9")
        held_by_gw = await gw.pop("PopDurH", queue_id=0, invisible_ms=600_000)
        assert len(held_by_gw.messages) == 2
        return msgs[3]

    try:
        held = run(before)
    finally:
        server.kill()

    again = ServerProcess(data, namesrv_port=server.namesrv_port,
                          broker_port=server.broker_port).start()
    try:
        async def after(client):
            pc = PopClient(client, again.broker_addr, again.broker_name, "GID_DUR")
            got = {}
            with trio.fail_after(20):
                while len(got) < 2:
                    r = await pc.pop("PopDur", queue_id=0, invisible_ms=120_000,
                                     poll_ms=2_000)
                    for m in r.messages:
                        assert m.body not in got, m.body
                        got[m.body] = m
            assert sorted(got) == [b"m1", b"m5"]
            assert [got[b].delivery_count for b in (b"m1", b"m5")] == [2, 2]
            # m3's deadline has not passed: not redelivered; its old handle still acks.
            r = await pc.pop("PopDur", queue_id=0, invisible_ms=120_000)
            assert r.status == PopStatus.NO_NEW_MSG
            assert await pc.ack(held)
            for m in got.values():
                assert await pc.ack(m)
            # The holder survived the restart: released by id, back at once.
            assert (await pc.pop("PopDurH", queue_id=0)).status == PopStatus.NO_NEW_MSG
            assert await pc.release_holder("gw-9") == 2
            back = await pc.pop("PopDurH", queue_id=0)
            assert [(m.body, m.delivery_count) for m in back.messages] == [(b"h0", 2), (b"h1", 2)]

        run(after)
        # Everything acknowledged: the group's consumed offset is the end of the queue.
        async def offset(client):
            r = await client.invoke(again.broker_addr, RemotingCommand.request(14, {
                "consumerGroup": "GID_DUR", "topic": "PopDur", "queueId": "0"}))
            return r.code, (r.ext_fields or {}).get("offset")

        assert run(offset) == (0, "6")
    finally:
        again.kill()
