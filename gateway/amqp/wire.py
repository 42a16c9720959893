"""Socket writes and reads of one AMQP connection without a scheduler round trip when the
kernel can take or give the octets at once (docs/amqp.md, "Performance").

trio's `SocketStream.send_all` yields to the scheduler after every successful send, and
`receive_some` tries a `recv` that usually fails with EAGAIN before it waits. With a pika
client that waits for each confirm, a message crosses the gateway's sockets four times
(publish, confirm, deliver, ack), so those yields and failed calls were a visible part of
its CPU per message. Here, on a plain TCP socket:

* `flush` writes straight to the (non-blocking) socket; only what the kernel did not
  take goes through `send_all` (which waits until the socket is writable). Writers
  queue behind the one waiting there, so octets never interleave.
* `receive` waits for readability first when the previous read did not fill the buffer
  (the socket is then most likely drained), and reads at once otherwise; after a read that
  did not wait it yields once, so a client that keeps the socket full cannot starve the
  other tasks.

TLS streams (and anything else that is not a `trio.SocketStream`) use the stream's own
calls.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any

import trio

__all__ = ["Wire"]


class Wire:
    """One connection's socket: `flush()` writes what `take()` returns; `receive()` reads."""

    def __init__(self, stream: trio.abc.Stream, take: Callable[[], bytes],
                 read_size: int, meter: Any) -> None:
        self.stream = stream
        self._take = take
        self._read_size = read_size
        # Only a plain TCP stream has a socket whose descriptor we may use directly.
        self._sock = stream.socket if type(stream) is trio.SocketStream else None
        self._lock = trio.Lock()
        self._drained = True  # the last read took less than read_size
        self._meter = meter  # its `bytes_out` counts the octets written

    @property
    def drained(self) -> bool:
        """The last read took less than a buffer's worth (nothing more was waiting), and
        no writer waits for the socket to take more."""
        return self._drained and not self._lock.locked()

    async def flush(self) -> None:
        """Write everything queued so far."""
        out = self._take()
        if not out:
            return
        self._meter.bytes_out += len(out)
        sock = self._sock
        if sock is not None and not self._lock.locked():
            fd = sock.fileno()  # -1 once closed: never write to a descriptor reused since
            if fd < 0:
                raise trio.ClosedResourceError("socket was already closed")
            try:
                sent = os.write(fd, out)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                if exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                    raise trio.BrokenResourceError(str(exc)) from exc
                raise
            if sent == len(out):
                return
            out = memoryview(out)[sent:]
        async with self._lock:
            await self.stream.send_all(out)

    async def receive(self) -> bytes:
        """The next octets (b"" at end of stream); cancellable while it waits."""
        sock = self._sock
        if sock is None:
            data = await self.stream.receive_some(self._read_size)
            self._drained = len(data) < self._read_size
            return data
        fd = sock.fileno()  # -1 once closed; a close while we wait wakes us with an error
        if fd < 0:
            raise trio.ClosedResourceError("socket was already closed")
        if self._drained:
            await trio.lowlevel.wait_readable(fd)
        else:
            await trio.lowlevel.checkpoint()
            fd = sock.fileno()  # closed meanwhile (no waiter then): never read a reused one
            if fd < 0:
                raise trio.ClosedResourceError("socket was already closed")
        while True:
            try:
                data = os.read(fd, self._read_size)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(fd)
                continue
            except OSError as exc:
                if exc.errno in (errno.ECONNRESET, errno.ENOTCONN, errno.ETIMEDOUT):
                    raise trio.BrokenResourceError(str(exc)) from exc
                raise
            self._drained = len(data) < self._read_size
            return data
