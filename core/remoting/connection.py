"""Connections: one per peer, carrying requests and responses in both directions.

`Connection` holds what every transport shares (identity, close callbacks, matching of
responses to pending requests by opaque); `TcpConnection` runs the frame codec over a
trio stream; `LocalConnection` (core.remoting.local) hands command objects straight over.
The broker uses a connection object as the identity of a client "channel".
"""

from __future__ import annotations

import itertools
import logging
import math
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from core.remoting.codec import (
    DEFAULT_MAX_FRAME_SIZE,
    FrameDecoder,
    RemotingCommand,
    encode_command,
)
from core.remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE, ResponseCode
from core.remoting.errors import (
    FrameError,
    RemotingConnectError,
    RemotingTimeoutError,
)
from core.remoting.processor import Handler, ProcessorTable, RequestContext

__all__ = ["Connection", "ConnectionLimits", "FrameBudget", "TcpConnection", "format_addr"]

log = logging.getLogger(__name__)

_connection_ids = itertools.count(1)

# Writes below this size are joined into one buffer (one copy of small data beats an
# iovec per part); larger batches go out with one gathered sendmsg, uncopied.
_COALESCE_BYTES = 64 * 1024
# Stop collecting queued frames into one write past this many bytes.
_WRITE_BATCH_BYTES = 1024 * 1024
# Linux IOV_MAX.
_IOV_MAX = 1024
_OPAQUE_MASK = 0x7FFFFFFF
_HAVE_SENDMSG = hasattr(socket.socket, "sendmsg")


@dataclass(frozen=True)
class ConnectionLimits:
    """Per-connection limits; all enforced without disturbing other connections."""

    #: Largest accepted frame; a bigger one closes the connection (Java's frameMaxLength).
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    #: A peer that lets this many bytes of our frames pile up unread is disconnected.
    max_outbound_bytes: int = 64 * 1024 * 1024
    #: ... or this many frames.
    max_outbound_frames: int = 10_000
    #: Non-inline requests running at once on one connection; more get SYSTEM_BUSY.
    max_concurrent_requests: int = 10_000
    #: Bytes asked of the socket per read (trio's default receive size).
    receive_size: int = 64 * 1024
    #: Close a connection that has neither received nor sent anything, and has no request
    #: in progress, for this long (None = never; servers set it, clients do not).
    idle_timeout_s: float | None = None
    #: Seconds from a frame's first byte until its length prefix and header are in.
    header_timeout_s: float | None = None
    #: Seconds from the end of a frame's header until its last body byte.
    body_timeout_s: float | None = None
    #: Closing after a protocol error or a limit: seconds to flush our last frames and
    #: drain the peer's input, so it reads them instead of a connection reset.
    linger_s: float = 1.0


DEFAULT_LIMITS = ConnectionLimits()


class FrameBudget:
    """Bytes of partly received frames that all connections of a server may buffer
    together. A connection whose partial frame grows while the total is over `cap` is
    closed: without it, 1,000 peers each half-sending a 16 MiB frame hold 16 GB until
    their deadlines pass."""

    __slots__ = ("cap", "used")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.used = 0


