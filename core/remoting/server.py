"""`RemotingServer`: accept TCP peers and serve each with a `TcpConnection`.

One nursery per server (its connections live in it), one per connection (its writer and
non-inline handlers live in that). A malformed frame closes only the connection it came
on; a failing handler answers SYSTEM_ERROR; the server keeps running either way.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import replace

import trio

from core.remoting.connection import (
    DEFAULT_LIMITS,
    Connection,
    ConnectionLimits,
    TcpConnection,
)
from core.remoting.processor import Handler, ProcessorTable, RequestContext

__all__ = [
    "Connection",
    "ConnectionLimits",
    "Handler",
    "ProcessorTable",
    "RemotingServer",
    "RequestContext",
]

log = logging.getLogger(__name__)


class RemotingServer:
    """Serve `table` on host:port. Start with ``port = await nursery.start(server.serve)``.

    `port` holds the bound port once started (useful with port=0); `connections` is the
    set of live connections. `close()` stops the server and drops every connection.
    """

    def __init__(
        self,
        table: ProcessorTable,
        host: str = "0.0.0.0",
        port: int = 0,
        *,
        max_frame_size: int | None = None,
        limits: ConnectionLimits | None = None,
        backlog: int | None = None,
    ) -> None:
        limits = limits or DEFAULT_LIMITS
        if max_frame_size is not None:
            limits = replace(limits, max_frame_size=max_frame_size)
        self.table = table
        self.host = host
        self.port = port
        self.limits = limits
        self.connections: set[TcpConnection] = set()
        self._backlog = backlog
        self._listeners: list[trio.SocketListener] | None = None
        self._cancel_scope: trio.CancelScope | None = None
        self._closing = False

    async def listen(self) -> int:
        """Bind the listening socket now (serve() does it if needed); returns the port.

        Binding outside any nursery lets a taken port surface as a plain OSError.
        """
        if self._listeners is None:
            self._listeners = await trio.open_tcp_listeners(
                self.port, host=self.host, backlog=self._backlog
            )
            self.port = self._listeners[0].socket.getsockname()[1]
        return self.port

    async def serve(self, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen and serve until cancelled or `close()`; reports the bound port."""
        await self.listen()
        listeners, self._listeners = self._listeners, None
        async with trio.open_nursery() as nursery:
            self._cancel_scope = nursery.cancel_scope
            if self._closing:
                nursery.cancel_scope.cancel()
            log.info("remoting server listening on %s:%d", self.host, self.port)
            nursery.start_soon(self._serve_listeners, listeners, nursery)
            task_status.started(self.port)

    async def _serve_listeners(
        self, listeners: list[trio.SocketListener], nursery: trio.Nursery
    ) -> None:
        try:
            await trio.serve_listeners(self._handle, listeners, handler_nursery=nursery)
        finally:
            for listener in listeners:
                await trio.aclose_forcefully(listener)

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        conn = TcpConnection(stream, self.table, self.limits)
        self.connections.add(conn)
        # First close callback: the set is up to date when the upper layers' callbacks run.
        conn.add_close_callback(lambda: self.connections.discard(conn))
        try:
            await conn.run()
        except Exception:
            # A bug in one connection must not take the server down.
            log.exception("connection %s failed", conn.remote_addr)
        finally:
            self.connections.discard(conn)

    def close(self) -> None:
        """Stop listening and close every connection (their close callbacks run)."""
        self._closing = True
        if self._cancel_scope is not None:
            self._cancel_scope.cancel()
