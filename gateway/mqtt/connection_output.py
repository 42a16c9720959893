"""Output of a connection (a mixin of `Connection`): packets are queued (`queue`) and
written together by whoever calls `flush` first; others return at once and their bytes
ride along. On a plain TCP socket the queued bytes are written straight to the
non-blocking socket (`write_now`), without the pass of the scheduler trio's `send_all`
makes after every send; only what the kernel does not take waits for the socket.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from gateway.mqtt.connection import Connection

__all__ = ["ConnectionOutput"]


class ConnectionOutput:
    """`Connection`'s output buffer and its writes."""

    def queue(self: Connection, data: bytes) -> None:
        self.out.append(data)
        self.out_bytes += len(data)

    def send(self: Connection, packet) -> None:
        """Queue a control packet (dropping v5 reason strings when the client asked so)."""
        self.queue(self.codec.encode(packet))

    def write_now(self: Connection) -> bool:
        """Write the queued output straight to the (non-blocking) TCP socket, without
        yielding to the scheduler as `SocketStream.send_all` does after every send; True
        when the kernel took all of it. What it did not take stays queued for `flush`,
        which waits until the socket is writable (gateway/amqp/wire.py does the same)."""
        out = self.out
        if not out:
            return True
        sock = self._sock
        if sock is None or self._writing or self.closed:
            return False
        fd = sock.fileno()  # -1 once closed: never write to a descriptor reused since
        if fd < 0:
            return False
        data = out[0] if len(out) == 1 else b"".join(out)
        try:
            n = os.write(fd, data)
        except BlockingIOError:
            n = 0
        except OSError:
            self._lost()
            return False
        out.clear()
        if n < len(data):
            out.append(data[n:])
            self.out_bytes = len(data) - n
            return False
        self.out_bytes = 0
        if self._drained is not None:
            self._drained.set()
        return True

    async def flush(self: Connection) -> None:
        if self._writing or self.closed:
            return
        if self._sock is not None and self.write_now():
            return
        self._writing = True
        try:
            out = self.out
            while out:
                data = out[0] if len(out) == 1 else b"".join(out)
                out.clear()
                self.out_bytes = 0
                await self.stream.send_all(data)
                if self._drained is not None:
                    self._drained.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self._lost()
        finally:
            self._writing = False

    async def wait_drained(self: Connection) -> None:
        """Return once the bytes queued now went to the socket (or the connection closed)."""
        if self.out_bytes and not self.closed:
            ev = self._drained
            if ev is None or ev.is_set():  # the reader and the pump may both wait on it
                ev = self._drained = trio.Event()
            if not self._writing:
                await self.flush()
                return
            await ev.wait()

    def _lost(self: Connection) -> None:
        self.closed = True
        self.out.clear()
        self.out_bytes = 0
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

