"""The in-process transport's yield after an instant answer (core/remoting/local.py) is
skipped for a task that passed a schedule point since its previous request (the AMQP
connection's task waits for its socket between requests: one scheduler pass per request
saved, issue 13), and kept for back-to-back requests, so a loop still lets others run."""

from __future__ import annotations

import trio
import trio.testing

from core.remoting.client import RemotingClient
from core.remoting.codec import RemotingCommand
from tests.core.remoting.test_local_caller_yields import ECHO, _table


async def _echo(client: RemotingClient) -> None:
    resp = await client.invoke("broker:1", RemotingCommand.request(ECHO), timeout=5)
    assert resp.code == 0


def test_a_task_that_yielded_since_its_last_request_is_not_made_to_yield_again():
    async def main():
        async with RemotingClient() as client:
            client.register_local("broker:1", _table())
            with trio.testing.assert_checkpoints():
                await _echo(client)  # a task's first request yields
            await trio.sleep(0)  # the task waits for something else (its socket)
            with trio.testing.assert_no_checkpoints():
                await _echo(client)

    trio.run(main)


def test_back_to_back_requests_still_yield():
    async def main():
        async with RemotingClient() as client:
            client.register_local("broker:1", _table())
            await _echo(client)
            await trio.sleep(0)
            await _echo(client)
            for _ in range(3):
                with trio.testing.assert_checkpoints():
                    await _echo(client)

    trio.run(main)


def test_a_looping_task_does_not_starve_another():
    async def main():
        async with RemotingClient() as client, trio.open_nursery() as nursery:
            client.register_local("broker:1", _table())
            ticks = 0
            stop = trio.Event()

            async def other() -> None:
                nonlocal ticks
                while not stop.is_set():
                    ticks += 1
                    await trio.sleep(0)

            nursery.start_soon(other)
            await trio.sleep(0)
            before = ticks
            for _ in range(20):
                await _echo(client)
            assert ticks - before >= 10
            stop.set()

    trio.run(main)
