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

`write_now` is `flush` without awaiting, for a delivery made at a message's arrival by
another task (docs/amqp.md "Delivery at arrival"): callers ask `can_write_now` first.
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
        self._unsent = b""  # what `write_now` could not write: the next flush's first

    @property
    def drained(self) -> bool:
        """The last read took less than a buffer's worth (nothing more was waiting), and
        no writer waits for the socket to take more."""
        return self._drained and not self._lock.locked()

    async def flush(self) -> None:
        """Write everything queued so far."""
        out = self._take()
        if out:
            self._meter.bytes_out += len(out)
            if self._unsent:  # left by write_now (counted then): before what came since
                out, self._unsent = self._unsent + out, b""
        elif self._unsent:
            out, self._unsent = self._unsent, b""
        else:
            return
        sock = self._sock
        if sock is not None and not self._lock.locked():
            sent = self._write(sock, out)
            if sent == len(out):
                return
            out = memoryview(out)[sent:]
        async with self._lock:
            await self.stream.send_all(out)

    @staticmethod
    def _write(sock, out: bytes) -> int:
        """os.write to the socket: how much the kernel took (0 when it would block)."""
        fd = sock.fileno()  # -1 once closed: never write to a descriptor reused since
        if fd < 0:
            raise trio.ClosedResourceError("socket was already closed")
        try:
            return os.write(fd, out)
        except BlockingIOError:
            return 0
        except OSError as exc:
            if exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                raise trio.BrokenResourceError(str(exc)) from exc
            raise

    def can_write_now(self) -> bool:
        """`write_now` may be tried: a plain TCP socket, no writer waiting for it, nothing
        left over from an earlier `write_now`."""
        return self._sock is not None and not self._unsent and not self._lock.locked()

    def write_now(self) -> bool:
        """Write everything queued so far without awaiting (after `can_write_now`): True
        when the kernel took it all; False when it took part of it (the rest is kept for
        the next `flush`, which the caller must start). Raises as `flush` does."""
        out = self._take()
        if not out:
            return True
        self._meter.bytes_out += len(out)
        sent = self._write(self._sock, out)
        if sent == len(out):
            return True
        self._unsent = out[sent:]
        return False

    async def receive(self) -> bytes:
        """The next octets (b"" at end of stream); cancellable while it waits."""
        sock = self._sock
        if sock is None:
            data = await self.stream.receive_some(self._read_size)
            self._drained = len(data) < self._read_size
            return data
        if self._drained:
            await trio.lowlevel.wait_readable(sock)
        else:
            await trio.lowlevel.checkpoint()
        while True:
            # After every wait: another task (the deadlines task, a close) may have closed
            # the socket between our wake-up and now, and its descriptor may be reused.
            fd = sock.fileno()
            if fd < 0:
                raise trio.ClosedResourceError("socket was already closed")
            try:
                data = os.read(fd, self._read_size)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(sock)
                continue
            except OSError as exc:
                if exc.errno in (errno.ECONNRESET, errno.ENOTCONN, errno.ETIMEDOUT):
                    raise trio.BrokenResourceError(str(exc)) from exc
                raise
            self._drained = len(data) < self._read_size
            return data
