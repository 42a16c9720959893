"""Message arrival for multi-dispatch (core/broker/arrival.py): a put to N LMQs tells the
broker once (MessageStore.lmq_dispatch_listener), and the broker wakes each held pull of
those LMQs and calls its listeners in that one pass."""

from __future__ import annotations

import functools

import trio
from trio.testing import MockClock, wait_all_tasks_blocked

from core.common.codec import decode_records
from tests.core.broker.harness import pull_request, run_embedded, send_request

SUSPEND_SUBSCRIPTION = 2 | 4
NAMES = [f"%LMQ%arr{i}" for i in range(40)]


def test_broker_wakes_held_pulls_and_listeners_in_one_pass(tmp_path):
    clock = MockClock()

    async def body(server, client):
        broker = server.broker
        addr = broker.broker_addr
        per_put: list[list[str]] = []

        def failing(names, mxs):
            raise RuntimeError("a broken listener")

        broker.add_lmq_dispatch_listener(failing)  # logged; the others still run
        others: list[tuple[str, int]] = []
        broker.add_lmq_dispatch_listener(lambda names, mxs: per_put.append(list(names)),
                                         lambda t, q, mx: others.append((t, mx)))
        stores = []
        real = broker.store.lmq_dispatch_listener
        broker.store.lmq_dispatch_listener = lambda n, m: (stores.append(1), real(n, m))
        result = {}

        async def puller(lmq):
            req = pull_request("%LMQ%g", lmq, 0, 0, sys_flag=SUSPEND_SUBSCRIPTION,
                               suspend_ms=20000)
            result[lmq] = await client.invoke(addr, req, timeout=30)

        async with trio.open_nursery() as nursery:
            for lmq in (NAMES[3], NAMES[17]):
                nursery.start_soon(functools.partial(puller, lmq))
            await wait_all_tasks_blocked()
            assert broker.pull_hold_service.held == 2
            props = {"INNER_MULTI_DISPATCH": ",".join(NAMES)}
            resp = await client.invoke(addr, send_request("Fan", b"m0", properties=props))
            assert resp.code == 0, resp.remark
        for lmq in (NAMES[3], NAMES[17]):
            r = result[lmq]
            assert r.code == 0 and [m.body for m in decode_records(r.body_bytes())] == [b"m0"]
        assert broker.pull_hold_service.held == 0
        assert stores == [1]  # the store told the broker once for the 40 LMQs
        assert per_put == [NAMES]
        assert others == [("Fan", 1)]  # the put's own queue; its LMQs came in per_put
        broker.remove_dispatch_listener(failing)
        assert failing not in broker.arrivals.lmq_listeners

    run_embedded(body, tmp_path, clock=clock, allow_inner_properties_without_acl=True)