def format_addr(sockaddr: Any) -> str:
    """'ip:port' for an IPv4 socket address, '[ip]:port' for IPv6."""
    if isinstance(sockaddr, tuple) and len(sockaddr) >= 2:
        host, port = sockaddr[0], sockaddr[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(sockaddr)


class _Pending:
    __slots__ = ("event", "response", "error")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.response: RemotingCommand | None = None
        self.error: Exception | None = None


class Connection:
    """One peer. Subclasses provide `send`, `close` and the way frames travel.

    Attributes: `id` (process-unique int), `remote_addr` / `local_addr` ("ip:port"),
    `closed`, `context` (the RequestContext handed to handlers for requests from this
    peer) and `attributes`, a free dict for upper layers (client id, groups ...).
    """

    def __init__(self, remote_addr: str, local_addr: str) -> None:
        self.id = next(_connection_ids)
        self.remote_addr = remote_addr
        self.local_addr = local_addr
        self.closed = False
        self.context = RequestContext(self, remote_addr, local_addr)
        self.attributes: dict[str, Any] = {}
        self._pending: dict[int, _Pending] = {}
        self._next_opaque = 0
        self._close_callbacks: list[Callable[[], Any]] = []
        self._finished = False

    # -- interface ------------------------------------------------------------------

    async def send(self, cmd: RemotingCommand) -> None:
        """Queue `cmd` for the peer, in order. Raises RemotingConnectError when closed."""
        raise NotImplementedError

    def close(self) -> None:
        """Close the connection; pending invokes fail and close callbacks run."""
        raise NotImplementedError

    async def invoke(self, cmd: RemotingCommand, timeout: float | None = None) -> RemotingCommand:
        """Send request `cmd` and wait for its response.

        Assigns ``cmd.opaque`` (so do not share one command object between concurrent
        invokes). Raises RemotingTimeoutError after `timeout` seconds (None = no limit)
        and RemotingConnectError if the connection is or becomes closed.
        """
        if self.closed:
            raise RemotingConnectError(f"connection to {self.remote_addr} is closed")
        opaque, pending = self._register_pending(cmd)
        try:
            await self.send(cmd)
            with trio.move_on_after(math.inf if timeout is None else timeout):
                await pending.event.wait()
            return self._pending_result(pending, timeout)
        finally:
            self._pending.pop(opaque, None)

    async def invoke_oneway(self, cmd: RemotingCommand) -> None:
        """Send request `cmd` with the one-way bit (flag 2) set; no response is expected."""
        cmd.opaque = self._alloc_opaque()
        cmd.flag = (cmd.flag & ~FLAG_RESPONSE) | FLAG_ONEWAY
        await self.send(cmd)

    def add_close_callback(self, fn: Callable[[], Any]) -> None:
        """Call `fn()` once when the connection ends (at once if it already has)."""
        if self._finished:
            self._run_callback(fn)
        else:
            self._close_callbacks.append(fn)

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<{type(self).__name__} #{self.id} {self.remote_addr} {state}>"

    # -- shared machinery -----------------------------------------------------------

    def _alloc_opaque(self) -> int:
        opaque = self._next_opaque
        self._next_opaque = (opaque + 1) & _OPAQUE_MASK
        return opaque

    def _register_pending(self, cmd: RemotingCommand) -> tuple[int, _Pending]:
        opaque = self._alloc_opaque()
        while opaque in self._pending:  # only after 2**31 requests with one still open
            opaque = self._alloc_opaque()
        cmd.opaque = opaque
        cmd.flag &= ~(FLAG_RESPONSE | FLAG_ONEWAY)
        pending = _Pending()
        self._pending[opaque] = pending
        return opaque, pending

    def _pending_result(self, pending: _Pending, timeout: float | None) -> RemotingCommand:
        if pending.response is not None:
            return pending.response
        if pending.error is not None:
            raise pending.error
        raise RemotingTimeoutError(
            f"no response from {self.remote_addr} within {timeout} s"
        )

    def _on_response(self, cmd: RemotingCommand) -> None:
        # Unknown opaques (the requester timed out) are dropped, as Java and C++ do.
        pending = self._pending.pop(cmd.opaque, None)
        if pending is not None:
            pending.response = cmd
            pending.event.set()

    def _finish(self) -> None:
        """Mark closed, fail pending invokes, run close callbacks (once)."""
        self.closed = True
        if self._finished:
            return
        self._finished = True
        if self._pending:
            error = RemotingConnectError(f"connection to {self.remote_addr} closed")
            for pending in self._pending.values():
                pending.error = error
                pending.event.set()
            self._pending.clear()
        callbacks, self._close_callbacks = self._close_callbacks, []
        for fn in callbacks:
            self._run_callback(fn)

    def _run_callback(self, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception:
            log.exception("close callback of %r failed", self)


class TcpConnection(Connection):
    """A connection over a trio stream: a read loop dispatching frames, one writer task.

    `run()` owns the connection's nursery: the writer, and every non-inline handler task,
    end with it. Outbound frames are encoded by the sender and queued; a peer that lets
    the queue exceed the limits is disconnected instead of stalling anyone.
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        table: ProcessorTable,
        limits: ConnectionLimits = DEFAULT_LIMITS,
        budget: FrameBudget | None = None,
    ) -> None:
        # A TLS stream wraps the socket stream: addresses come from the socket below it,
        # and gathered sendmsg writes are for plain sockets only.
        raw = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
        sock = raw.socket
        self._sendmsg_ok = _HAVE_SENDMSG and raw is stream
        self.tls = raw is not stream
        try:
            remote = format_addr(sock.getpeername())
            local = format_addr(sock.getsockname())
        except OSError:
            remote = local = "?:0"
        super().__init__(remote, local)
        self._stream = stream
        self._table = table
        self._limits = limits
        self._send_ch, self._recv_ch = trio.open_memory_channel[tuple[list, int]](math.inf)
        self._queued_bytes = 0
        self._queued_frames = 0
        self._drained: trio.Event | None = None  # set when the queue falls below half
        self._inflight = 0
        self._cancel_scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        #: trio time of the last byte read or frame written (drives idle_timeout_s).
        self.last_active = 0.0
        self._budget = budget
        self._charged = 0  # bytes of this connection counted in the budget
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass  # not a TCP socket (tests may hand a socketpair)

    # -- public ---------------------------------------------------------------------

    async def send(self, cmd: RemotingCommand) -> None:
        """Queue `cmd`, waiting while the outbound queue is over its limits.

        Requests this side originates (invoke, invoke_oneway) get backpressure: a fast
        one-way producer slows down to what the peer reads instead of being cut off.
        `send_nowait` (responses, pushed replies) keeps the slow-reader cut-off, which
        protects a server from a client that stops reading."""
        limits = self._limits
        while (
            not self.closed
            and self._queued_frames
            and (
                self._queued_bytes >= limits.max_outbound_bytes // 2
                or self._queued_frames >= limits.max_outbound_frames // 2
            )
        ):
            if self._drained is None:
                self._drained = trio.Event()
            await self._drained.wait()
        self.send_nowait(cmd)

    def send_nowait(self, cmd: RemotingCommand) -> None:
        """Encode `cmd` and queue it; never blocks. Raises RemotingConnectError."""
        if self.closed:
            raise RemotingConnectError(f"connection to {self.remote_addr} is closed")
        parts = encode_command(cmd)
        size = len(parts[0]) if len(parts) == 1 else sum(map(len, parts))
        limits = self._limits
        if (
            self._queued_bytes + size > limits.max_outbound_bytes
            or self._queued_frames >= limits.max_outbound_frames
        ) and self._queued_frames:
            log.warning(
                "closing %s: peer is not reading (%d frames, %d bytes queued)",
                self.remote_addr,
                self._queued_frames,
                self._queued_bytes,
            )
            self.close()
            raise RemotingConnectError(f"connection to {self.remote_addr}: peer too slow")
        self._queued_bytes += size
        self._queued_frames += 1
        self._send_ch.send_nowait((parts, size))

    def close(self) -> None:
        self.closed = True
        if self._cancel_scope is not None:
            self._cancel_scope.cancel()

    async def run(self) -> None:
        """Serve the connection until the peer leaves, a frame is malformed or close()."""
        try:
            if not self.closed:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    self._cancel_scope = nursery.cancel_scope
                    if self.closed:  # close() raced with start-up
                        nursery.cancel_scope.cancel()
                    nursery.start_soon(self._write_loop)
                    linger = await self._read_loop()
                    self._release_budget()  # the partial frame is dropped from here on
                    if linger and not self.closed:
                        await self._linger()
                    nursery.cancel_scope.cancel()
        finally:
            self._release_budget()
            self._finish()
            self._send_ch.close()
            await trio.aclose_forcefully(self._stream)

    def _release_budget(self) -> None:
        if self._budget is not None:
            self._budget.used -= self._charged
            self._charged = 0

    # -- reading --------------------------------------------------------------------

    async def _read_loop(self) -> bool:
        """Read and dispatch frames. Returns True when this side ends the connection
        (malformed frame, deadline), False when the peer left or the socket failed."""
        decoder = FrameDecoder(self._limits.max_frame_size)
        stream = self._stream
        size = self._limits.receive_size
        limits = self._limits
        timed = not (
            limits.idle_timeout_s is None
            and limits.header_timeout_s is None
            and limits.body_timeout_s is None
        )
        self.last_active = trio.current_time()
        # When the buffered partial frame, and its body, began (None: not yet).
        frame_start: float | None = None
        body_start: float | None = None
        deadline = math.inf
        while True:
            if timed:
                deadline = self._read_deadline(decoder, frame_start, body_start)
            with trio.move_on_at(deadline) as timer:
                try:
                    data = await stream.receive_some(size)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    return False
            if timer.cancelled_caught:
                if self._read_deadline(decoder, frame_start, body_start) <= trio.current_time():
                    log.debug("closing %s: %s", self.remote_addr, self._timeout_reason(decoder))
                    return True
                continue  # a write or a finished request moved the idle deadline on
            if not data:
                return False
            had_partial = decoder.buffered
            try:
                commands = decoder.feed(data)
            except FrameError as exc:
                log.warning("closing %s: malformed frame: %s", self.remote_addr, exc)
                return True
            if timed:
                now = self.last_active = trio.current_time()
                if decoder.buffered:
                    if commands or not had_partial:
                        frame_start, body_start = now, None
                    if body_start is None and decoder.header_complete:
                        body_start = now
            if not await self._dispatch(commands):
                return False
            if decoder.error is not None:
                # Valid frames before a malformed one are answered, then the stream ends.
                log.warning("closing %s: malformed frame: %s", self.remote_addr, decoder.error)
                return True
            budget = self._budget
            if budget is not None:
                held = decoder.buffered
                budget.used += held - self._charged
                grew = held > self._charged
                self._charged = held
                if grew and budget.used > budget.cap:
                    log.debug("closing %s: partial frames of all peers over %d bytes",
                              self.remote_addr, budget.cap)
                    return True

    async def _linger(self) -> None:
        """Close after a protocol error or a limit: let queued answers go out, shut down
        writing, then read and drop what the peer still sends for a moment, so it reads
        our last frames instead of a reset (a close with unread input sends RST)."""
        with trio.move_on_after(self._limits.linger_s):
            while self._queued_frames and not self.closed:
                if self._drained is None:
                    self._drained = trio.Event()
                await self._drained.wait()
            try:
                if self.tls:
                    return  # aclose() sends close_notify; no half-close under TLS
                self._stream.socket.shutdown(socket.SHUT_WR)
                while await self._stream.receive_some(self._limits.receive_size):
                    pass
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass

    def _read_deadline(
        self, decoder: FrameDecoder, frame_start: float | None, body_start: float | None
    ) -> float:
        limits = self._limits
        if decoder.buffered and frame_start is not None:
            if body_start is not None:
                t = limits.body_timeout_s
                return math.inf if t is None else body_start + t
            t = limits.header_timeout_s
            return math.inf if t is None else frame_start + t
        t = limits.idle_timeout_s
        if t is None:
            return math.inf
        if self._inflight:  # a request in progress (a held pull) is not idleness
            return trio.current_time() + t
        return self.last_active + t

    def _timeout_reason(self, decoder: FrameDecoder) -> str:
        if not decoder.buffered:
            return f"idle for {self._limits.idle_timeout_s} s"
        if decoder.header_complete:
            return f"frame body not received within {self._limits.body_timeout_s} s"
        return f"frame header not received within {self._limits.header_timeout_s} s"

    async def _dispatch(self, commands: list[RemotingCommand]) -> bool:
        """Hand decoded frames to their handlers; False when the connection must end."""
        table = self._table
        ctx = self.context
        for cmd in commands:
            if cmd.flag & FLAG_RESPONSE:
                self._on_response(cmd)
                continue
            handler, inline = table.lookup(cmd.code)
            if inline:
                response = await table.process(ctx, cmd, handler)
                if response is not None and not self._reply(response):
                    return False
            elif self._inflight >= self._limits.max_concurrent_requests:
                busy = cmd.make_response(
                    ResponseCode.SYSTEM_BUSY,
                    "too many requests in flight on this connection",
                )
                if not cmd.is_oneway and not self._reply(busy):
                    return False
            else:
                self._inflight += 1
                self._nursery.start_soon(self._run_handler, handler, cmd)
        return True

    async def _run_handler(self, handler: Handler, cmd: RemotingCommand) -> None:
        try:
            response = await self._table.process(self.context, cmd, handler)
            if response is not None:
                self._reply(response)
        finally:
            self._inflight -= 1

    def _reply(self, response: RemotingCommand) -> bool:
        try:
            self.send_nowait(response)
        except RemotingConnectError:
            return False
        except ValueError as exc:  # unencodable response (header > 16 MiB, bad field)
            log.error("cannot encode response to %s: %s", self.remote_addr, exc)
            return True
        return True

    # -- writing --------------------------------------------------------------------

    async def _write_loop(self) -> None:
        recv = self._recv_ch
        try:
            async for parts, size in recv:
                batch = list(parts)
                nbytes = size
                frames = 1
                while nbytes < _WRITE_BATCH_BYTES:
                    try:
                        parts, size = recv.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                    batch.extend(parts)
                    nbytes += size
                    frames += 1
                await self._write(batch, nbytes)
                self.last_active = trio.current_time()
                self._queued_bytes -= nbytes
                self._queued_frames -= frames
                if self._drained is not None:
                    self._drained.set()
                    self._drained = None
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.debug("write to %s failed: %r", self.remote_addr, exc)
            self.close()
        finally:
            if self._drained is not None:  # wake senders so they see the closed flag
                self._drained.set()
                self._drained = None

    async def _write(self, parts: list, nbytes: int) -> None:
        if len(parts) == 1:
            await self._stream.send_all(parts[0])
        elif nbytes <= _COALESCE_BYTES:
            await self._stream.send_all(b"".join(parts))
        elif self._sendmsg_ok:
            await _sendmsg_all(self._stream.socket, [p for p in parts if len(p)])
        else:  # TLS (it copies into records anyway), or no sendmsg
            for part in parts:
                if len(part):
                    await self._stream.send_all(part)


async def _sendmsg_all(sock: trio.socket.SocketType, parts: list) -> None:
    """Write all `parts` with gathered sends, resuming after partial writes."""
    i = 0
    n = len(parts)
    while i < n:
        sent = await sock.sendmsg(parts[i : i + _IOV_MAX])
        while sent and i < n:
            length = len(parts[i])
            if sent >= length:
                sent -= length
                i += 1
            else:
                parts[i] = memoryview(parts[i])[sent:]
                sent = 0
