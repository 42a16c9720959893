"""The in-process transport's yield after a request (core/remoting/local.py): kept for a
task that loops over requests (it would starve the others), skipped for a task that
declared it yields between its requests itself (`caller_yields`), the MQTT broker link's
dispatcher, so the answer is used in the same turn (issue 10, latency at 1k msg/s)."""

from __future__ import annotations

import trio
import trio.testing

from core.remoting.client import RemotingClient
from core.remoting.codec import RemotingCommand
from core.remoting.local import caller_yields
from core.remoting.processor import ProcessorTable, RequestContext

ECHO = 9001


def _table() -> ProcessorTable:
    table = ProcessorTable()

    async def instant(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(0)

    table.register(ECHO, instant)
    return table


def test_a_declared_caller_gets_the_answer_without_a_checkpoint():
    async def main():
        async with RemotingClient() as client:
            client.register_local("broker:1", _table())
            await client.connection("broker:1")  # connected: the invoke alone is measured
            with trio.testing.assert_checkpoints():
                await client.invoke("broker:1", RemotingCommand.request(ECHO), timeout=5)
            caller_yields()
            with trio.testing.assert_no_checkpoints():
                resp = await client.invoke("broker:1", RemotingCommand.request(ECHO), timeout=5)
            assert resp.code == 0

    trio.run(main)


def test_the_declaration_holds_for_the_declaring_task_only():
    async def main():
        async with RemotingClient() as client, trio.open_nursery() as nursery:
            client.register_local("broker:1", _table())
            await client.connection("broker:1")
            declared = trio.Event()
            other_checked = trio.Event()

            async def other() -> None:
                await declared.wait()
                with trio.testing.assert_checkpoints():
                    await client.invoke("broker:1", RemotingCommand.request(ECHO), timeout=5)
                other_checked.set()

            nursery.start_soon(other)
            caller_yields()
            declared.set()
            await other_checked.wait()
            with trio.testing.assert_no_checkpoints():
                await client.invoke("broker:1", RemotingCommand.request(ECHO), timeout=5)

    trio.run(main)
