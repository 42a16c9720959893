"""The POP hand-off (docs/pop.md "Hand-off"): a pop long-polling an LMQ, woken by the
dispatch of a message, takes the record the put just wrote — no store read, no early
RocksDB commit — and the delivery keeps every POP rule (in flight until its deadline,
redelivered after it, acknowledged once, journaled: a broker killed with -9 redelivers
it). A real broker on a free port and the native PopClient."""

from __future__ import annotations

import trio
import trio.testing

from core.client.pop_consumer import PopClient, PopStatus
from core.remoting.client import RemotingClient
from core.store import lmq_index
from tests.core.broker.harness import ServerProcess, run_embedded, send_request

LMQ = "%LMQ%handoff"
PROPS = {"INNER_MULTI_DISPATCH": LMQ}


def popper(server, client, group="%LMQ%grp"):
    b = server.broker
    return PopClient(client, b.broker_addr, b.config.broker_name, group)


async def send(client, addr, body: bytes) -> None:
    resp = await client.invoke(addr, send_request("Telemetry", body, properties=dict(PROPS)))
    assert resp.code == 0, resp.remark


def spy(obj, name, calls: list) -> None:
    real = getattr(obj, name)

    def wrapper(*a, **kw):
        calls.append(name)
        return real(*a, **kw)

    setattr(obj, name, wrapper)


