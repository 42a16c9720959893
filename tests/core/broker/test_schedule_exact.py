"""Exact delivery times (TIMER_DELIVER_MS, core/broker/schedule.py "Exact delivery
times"): a message cascades through the delay levels and is delivered at its time, not
rounded to a level; across a restart and with a recall mid-cascade. A real broker on a
free port with small levels ("1s 2s 4s")."""

from __future__ import annotations

import time

import trio

from core.broker.processors.recall import encode_recall_handle
from core.common.names import SCHEDULE_TOPIC
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode, ResponseCode
from tests.core.broker.b_harness import messages, wait_async
from tests.core.broker.harness import run_embedded, send_request

TOPIC = "ExactT"
LEVELS = "1s 2s 4s"


def now_ms() -> int:
    return int(time.time() * 1000)


async def send_at(server, client, body: bytes, deliver_ms: int, uniq: str) -> None:
    # DELAY=3 (4 s): a 4.x broker would deliver after 4 s whatever the time asked.
    resp = await client.invoke(server.broker.broker_addr, send_request(
        TOPIC, body, properties={"DELAY": "3", "TIMER_DELIVER_MS": str(deliver_ms),
                                 "UNIQ_KEY": uniq}))
    assert resp.code == 0, resp.remark


async def delivered(server, client) -> dict[bytes, int]:
    got = await messages(client, server.broker.broker_addr, TOPIC)
    return {m.body: m.store_timestamp for m in got}


def test_delivery_times_between_and_beyond_levels(tmp_path):
    async def body(server, client):
        start = now_ms()
        wanted = {b"a": start + 500, b"b": start + 2500, b"c": start + 5500}
        for i, (name, at) in enumerate(wanted.items()):
            await send_at(server, client, name, at, f"U{i}")
        got = await wait_async(
            lambda: _all(server, client, len(wanted)), 20, "every delivery")
        for name, at in wanted.items():
            # Never early; late by at most the smallest level (plus scheduling noise).
            assert at <= got[name] <= at + 1800, (name, got[name] - at)
        assert server.broker.schedule_service.hops >= 2  # b and c cascaded

    run_embedded(body, tmp_path, message_delay_level=LEVELS)


async def _all(server, client, n):
    got = await delivered(server, client)
    return got if len(got) >= n else None


def test_cascade_survives_restart(tmp_path):
    target = {}

    async def first(server, client):
        target["at"] = now_ms() + 5500
        await send_at(server, client, b"x", target["at"], "U-R")
        # Stop after the first hop (4 s level -> a shorter one), before delivery.
        await wait_async(lambda: server.broker.schedule_service.hops >= 1, 10, "a hop")
        assert not await delivered(server, client)

    async def second(server, client):
        got = await wait_async(lambda: _all(server, client, 1), 15, "delivery after restart")
        assert list(got) == [b"x"]
        assert target["at"] <= got[b"x"] <= target["at"] + 1800
        assert server.broker.store.max_offset(SCHEDULE_TOPIC, 0) >= 1

    run_embedded(first, tmp_path, message_delay_level=LEVELS)
    run_embedded(second, tmp_path, message_delay_level=LEVELS)


def test_recall_mid_cascade(tmp_path):
    async def body(server, client):
        broker = server.broker
        at = now_ms() + 5500
        await send_at(server, client, b"kept", at, "U-KEEP")
        await send_at(server, client, b"recalled", at, "U-GONE")
        await wait_async(lambda: broker.schedule_service.hops >= 2, 10, "the first hops")
        handle = encode_recall_handle(TOPIC, broker.config.broker_name, at, "U-GONE")
        resp = await client.invoke(broker.broker_addr, RemotingCommand.request(
            RequestCode.RECALL_MESSAGE, {"topic": TOPIC, "recallHandle": handle}))
        assert resp.code == 0, resp.remark
        got = await wait_async(lambda: _all(server, client, 1), 15, "the kept one")
        with trio.fail_after(5):  # both were due at the same time: give it the same pass
            while broker.schedule_service.recalls.recalled < 1:
                await trio.sleep(0.05)
        assert list(await delivered(server, client)) == [b"kept"]
        assert list(got) == [b"kept"]

    run_embedded(body, tmp_path, message_delay_level=LEVELS)



def test_far_time_is_refused_and_past_time_keeps_the_level(tmp_path):
    async def body(server, client):
        store = server.broker.store
        # Further ahead than timer_max_delay_s: refused, as Apache's broker (MESSAGE_ILLEGAL),
        # not pulled in to the limit (delivered early).
        sent = now_ms()
        resp = await client.invoke(server.broker.broker_addr, send_request(
            TOPIC, b"far", properties={"DELAY": "3",
                                       "TIMER_DELIVER_MS": str(sent + 10 * 86_400_000)}))
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL
        assert store.units(SCHEDULE_TOPIC, 2, 0, 10) == []  # nothing in the 4 s level
        # A delivery time already past (a delivered 5.x message sent back for a retry):
        # its DELAY level, as a 4.x message.
        resp = await client.invoke(server.broker.broker_addr, send_request(
            TOPIC, b"retry", properties={"DELAY": "2", "TIMER_DELIVER_MS": str(sent - 5000)}))
        assert resp.code == 0
        (phys, _size, due), = store.units(SCHEDULE_TOPIC, 1, 0, 10)  # the 2 s level
        assert due - store.look_message(phys).store_timestamp >= 1900

    run_embedded(body, tmp_path, message_delay_level=LEVELS, timer_max_delay_s=60)
