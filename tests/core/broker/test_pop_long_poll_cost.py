"""A long poll's first pop (the queue is empty: it parks) and its pop after the wake-up:
for an LMQ at its end the empty pop answers from memory, without a store read and without
committing the RocksDB batch the put staged; the woken pop takes the record from memory
(the hand-off). A real broker on a free port and the native PopClient."""

from __future__ import annotations

import trio
import trio.testing

from tests.core.broker.harness import run_embedded
from tests.core.broker.test_pop_handoff import LMQ, popper, send, spy


def test_parked_pop_cycle_reads_nothing_from_rocksdb(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        await send(client, addr, b"m0")
        pc = popper(server, client)
        (m0,) = (await pc.pop(LMQ, invisible_ms=60_000)).messages
        assert await pc.ack(m0)
        store, service = server.broker.store, server.broker.pop_service
        calls: list = []
        spy(store, "get", calls)
        spy(store._kv, "commit", calls)
        spy(store._kv, "get_many", calls)
        got: list = []

        async def poll():
            got.append(await pc.pop(LMQ, invisible_ms=60_000, poll_ms=20_000))

        for i in range(1, 4):  # one message in flight at a time (a pika consumer)
            got.clear()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(poll)
                with trio.fail_after(10):  # parked after its empty pop
                    while service.polling != 1:
                        await trio.testing.wait_all_tasks_blocked(0.01)
                await send(client, addr, f"m{i}".encode())
            (r,) = got
            assert [(m.body, m.queue_offset) for m in r.messages] == [(f"m{i}".encode(), i)]
            assert await pc.ack(r.messages[0])
        assert calls == []
        # At the end with nothing parked: an immediate pop is empty, and the cursor stays.
        empty = await pc.pop(LMQ, invisible_ms=60_000)
        assert not empty.messages and calls == []
        assert server.broker.offset_manager.query("%LMQ%grp", LMQ, 0) == 4
        await send(client, addr, b"m4")
        (m4,) = (await pc.pop(LMQ, invisible_ms=60_000)).messages
        assert (m4.body, m4.queue_offset) == (b"m4", 4)

    run_embedded(body, tmp_path, allow_inner_properties_without_acl=True)