def test_woken_pop_takes_the_dispatched_record_without_a_store_read(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        await send(client, addr, b"m0")  # the LMQ exists; m0 is taken first
        pc = popper(server, client)
        first = await pc.pop(LMQ, invisible_ms=60_000)
        assert [m.body for m in first.messages] == [b"m0"]
        store = server.broker.store
        got = []

        async def poll():
            got.append(await pc.pop(LMQ, invisible_ms=60_000, poll_ms=20_000))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(poll)
            with trio.fail_after(10):  # parked on the LMQ (the request crosses TCP first)
                while server.broker.pop_service.polling != 1:
                    await trio.testing.wait_all_tasks_blocked(0.01)
            calls: list = []
            spy(store, "get", calls)
            spy(store._kv, "commit", calls)
            spy(store._kv, "get_many", calls)
            await send(client, addr, b"m1")
        (r,) = got
        assert [(m.body, m.queue_offset, m.delivery_count) for m in r.messages] == [(b"m1", 1, 1)]
        assert calls == []  # handed off: neither the store nor RocksDB was read
        assert await pc.ack(r.messages[0]) and await pc.ack(first.messages[0])
        assert server.broker.offset_manager.query("%LMQ%grp", LMQ, 0) == 2

    run_embedded(body, tmp_path, allow_inner_properties_without_acl=True)


def test_handed_off_deliveries_keep_the_pop_rules(tmp_path, monkeypatch):
    monkeypatch.setattr(lmq_index, "RECENT_UNITS_MAX", 2)  # m3, m4 only, below

    async def body(server, client):
        addr = server.broker.broker_addr
        store = server.broker.store
        for i in range(3):
            await send(client, addr, f"m{i}".encode())
        store._commit_kv()
        for i in range(3, 5):
            await send(client, addr, f"m{i}".encode())
        store._commit_kv()  # m0..m2 now only in RocksDB, m3, m4 still held in memory
        pc = popper(server, client)
        r = await pc.pop(LMQ, max_nums=2, invisible_ms=60_000)  # read from the store
        assert [m.body for m in r.messages] == [b"m0", b"m1"]
        calls: list = []
        spy(store, "get", calls)
        r2 = await pc.pop(LMQ, max_nums=32, invisible_ms=200)
        # The cursor (m2) is behind what memory holds: one store read, in order.
        assert [(m.body, m.queue_offset) for m in r2.messages] == [
            (b"m2", 2), (b"m3", 3), (b"m4", 4)]
        assert calls == ["get"]
        # In flight: nobody else gets them before their deadline.
        assert (await pc.pop(LMQ, invisible_ms=60_000)).status == PopStatus.NO_NEW_MSG
        assert await pc.ack(r2.messages[1])  # m3 acknowledged: never again
        again = []
        with trio.fail_after(10):
            while len(again) < 2:
                got = await pc.pop(LMQ, invisible_ms=60_000, poll_ms=2_000)
                again += got.messages
        assert [(m.body, m.delivery_count, m.redelivered) for m in again] == [
            (b"m2", 2, True), (b"m4", 2, True)]
        assert not await pc.ack(r2.messages[2])  # the first delivery's handle is stale
        for m in r.messages + again:
            assert await pc.ack(m)
        assert server.broker.offset_manager.query("%LMQ%grp", LMQ, 0) == 5

    run_embedded(body, tmp_path, allow_inner_properties_without_acl=True)


def test_handed_off_delivery_survives_kill_9(tmp_path):
    data = tmp_path / "data"
    cfg = "allow_inner_properties_without_acl = true\n"
    server = ServerProcess(data, config_text=cfg).start()

    async def run(fn, srv):
        async with RemotingClient(request_timeout=10.0) as client:
            return await fn(client, PopClient(client, srv.broker_addr, srv.broker_name,
                                              "%LMQ%grp"), srv.broker_addr)

    async def before(client, pc, addr):
        await send(client, addr, b"m0")
        assert [m.body for m in (await pc.pop(LMQ, invisible_ms=600_000)).messages] == [b"m0"]
        got = []

        async def poll():
            got.append(await pc.pop(LMQ, max_nums=2, invisible_ms=300, poll_ms=10_000))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(poll)
            await trio.sleep(0.3)  # parked (another process: nothing to wait on here)
            await send(client, addr, b"m1")
        assert [m.body for m in got[0].messages] == [b"m1"]  # not acknowledged

    try:
        trio.run(run, before, server)
    finally:
        server.kill()
    again = ServerProcess(data, namesrv_port=server.namesrv_port,
                          broker_port=server.broker_port, config_text=cfg).start()
    try:
        async def after(client, pc, addr):
            with trio.fail_after(20):
                r = await pc.pop(LMQ, invisible_ms=60_000, poll_ms=5_000)
            # m1, handed off and never acknowledged, comes back (m0's deadline is far).
            assert [(m.body, m.delivery_count) for m in r.messages] == [(b"m1", 2)]
            assert await pc.ack(r.messages[0])

        trio.run(run, after, again)
    finally:
        again.kill()


def test_pops_of_a_fanned_out_message_share_one_decoded_copy(tmp_path, monkeypatch):
    from core.client import pop_records

    monkeypatch.setattr(pop_records, "_shared", {})
    fan = [f"%LMQ%fan{i}" for i in range(3)]

    async def body(server, client):
        addr = server.broker.broker_addr
        resp = await client.invoke(addr, send_request(
            "Telemetry", b"x" * 300, properties={"INNER_MULTI_DISPATCH": ",".join(fan)}))
        assert resp.code == 0, resp.remark
        got = []
        for name in fan:
            r = await popper(server, client, "%LMQ%g" + name[5:]).pop(
                name, invisible_ms=60_000, light=True)
            got += r.messages
        recs = [m.message for m in got]
        # A record dispatched to one queue only is popped once per group: not kept.
        await send(client, addr, b"alone")
        assert pop_records._shared and all(b"," in v[1] for v in pop_records._shared.values())
        alone = await popper(server, client).pop(LMQ, invisible_ms=60_000, light=True)
        assert [m.body for m in alone.messages] == [b"alone"]
        assert len(pop_records._shared) == 1
        assert [(m.topic, m.body) for m in got] == [(n, b"x" * 300) for n in fan]
        assert all(r.body is recs[0].body and r.raw_properties is recs[0].raw_properties
                   for r in recs)  # decoded once
        # A redelivery carries its own receipt handle: decoded for itself.
        pc = popper(server, client, "%LMQ%gfan1")
        assert await pc.nack(got[1])
        again = (await pc.pop(fan[1], invisible_ms=60_000, light=True)).messages
        assert [(m.body, m.delivery_count) for m in again] == [(b"x" * 300, 2)]
        assert again[0].message.raw_properties is not recs[0].raw_properties
        assert await pc.ack(again[0]) and not await pc.ack(got[1])
        # Bounded: nothing past SHARED_RECORDS_MAX_BYTES is kept.
        monkeypatch.setattr(pop_records, "SHARED_RECORDS_MAX_BYTES", 100)
        monkeypatch.setattr(pop_records, "_shared", {})
        monkeypatch.setattr(pop_records, "_shared_bytes", 0)
        await client.invoke(addr, send_request(
            "Telemetry", b"y", properties={"INNER_MULTI_DISPATCH": ",".join(fan)}))
        ys = [(await popper(server, client, "%LMQ%g" + n[5:]).pop(
            n, invisible_ms=60_000, light=True)).messages[0].message for n in fan[:2]]
        assert ys[0].body == ys[1].body == b"y"
        assert ys[0].raw_properties is not ys[1].raw_properties

    run_embedded(body, tmp_path, allow_inner_properties_without_acl=True)
