"""The in-process transport arms a request's timeout only once its handler waits
(core/remoting/local.py): a handler that answers at once runs with no deadline of the
caller's (no cancel scope per request, issue 10 / 13: CPU per message at low rates); one
that waits is still bounded by it; one that waits inside a scope of its own completes."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from core.remoting.client import RemotingClient
from core.remoting.codec import RemotingCommand
from core.remoting.errors import RemotingTimeoutError
from core.remoting.processor import ProcessorTable, RequestContext

INSTANT, WAITS, SCOPED, HANGS = 9101, 9102, 9103, 9104


def _table(seen: dict[str, float]) -> ProcessorTable:
    table = ProcessorTable()

    async def instant(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        seen["instant"] = trio.current_effective_deadline()
        return cmd.make_response(0)

    async def waits(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        seen["before"] = trio.current_effective_deadline()
        await trio.sleep(0)
        seen["after"] = trio.current_effective_deadline()
        return cmd.make_response(0, "waited")

    async def scoped(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep, 0)
            with trio.move_on_after(30):
                await trio.sleep(0)
        return cmd.make_response(0, "scoped")

    async def hangs(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    table.register(INSTANT, instant)
    table.register(WAITS, waits)
    table.register(SCOPED, scoped)
    table.register(HANGS, hangs)
    return table


async def _client_invoke(code: int, seen: dict[str, float], timeout: float = 60) -> RemotingCommand:
    async with RemotingClient() as client:
        client.register_local("broker:1", _table(seen))
        return await client.invoke("broker:1", RemotingCommand.request(code), timeout=timeout)


def test_an_instant_answer_arms_no_deadline():
    seen: dict[str, float] = {}
    resp = trio.run(_client_invoke, INSTANT, seen)
    assert resp.code == 0
    assert seen["instant"] == math.inf


def test_a_handler_that_waits_is_bounded_from_its_first_wait():
    seen: dict[str, float] = {}
    resp = trio.run(_client_invoke, WAITS, seen)
    assert resp.remark == "waited"
    assert seen["before"] == math.inf
    assert seen["after"] < math.inf


def test_a_handler_waiting_inside_its_own_scopes_completes():
    resp = trio.run(_client_invoke, SCOPED, {})
    assert resp.remark == "scoped"


def test_a_hanging_handler_still_times_out():
    async def main() -> None:
        async with RemotingClient() as client:
            client.register_local("broker:1", _table({}))
            with pytest.raises(RemotingTimeoutError):
                await client.invoke("broker:1", RemotingCommand.request(HANGS), timeout=5)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_without_trios_task_fields_requests_take_the_plain_path(monkeypatch):
    # A trio whose tasks lack the private fields `invoke` reads: the plain path, with the
    # timeout armed up front (so even an instant handler sees the caller's deadline).
    from core.remoting import local

    monkeypatch.setattr(local, "_TASK_FIELDS", False)
    seen: dict[str, float] = {}
    assert trio.run(_client_invoke, INSTANT, seen).code == 0
    assert seen["instant"] < math.inf
    assert trio.run(_client_invoke, SCOPED, {}).remark == "scoped"

    test_a_hanging_handler_still_times_out()
