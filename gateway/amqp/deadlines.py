"""The deadlines of one AMQP connection, kept by a task of their own (docs/amqp.md, "The
connection's deadlines").

The reading task waits for octets without a timeout: a cancel scope per read (trio's
`move_on_at`) cost ~5 µs of a lone pika message's server CPU, twice per message. Instead
`Deadlines.run` sleeps until the earliest of

* the handshake deadline (`handshake_timeout_s` from the accept, until Open-Ok),
* the close deadline (`close_linger_s` after our Connection.Close),
* the connection's heartbeat deadlines (`ServerConnection.next_deadline`: send a
  heartbeat, or the peer missed two),

and acts on it: a heartbeat goes out from this task; a passed handshake or close deadline,
missed heartbeats or a socket that fails under a heartbeat end the connection
(`ServerConnection.drop`/`beat`) and close the stream, which wakes a reader waiting for
octets with `ClosedResourceError` (a reader busy with a read stops at its next look at
`terminated`). Heartbeat deadlines only move later with traffic, so the task sleeps on and
recomputes when it wakes; the reader wakes it early (`update`) only when a deadline comes
closer: during the handshake (Tune-Ok starts heartbeats) and when the connection starts
closing. The handshake and close deadlines are fixed times: input trickling in cannot
stretch them.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from gateway.amqp.connection import ServerConnection

__all__ = ["Deadlines"]

log = logging.getLogger("gateway.amqp.server")


class Deadlines:
    """Handshake, close-linger and heartbeat deadlines of one connection (module doc)."""

    __slots__ = ("conn", "stream", "flush", "handshake", "close", "linger_s", "beating",
                 "_sleep", "_done")

    def __init__(self, conn: ServerConnection, stream: Any, flush: Any,
                 handshake_deadline: float, linger_s: float) -> None:
        self.conn = conn
        self.stream = stream
        self.flush = flush
        #: Absolute trio times; None when not (or no longer) running.
        self.handshake: float | None = handshake_deadline
        self.close: float | None = None
        self.linger_s = linger_s
        self.beating = False  # the connection had heartbeat deadlines when last looked at
        self._sleep: trio.CancelScope | None = None
        self._done = trio.CancelScope()

    def opened(self) -> None:
        """Open-Ok went out: no handshake deadline any more (a later deadline: the task
        finds out when it wakes)."""
        self.handshake = None

    def update(self) -> None:
        """After a read during the handshake or a close: wake the task when a deadline
        came closer (heartbeats negotiated, our Connection.Close sent)."""
        conn = self.conn
        closer = False
        if self.close is None and conn.closing:
            self.close = trio.current_time() + self.linger_s
            closer = True
        if not self.beating and conn.next_deadline() is not None:
            self.beating = closer = True
        if closer and self._sleep is not None:
            self._sleep.cancel()

    def stop(self) -> None:
        self._done.cancel()

    def _next(self) -> float:
        due = self.conn.next_deadline()
        for d in (self.handshake, self.close):
            if d is not None and (due is None or d < due):
                due = d
        return float("inf") if due is None else due

    async def run(self) -> None:
        """Until `stop` (the connection's task ends) or the connection is dropped."""
        with self._done:
            try:
                await self._watch()
            except Exception:  # a bug here must cost this connection only
                log.exception("AMQP connection deadlines failed")
                await self._drop("internal error")

    async def _watch(self) -> None:
        conn = self.conn
        while not conn.terminated:
            now = trio.current_time()
            if self.close is not None and now >= self.close:
                await self._drop("no Close-Ok within the close linger")  # lingered enough
                return
            if self.handshake is not None and now >= self.handshake:
                # RabbitMQ also just drops a connection stuck in the handshake.
                await self._drop("handshake timeout")
                return
            if conn.beat(now):
                await self._drop(None)  # missed heartbeats (the connection ended itself)
                return
            try:
                await self.flush()  # a heartbeat, when one was due
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                await self._drop("socket failed")
                return
            with trio.CancelScope(deadline=self._next()) as self._sleep:
                await trio.sleep_forever()
            self._sleep = None

    async def _drop(self, why: str | None) -> None:
        if why is not None:
            self.conn.drop(why)
        await trio.aclose_forcefully(self.stream)
