"""Orderly POP (FIFO message groups, core/broker/pop/orderly.py): a message in flight
blocks the rest of its group only; an ack (or the deadline) lets the next one go; held
back messages survive a restart. A real broker on a free port and the native PopClient."""

from __future__ import annotations

import json

import trio
import trio.testing

from core.client.pop_consumer import PopClient, PopStatus
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode
from tests.core.broker.harness import run_embedded, send_request

TOPIC = "FifoT"


async def fifo_group(client, addr, group: str) -> None:
    """Make `group` a FIFO group the way mqadmin updateSubGroup -o true does."""
    body = json.dumps({"groupName": group, "consumeMessageOrderly": True}).encode()
    resp = await client.invoke(addr, RemotingCommand.request(
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body))
    assert resp.code == 0, resp.remark


async def send_groups(client, addr, bodies: list[str]) -> None:
    """One queue; the message group is the body's first letter (A1 -> group A)."""
    for b in bodies:
        resp = await client.invoke(addr, send_request(
            TOPIC, b.encode(), queue_id=0, properties={"__SHARDINGKEY": b[0]}))
        assert resp.code == 0, resp.remark


def bodies(r) -> list[str]:
    return [m.body.decode() for m in r.messages]


def test_in_flight_message_blocks_its_group_only(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        await fifo_group(client, addr, "GID_FIFO")
        await send_groups(client, addr, ["A1", "B1", "A2", "C1", "B2", "A3"])
        pc = PopClient(client, addr, server.broker.config.broker_name, "GID_FIFO")
        first = await pc.pop(TOPIC, queue_id=0, invisible_ms=60_000)
        # The head of each group; A2, B2, A3 are held back behind A1 and B1.
        assert bodies(first) == ["A1", "B1", "C1"]
        assert (await pc.pop(TOPIC, queue_id=0, invisible_ms=60_000)).status \
            == PopStatus.NO_NEW_MSG
        a1, b1, c1 = first.messages
        assert await pc.ack(b1)  # B is free: B2 next; A still blocked
        assert bodies(await pc.pop(TOPIC, queue_id=0, invisible_ms=60_000)) == ["B2"]
        assert await pc.ack(a1)
        r = await pc.pop(TOPIC, queue_id=0, invisible_ms=60_000)
        assert bodies(r) == ["A2"]
        assert await pc.ack(r.messages[0])
        assert bodies(await pc.pop(TOPIC, queue_id=0, invisible_ms=60_000)) == ["A3"]
        # The consumed offset stays below what is not acknowledged (C1).
        assert server.broker.offset_manager.query("GID_FIFO", TOPIC, 0) == 3

        # A normal group on the same messages gets everything at once.
        normal = PopClient(client, addr, server.broker.config.broker_name, "GID_NORMAL")
        r = await normal.pop(TOPIC, queue_id=0, invisible_ms=60_000, init_mode=0)
        assert bodies(r) == ["A1", "B1", "A2", "C1", "B2", "A3"]

    run_embedded(body, tmp_path)


def test_redelivery_keeps_group_order_and_ack_wakes_poll(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        await fifo_group(client, addr, "GID_FIFO")
        await send_groups(client, addr, ["A1", "A2", "B1"])
        pc = PopClient(client, addr, server.broker.config.broker_name, "GID_FIFO")
        r = await pc.pop(TOPIC, queue_id=0, max_nums=1, invisible_ms=1000)  # B1 stays
        assert bodies(r) == ["A1"]
        # Not acked: when its invisible time passes A1 comes again before A2 (B1 was
        # free all along). The poll ends at A1's deadline, not at its timeout.
        seen = []
        while "A1" not in seen[1:]:
            got = await pc.pop(TOPIC, queue_id=0, invisible_ms=60_000, poll_ms=10_000)
            assert got.status == PopStatus.FOUND
            seen += bodies(got)
            for m in got.messages:
                if m.body == b"A1":
                    assert m.delivery_count == 2
                    a1 = m
        assert seen == ["B1", "A1"]
        # A poll held while A1 is in flight is woken by the ack and gets A2.
        result = {}

        async def poll():
            result["r"] = await pc.pop(TOPIC, queue_id=0, invisible_ms=60_000,
                                       poll_ms=15_000)

        with trio.fail_after(10):  # without the wake-up it would end at 15 s
            async with trio.open_nursery() as nursery:
                nursery.start_soon(poll)
                await trio.testing.wait_all_tasks_blocked()
                await trio.sleep(0.2)  # the poll is held at the broker
                assert await pc.ack(a1)
        assert bodies(result["r"]) == ["A2"]

    run_embedded(body, tmp_path)


def test_held_back_messages_survive_restart(tmp_path):
    async def first(server, client):
        addr = server.broker.broker_addr
        await fifo_group(client, addr, "GID_FIFO")
        await send_groups(client, addr, ["A1", "A2", "A3"])
        pc = PopClient(client, addr, server.broker.config.broker_name, "GID_FIFO")
        r = await pc.pop(TOPIC, queue_id=0, invisible_ms=60_000)
        assert bodies(r) == ["A1"]  # A2, A3 read and held back: the cursor is past them
        assert server.broker.pop_service.state.get("GID_FIFO", TOPIC, 0).next_offset == 3
        assert await pc.ack(r.messages[0])

    async def second(server, client):
        addr = server.broker.broker_addr
        pc = PopClient(client, addr, server.broker.config.broker_name, "GID_FIFO")
        r = await pc.pop(TOPIC, queue_id=0, invisible_ms=60_000)
        assert bodies(r) == ["A2"] and r.messages[0].delivery_count == 1
        assert await pc.ack(r.messages[0])
        assert bodies(await pc.pop(TOPIC, queue_id=0, invisible_ms=60_000)) == ["A3"]

    run_embedded(first, tmp_path)
    run_embedded(second, tmp_path)
