"""`RemotingClient`: invoke requests on remote (or in-process) servers by address.

One connection per address, opened on first use and re-opened lazily after it breaks.
Requests the server sends back on that connection (NOTIFY_CONSUMER_IDS_CHANGED,
CHECK_TRANSACTION_STATE, GET_CONSUMER_RUNNING_INFO ...) go to the `processors` table.

    async with RemotingClient(request_timeout=3.0) as client:
        response = await client.invoke("127.0.0.1:9876", RemotingCommand.request(105, {...}))
"""

from __future__ import annotations

import logging
import socket
import ssl
from dataclasses import replace
from types import TracebackType
from typing import Any

import trio

from core.remoting.codec import RemotingCommand
from core.remoting.connection import (
    DEFAULT_LIMITS,
    Connection,
    ConnectionLimits,
    TcpConnection,
)
from core.remoting.errors import RemotingConnectError
from core.remoting.local import open_local_pair
from core.remoting.processor import ProcessorTable

__all__ = ["RemotingClient", "parse_addr"]

log = logging.getLogger(__name__)


def parse_addr(addr: str) -> tuple[str, int]:
    """Split "host:port" (or "[v6]:port") into (host, port); ValueError if malformed."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bad address {addr!r}, expected host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


class RemotingClient:
    """Client side of the remoting protocol; use as ``async with RemotingClient() as c``.

    The context manager owns a nursery in which every connection runs; leaving it (or
    `close()`) closes them all and fails their pending requests.
    """

    def __init__(
        self,
        *,
        request_timeout: float = 3.0,
        connect_timeout: float | None = None,
        max_frame_size: int | None = None,
        processors: ProcessorTable | None = None,
        limits: ConnectionLimits | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        limits = limits or DEFAULT_LIMITS
        if max_frame_size is not None:
            limits = replace(limits, max_frame_size=max_frame_size)
        self.request_timeout = request_timeout
        self.connect_timeout = request_timeout if connect_timeout is None else connect_timeout
        self.processors = processors if processors is not None else ProcessorTable()
        self.limits = limits
        #: Connect with TLS using this context (`core.remoting.security.client_ssl_context`).
        self.ssl_context = ssl_context
        self._connections: dict[str, Connection] = {}
        self._locks: dict[str, trio.Lock] = {}
        self._local: dict[str, ProcessorTable] = {}
        self._nursery: trio.Nursery | None = None
        self._nursery_manager: Any = None  # trio's NurseryManager while entered
        self._closed = False

    # -- lifetime -------------------------------------------------------------------

    async def __aenter__(self) -> RemotingClient:
        manager = trio.open_nursery()
        self._nursery = await manager.__aenter__()
        self._nursery_manager = manager
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._shutdown()
        manager, self._nursery_manager = self._nursery_manager, None
        return await manager.__aexit__(exc_type, exc, tb)

    async def close(self) -> None:
        """Close every connection; later invokes raise RemotingConnectError."""
        self._shutdown()
        await trio.lowlevel.checkpoint()

    def _shutdown(self) -> None:
        self._closed = True
        for conn in list(self._connections.values()):
            conn.close()
        self._connections.clear()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    # -- in-process servers -----------------------------------------------------------

    def register_local(self, addr: str, table: ProcessorTable) -> None:
        """Serve invokes to `addr` in-process from `table` (no sockets, no encoding)."""
        self._local[addr] = table
        old = self._connections.pop(addr, None)
        if old is not None:
            old.close()

    def unregister_local(self, addr: str) -> None:
        self._local.pop(addr, None)
        old = self._connections.pop(addr, None)
        if old is not None:
            old.close()

    # -- invoking -------------------------------------------------------------------

    async def invoke(
        self, addr: str, cmd: RemotingCommand, timeout: float | None = None
    ) -> RemotingCommand:
        """Send request `cmd` to `addr` and return the response.

        Raises RemotingConnectError (cannot connect, or the connection broke) and
        RemotingTimeoutError (no answer within `timeout`, default `request_timeout`).
        """
        conn = await self.connection(addr)
        return await conn.invoke(cmd, self.request_timeout if timeout is None else timeout)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        """Send `cmd` to `addr` as a one-way request (flag 2); no response."""
        conn = await self.connection(addr)
        await conn.invoke_oneway(cmd)

    async def connection(self, addr: str) -> Connection:
        """The live connection to `addr`, connecting if needed."""
        conn = self._connections.get(addr)
        if conn is not None and not conn.closed:
            return conn
        if self._closed or self._nursery is None:
            raise RemotingConnectError("client is closed or not started (use 'async with')")
        table = self._local.get(addr)
        if table is not None:
            conn = open_local_pair(addr, table, self.processors, self._nursery)
            self._connections[addr] = conn
            return conn
        lock = self._locks.get(addr)
        if lock is None:
            lock = self._locks[addr] = trio.Lock()
        async with lock:
            conn = self._connections.get(addr)
            if conn is not None and not conn.closed:
                return conn
            conn = await self._connect(addr)
            self._connections[addr] = conn
            return conn

    async def _connect(self, addr: str) -> TcpConnection:
        try:
            host, port = parse_addr(addr)
        except ValueError as exc:
            raise RemotingConnectError(str(exc)) from None
        stream: trio.abc.Stream
        try:
            with trio.fail_after(self.connect_timeout):
                tcp = stream = await trio.open_tcp_stream(host, port)
                try:
                    tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    pass
                if self.ssl_context is not None:
                    stream = trio.SSLStream(tcp, self.ssl_context, server_hostname=host)
                    try:
                        await stream.do_handshake()
                    except BaseException:
                        await trio.aclose_forcefully(tcp)
                        raise
        except (OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
            raise RemotingConnectError(f"cannot connect to {addr}: {exc!r}") from None
        if self._closed or self._nursery is None:
            await trio.aclose_forcefully(stream)
            raise RemotingConnectError("client closed while connecting")
        conn = TcpConnection(stream, self.processors, self.limits)
        self._nursery.start_soon(self._run_connection, addr, conn)
        return conn

    async def _run_connection(self, addr: str, conn: TcpConnection) -> None:
        try:
            await conn.run()
        except Exception:
            # Contained: a failing connection must not tear down the client's nursery.
            log.exception("connection to %s failed", addr)
        finally:
            if self._connections.get(addr) is conn:
                del self._connections[addr]
            log.debug("connection to %s ended", addr)
