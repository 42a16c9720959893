"""`handles` / `register_handlers`: a processor's marked methods are its routes."""

from __future__ import annotations

from core.broker.processors import admin
from core.broker.processors.routes import handles, register_handlers
from core.remoting.codes import RequestCode
from core.remoting.processor import ProcessorTable


class _Proc:
    @handles(RequestCode.GET_MAX_OFFSET)
    async def fast(self, ctx, cmd):
        return None

    @handles(RequestCode.PULL_MESSAGE, inline=False)
    async def slow(self, ctx, cmd):
        return None

    async def helper(self, ctx, cmd):  # not marked: not routed
        return None


def test_marked_methods_are_routed_with_their_inline_flag():
    table, proc = ProcessorTable(), _Proc()
    register_handlers(table, proc)
    assert table.codes() == sorted([RequestCode.GET_MAX_OFFSET, RequestCode.PULL_MESSAGE])
    assert table.lookup(RequestCode.GET_MAX_OFFSET) == (proc.fast, True)
    assert table.lookup(RequestCode.PULL_MESSAGE) == (proc.slow, False)


def test_admin_reset_offset_runs_in_its_own_task():
    """It pushes the reset to the group's live clients: not in the connection's read loop."""

    class Broker:
        config = None

    table = ProcessorTable()
    admin.register(table, Broker())
    assert table.lookup(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET)[1] is False
    assert table.lookup(RequestCode.GET_BROKER_CONFIG)[1] is True
