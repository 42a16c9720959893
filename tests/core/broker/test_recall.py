"""RECALL_MESSAGE (370, core/broker/processors/recall.py): a recalled scheduled message is
dropped when it comes due, also after a broker restart; refusals. A real broker on a
free port and raw remoting requests."""

from __future__ import annotations

import time

import trio

from core.broker.processors.recall import encode_recall_handle
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode
from tests.core.broker.harness import run_embedded, send_request

TOPIC = "RecallT"


async def send_delayed(server, client, body: str, uniq: str) -> None:
    resp = await client.invoke(server.broker.broker_addr, send_request(
        TOPIC, body.encode(), properties={"DELAY": "2", "UNIQ_KEY": uniq}))
    assert resp.code == 0, resp.remark


async def recall(server, client, handle: str, topic: str = TOPIC) -> RemotingCommand:
    return await client.invoke(server.broker.broker_addr, RemotingCommand.request(
        RequestCode.RECALL_MESSAGE, {"topic": topic, "recallHandle": handle}))


def handle(server, uniq: str, deliver_ms: int | None = None) -> str:
    if deliver_ms is None:
        deliver_ms = int(time.time() * 1000) + 3000
    return encode_recall_handle(TOPIC, server.broker.config.broker_name, deliver_ms, uniq)


def bodies_in_topic(server) -> list[bytes]:
    store = server.broker.store
    out = []
    for q in range(4):
        got = store.get(TOPIC, q, 0, 32)
        out += [bytes(b) for b in got.buffers]
    return out


def test_recall_survives_restart_and_refusals(tmp_path):
    async def first(server, client):
        await send_delayed(server, client, "gone", "U-GONE")
        resp = await recall(server, client, handle(server, "U-GONE"))
        assert resp.code == 0 and resp.ext_fields["msgId"] == "U-GONE"
        # Refused: past delivery time, another broker, another topic, not a handle.
        past = handle(server, "U-X", int(time.time() * 1000) - 1)
        assert (await recall(server, client, past)).code == 604
        other = encode_recall_handle(TOPIC, "other-broker", int(time.time() * 1000) + 9000, "U")
        assert (await recall(server, client, other)).code == 604
        assert (await recall(server, client, "bm90IGEgaGFuZGxl")).code == 604
        newline = encode_recall_handle(TOPIC, server.broker.config.broker_name,
                                       int(time.time() * 1000) + 3000, "U\nX")
        assert (await recall(server, client, newline)).code == 604
        assert (await recall(server, client, handle(server, "U"), "NoSuchT")).code == 17

    async def second(server, client):
        await send_delayed(server, client, "stays", "U-STAYS")
        with trio.fail_after(20):  # the same level: "gone" came due first
            while not any(b"stays" in b for b in bodies_in_topic(server)):
                await trio.sleep(0.05)
        assert not any(b"gone" in b for b in bodies_in_topic(server))

    # Stopped before "gone" came due (the 5 s level): the mark must be read back.
    run_embedded(first, tmp_path, message_delay_level="1s 5s")
    run_embedded(second, tmp_path, message_delay_level="1s 5s")
