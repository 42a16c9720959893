"""Request code -> handler table, shared by servers, clients and the in-process transport.

As in RocketMQ, each request code has one processor. A handler is
``async def handler(ctx, cmd) -> RemotingCommand | None``; returning None sends nothing
(one-way requests, or a handler that answers later through ``ctx.connection.send``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from core.remoting.codec import RemotingCommand
from core.remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE, ResponseCode
from core.remoting.errors import HeaderError

if TYPE_CHECKING:
    from core.remoting.connection import Connection

__all__ = ["Guard", "Handler", "ProcessorTable", "RequestContext"]

log = logging.getLogger(__name__)

Handler = Callable[["RequestContext", RemotingCommand], Awaitable["RemotingCommand | None"]]
# Runs before every handler (the ACL hook, core.acl): returns the context the handler
# sees (possibly carrying the caller's identity) or the refusal to answer instead.
Guard = Callable[
    ["RequestContext", RemotingCommand], Awaitable["RequestContext | RemotingCommand"]
]

# Each (code, exception type) pair gets one full traceback; repeats are counted, so a
# client that keeps sending a request that crashes a handler cannot flood the log.
_MAX_REPORTED = 1024


class RequestContext:
    """Where a request came from: one per connection, shared by all its requests.

    `principal` is who signed the request (set by a guard on a per-request copy made by
    `with_principal`; None without a guard).
    """

    __slots__ = ("connection", "remote_addr", "local_addr", "principal")

    def __init__(self, connection: Connection, remote_addr: str, local_addr: str) -> None:
        self.connection = connection
        self.remote_addr = remote_addr
        self.local_addr = local_addr
        self.principal = None

    def with_principal(self, principal: object) -> RequestContext:
        """A copy of this context for one request of `principal`."""
        ctx = RequestContext(self.connection, self.remote_addr, self.local_addr)
        ctx.principal = principal
        return ctx

    def __repr__(self) -> str:
        return f"<RequestContext {self.remote_addr} -> {self.local_addr}>"


async def _not_supported(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
    # Java's remark text, leading space included (docs/protocol.md §2.2).
    return cmd.make_response(
        ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported"
    )


class ProcessorTable:
    """Maps request codes to handlers.

    ``inline=True`` handlers run in the connection's read loop: no task is spawned and
    the requests of one connection are handled in arrival order, so they must not block
    for long. ``inline=False`` handlers (long-polling pulls, anything that may wait) run in
    their own task in the connection's nursery. In-process invokes always run the handler
    in the caller's task.

    A handler that invokes a request back on ``ctx.connection`` and waits for the answer
    must be non-inline: an inline one blocks the very read loop that would receive it.
    """

    __slots__ = ("_handlers", "_default", "_reported", "guard")

    def __init__(self) -> None:
        self._handlers: dict[int, tuple[Handler, bool]] = {}
        self._default: tuple[Handler, bool] = (_not_supported, True)
        self._reported: dict[tuple[int, type], int] = {}
        #: Checked before every handler, in-process requests included (see `Guard`).
        self.guard: Guard | None = None

    def register(self, code: int, handler: Handler, *, inline: bool = True) -> None:
        """Route requests with `code` to `handler` (replacing any previous one)."""
        self._handlers[int(code)] = (handler, inline)

    def register_default(self, handler: Handler, *, inline: bool = True) -> None:
        """Handler for codes with no registered handler (default: REQUEST_CODE_NOT_SUPPORTED)."""
        self._default = (handler, inline)

    def unregister(self, code: int) -> None:
        self._handlers.pop(int(code), None)

    def lookup(self, code: int) -> tuple[Handler, bool]:
        """(handler, inline) for `code`, falling back to the default handler."""
        return self._handlers.get(code) or self._default

    def __contains__(self, code: int) -> bool:
        return int(code) in self._handlers

    def codes(self) -> list[int]:
        return sorted(self._handlers)

    async def process(
        self, ctx: RequestContext, cmd: RemotingCommand, handler: Handler | None = None
    ) -> RemotingCommand | None:
        """Run the handler for `cmd` and return the response to send, if any.

        Maps HeaderError and any other exception to SYSTEM_ERROR (the server keeps
        running), fixes up opaque/flag/serialization of the response, and returns None
        for one-way requests.
        """
        if handler is None:
            handler = self.lookup(cmd.code)[0]
        try:
            guard = self.guard
            if guard is None:
                response = await handler(ctx, cmd)
            else:
                checked = await guard(ctx, cmd)
                if type(checked) is RemotingCommand:
                    response = checked
                else:
                    response = await handler(checked, cmd)
        except HeaderError as exc:
            response = cmd.make_response(ResponseCode.SYSTEM_ERROR, str(exc))
        except Exception as exc:
            self._report(cmd, exc)
            response = cmd.make_response(
                ResponseCode.SYSTEM_ERROR, str(exc) or type(exc).__name__
            )
        if response is None or cmd.flag & FLAG_ONEWAY:
            return None
        response.opaque = cmd.opaque
        response.flag |= FLAG_RESPONSE
        response.serialize_type = cmd.serialize_type
        return response

    def _report(self, cmd: RemotingCommand, exc: Exception) -> None:
        key = (cmd.code, type(exc))
        seen = self._reported.get(key)
        if seen is None:
            if len(self._reported) < _MAX_REPORTED:
                self._reported[key] = 1
            log.error(
                "handler for request code %s failed (answered SYSTEM_ERROR)",
                cmd.code,
                exc_info=exc,
            )
        else:
            self._reported[key] = seen + 1
            log.debug("handler for request code %s failed again: %r", cmd.code, exc)
