"""`RemotingServer`: accept TCP (or TLS) peers and serve each with a `TcpConnection`.

One nursery per server (its connections live in it), one per connection (its writer and
non-inline handlers live in that). A malformed frame closes only the connection it came
on; a failing handler answers SYSTEM_ERROR; the server keeps running either way.

The accept loop admits a peer only within the limits of `ListenerLimits` (connections per
port and per source address, and a reserve of file descriptors kept for the store), and
survives descriptor exhaustion (EMFILE) without spinning: see docs/remoting.md.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import resource
import ssl
import time
from dataclasses import dataclass, replace
from typing import Any

import trio

from core.remoting.connection import (
    DEFAULT_LIMITS,
    Connection,
    ConnectionLimits,
    FrameBudget,
    TcpConnection,
)
from core.remoting.processor import Handler, ProcessorTable, RequestContext
from core.remoting.security import check_exposure, server_ssl_context

__all__ = [
    "SERVER_CONNECTION_LIMITS",
    "Connection",
    "ConnectionLimits",
    "Handler",
    "ListenerLimits",
    "ProcessorTable",
    "RemotingServer",
    "RequestContext",
]

log = logging.getLogger(__name__)

#: Per-connection limits of a server by default: the client-side ones plus deadlines.
#: Idle 120 s is Java's serverChannelMaxIdleTimeSeconds; clients heartbeat and brokers
#: register every 30 s, so a live peer is never idle that long. A header is a few KB:
#: 10 s is generous. A body may be 16 MiB: 60 s still allows ~280 KB/s.
SERVER_CONNECTION_LIMITS = replace(
    DEFAULT_LIMITS, idle_timeout_s=120.0, header_timeout_s=10.0, body_timeout_s=60.0
)

# accept() errors that mean "out of descriptors / memory", not "listener broken".
_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# Re-count open descriptors at most this often (listing /proc/self/fd is O(open fds)).
_FD_RECOUNT_S = 1.0
_FD_RECOUNT_NEAR_S = 0.05
# Refusals are logged at most once per this many seconds (a flood must not flood logs).
_REFUSAL_LOG_S = 10.0


@dataclass(frozen=True)
class ListenerLimits:
    """Admission limits of one listening port (enforced at accept, before any read)."""

    #: Open connections on this port; one more is closed at once.
    max_connections: int = 10_000
    #: Open connections from one source address on this port.
    max_connections_per_address: int = 1_000
    #: File descriptors kept free for the rest of the process (store files, RocksDB,
    #: flushes): no connection is accepted once open descriptors reach RLIMIT_NOFILE minus
    #: this (capped at a quarter of the limit so a small limit still admits peers).
    fd_reserve: int = 1_024
    #: Bytes of partly received frames buffered for all connections of this port
    #: together; a peer whose partial frame grows past it is closed. 512 MiB leaves room
    #: for 128 concurrent 4 MiB batch sends (each connection also stops at one frame).
    max_pending_frame_bytes: int = 512 * 1024 * 1024


class _FdBudget:
    """Process-wide estimate of open descriptors against RLIMIT_NOFILE - reserve."""

    def __init__(self) -> None:
        self._counted_at = -float("inf")
        self._count = 0
        self._since = 0  # connections admitted minus closed since the last count
        self._spare: int | None = None

    def _recount(self, now: float, soft: int) -> None:
        try:
            self._count = len(os.listdir("/proc/self/fd"))
        except OSError as exc:
            if exc.errno in _CAPACITY_ERRNOS:
                self._count = soft  # could not even open the directory: no room
            # else no /proc: keep counting what we accepted
        self._counted_at = now
        self._since = 0

    def has_room(self, reserve: int) -> bool:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            return True
        reserve = min(reserve, soft // 4)
        line = soft - reserve
        now = time.monotonic()
        # Other descriptors open and close without us knowing: count exactly every
        # second, and every 50 ms once the estimate comes near the line.
        near = self._count + self._since >= line - reserve
        if now - self._counted_at >= (_FD_RECOUNT_NEAR_S if near else _FD_RECOUNT_S):
            self._recount(now, soft)
        if self._count + self._since >= line:
            return False
        self._since += 1
        return True

    def release(self) -> None:
        """An admitted connection closed: its descriptor is free again."""
        self._since -= 1

    def keep_spare(self) -> None:
        """Hold one descriptor to give up when accept() fails with EMFILE."""
        if self._spare is None:
            try:
                self._spare = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self._spare = None

    async def shed_one(self, listener: trio.SocketListener) -> bool:
        """Out of descriptors: free the spare, accept one pending peer and close it at
        once (so the backlog does not make accept() fail again and again), take the spare
        back. Returns False when nothing could be shed (the caller then waits)."""
        if self._spare is None:
            return False
        os.close(self._spare)
        self._spare = None
        shed = False
        try:
            with trio.move_on_after(0.05):
                sock, _ = await listener.socket.accept()
                sock.close()
                shed = True
        except OSError:
            pass
        self.keep_spare()
        return shed and self._spare is not None


_fd_budget = _FdBudget()


class RemotingServer:
    """Serve `table` on host:port. Start with ``port = await nursery.start(server.serve)``.

    `port` holds the bound port once started (useful with port=0); `connections` is the
    set of live connections; `refused` counts peers turned away, by reason. `close()`
    stops the server and drops every connection.
    """

    def __init__(
        self,
        table: ProcessorTable,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_frame_size: int | None = None,
        limits: ConnectionLimits | None = None,
        listener_limits: ListenerLimits | None = None,
        backlog: int | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        limits = limits or SERVER_CONNECTION_LIMITS
        if max_frame_size is not None:
            limits = replace(limits, max_frame_size=max_frame_size)
        self.table = table
        self.host = host
        self.port = port
        self.limits = limits
        self.listener_limits = listener_limits or ListenerLimits()
        self.ssl_context = ssl_context
        self.connections: set[TcpConnection] = set()
        self.frame_budget = FrameBudget(self.listener_limits.max_pending_frame_bytes)
        self.refused: collections.Counter[str] = collections.Counter()
        self._per_address: collections.Counter[str] = collections.Counter()
        self._open = 0
        self._refusal_logged_at = -float("inf")
        self._backlog = backlog
        self._listeners: list[trio.SocketListener] | None = None
        self._cancel_scope: trio.CancelScope | None = None
        self._closing = False

    @classmethod
    def from_config(cls, table: ProcessorTable, config: Any, role: str) -> RemotingServer:
        """A server for a BrokerConfig / NamesrvConfig: host, port, frame size, limits,
        TLS (tls_certfile + tls_keyfile). Refuses (ValueError) a non-loopback host while
        ACL is off unless `allow_unauthenticated_remote` is set (then logs a warning)."""
        check_exposure(
            config.host,
            acl_enable=getattr(config, "acl_enable", False),
            allow_unauthenticated=getattr(config, "allow_unauthenticated_remote", False),
            what=f"the {role} port",
        )
        base = SERVER_CONNECTION_LIMITS
        limits = replace(
            base,
            max_frame_size=getattr(config, "max_frame_size", base.max_frame_size),
            idle_timeout_s=getattr(config, "idle_timeout_s", base.idle_timeout_s),
            header_timeout_s=getattr(config, "frame_header_timeout_s", base.header_timeout_s),
            body_timeout_s=getattr(config, "frame_body_timeout_s", base.body_timeout_s),
        )
        defaults = ListenerLimits()
        listener_limits = ListenerLimits(
            max_connections=getattr(config, "max_connections", defaults.max_connections),
            max_connections_per_address=getattr(
                config, "max_connections_per_address", defaults.max_connections_per_address
            ),
            fd_reserve=getattr(config, "fd_reserve", defaults.fd_reserve),
            max_pending_frame_bytes=getattr(
                config, "max_pending_frame_bytes", defaults.max_pending_frame_bytes
            ),
        )
        certfile = getattr(config, "tls_certfile", None)
        keyfile = getattr(config, "tls_keyfile", None)
        if bool(certfile) != bool(keyfile):
            raise ValueError("TLS needs both tls_certfile and tls_keyfile")
        ctx = server_ssl_context(certfile, keyfile) if certfile else None
        return cls(
            table, config.host, config.port, limits=limits,
            listener_limits=listener_limits, ssl_context=ctx,
        )

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
        _fd_budget.keep_spare()
        listeners, self._listeners = self._listeners, None
        async with trio.open_nursery() as nursery:
            self._cancel_scope = nursery.cancel_scope
            if self._closing:
                nursery.cancel_scope.cancel()
            log.info(
                "remoting server listening on %s:%d%s",
                self.host, self.port, " (TLS)" if self.ssl_context else "",
            )
            for listener in listeners:
                nursery.start_soon(self._accept_loop, listener, nursery)
            task_status.started(self.port)

    async def _accept_loop(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        try:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _CAPACITY_ERRNOS:
                        raise
                    self._refuse_log("accept failed: " + os.strerror(exc.errno), "accept_error")
                    if not await _fd_budget.shed_one(listener):
                        await trio.sleep(0.1)  # nothing to shed: wait, do not spin
                    continue
                addr = _peer_host(stream)
                reason = self._admission(addr)
                if reason is not None:
                    self._refuse_log(reason, reason)
                    await trio.aclose_forcefully(stream)
                    continue
                self._open += 1
                self._per_address[addr] += 1
                nursery.start_soon(self._handle, stream, addr)
        finally:
            await trio.aclose_forcefully(listener)

    def _admission(self, addr: str) -> str | None:
        limits = self.listener_limits
        if self._open >= limits.max_connections:
            return "max_connections"
        if self._per_address[addr] >= limits.max_connections_per_address:
            return "max_connections_per_address"
        if not _fd_budget.has_room(limits.fd_reserve):
            return "fd_reserve"
        return None

    def _refuse_log(self, message: str, reason: str) -> None:
        self.refused[reason] += 1
        now = trio.current_time()
        if now - self._refusal_logged_at >= _REFUSAL_LOG_S:
            self._refusal_logged_at = now
            log.warning(
                "remoting %s:%d refusing connections (%s); refused so far: %s",
                self.host, self.port, message, dict(self.refused),
            )

    async def _handle(self, stream: trio.SocketStream, addr: str) -> None:
        try:
            conn_stream: trio.abc.Stream = stream
            if self.ssl_context is not None:
                conn_stream = await self._tls_handshake(stream)
                if conn_stream is None:
                    return
            conn = TcpConnection(conn_stream, self.table, self.limits, self.frame_budget)
            self.connections.add(conn)
            # First close callback: the set is up to date when the upper layers' run.
            conn.add_close_callback(lambda: self.connections.discard(conn))
            try:
                await conn.run()
            except Exception:
                # A bug in one connection must not take the server down.
                log.exception("connection %s failed", conn.remote_addr)
            finally:
                self.connections.discard(conn)
        finally:
            _fd_budget.release()
            self._open -= 1
            left = self._per_address[addr] - 1
            if left:
                self._per_address[addr] = left
            else:
                del self._per_address[addr]

    async def _tls_handshake(self, stream: trio.SocketStream) -> trio.SSLStream | None:
        tls = trio.SSLStream(stream, self.ssl_context, server_side=True)
        timeout = self.limits.header_timeout_s
        with trio.move_on_after(10.0 if timeout is None else timeout):
            try:
                await tls.do_handshake()
                return tls
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                log.debug("TLS handshake with %s failed: %r", _peer_host(stream), exc)
        await trio.aclose_forcefully(stream)
        return None

    def close(self) -> None:
        """Stop listening and close every connection (their close callbacks run)."""
        self._closing = True
        if self._cancel_scope is not None:
            self._cancel_scope.cancel()


def _peer_host(stream: trio.SocketStream) -> str:
    try:
        return str(stream.socket.getpeername()[0])
    except (OSError, IndexError, TypeError):
        return "?"

