"""The POP service listens to the LMQs of a put in one call (`on_dispatch_lmqs`,
core/broker/arrival.py): a pop held on an LMQ is woken by a multi-dispatched message, and
the service is not called once per LMQ of every put."""

from __future__ import annotations

import trio
import trio.testing

from core.broker.local_send import LocalSend
from core.broker.processors.send import decode_send_header
from core.common.properties import MessageConst
from tests.core.broker.harness import run_embedded, send_request


def test_held_pop_on_an_lmq_woken_by_a_multi_dispatch(tmp_path):
    async def body(server, client):
        broker = server.broker
        service = broker.pop_service
        arrivals = broker.arrivals
        assert service.on_dispatch in arrivals.other_listeners  # a put's own queue only
        assert service.on_dispatch_lmqs in arrivals.lmq_listeners
        woken = trio.Event()

        async def held() -> None:
            await service.wait("%LMQ%popq", 30.0)
            woken.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(held)
            await trio.testing.wait_all_tasks_blocked()
            assert not woken.is_set()
            cmd = send_request("PopLmqT", b"x", code=310, properties={
                MessageConst.INNER_MULTI_DISPATCH: "%LMQ%other,%LMQ%popq"})
            await LocalSend.of(broker).send(decode_send_header(cmd), b"x")
            with trio.fail_after(5):
                await woken.wait()
        assert "%LMQ%popq" not in service._waiters

    run_embedded(body, tmp_path)
