"""Guards of a connection (a mixin of `Connection`): read deadlines, the gateway-wide
budget for incomplete packets, the lingering close and ACL read checks.

Deadlines while reading: keep alive is measured from the last *complete* control packet,
so a client trickling bytes is cut at 1.5 x its keep alive; and a packet that has started
arriving must be complete within `packet_read_timeout_s`, keep alive or not (a half-sent
1 MiB PUBLISH is not held for ever). Either closes with DISCONNECT 0x8D (v5). While the
other connections' incomplete packets hold more than `max_partial_packet_bytes`, a
connection with an incomplete packet is not read (its deadline keeps running).

Closing with a reason is lingering: the final DISCONNECT / CONNACK is written, the
sending side shut down (FIN), and input is read and dropped for at most
`close_linger_s` / `close_linger_bytes` before the socket is closed. Closing a socket
with unread input makes the kernel send a reset, which can destroy the reason before
the client has read it (a client flooding past Receive Maximum would see "connection
reset", not 0x93).

ACL read checks: a subscription the ACL grants although some topics under it are denied
(`auth.SUB_CHECKED`) makes every message delivered to the connection pass `may_read`
(the delivery pump asks while `acl_checked` is not empty); answers are cached per topic.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import trio

from gateway.mqtt.auth import SUB_ALLOWED
from gateway.mqtt.logtext import shown
from gateway.mqtt.topics import parse_shared_subscription

if TYPE_CHECKING:
    from gateway.mqtt.connection import Connection

__all__ = ["ConnectionGuards"]

log = logging.getLogger(__name__)

READ_SIZE = 65536
#: Topics whose ACL read decision a connection remembers (cleared when full).
READ_CACHE_MAX = 4096


class ConnectionGuards:
    """Deadlines, budgets and checks that protect the gateway from one connection."""

    # -- read deadlines ------------------------------------------------------------------

    def _packet_seen(self: Connection) -> None:
        """A complete control packet was handled: keep alive restarts from now."""
        self._ka_deadline = (trio.current_time() + self.keepalive * 1.5 if self.keepalive
                             else float("inf"))
        self._packet_deadline = float("inf")

    def _read_deadline(self: Connection) -> float:
        """When the next read gives up: keep alive, or the partial packet's deadline."""
        if self.codec.buffered:
            if self._packet_deadline == float("inf"):
                self._packet_deadline = (trio.current_time()
                                         + self.gw.config.packet_read_timeout_s)
        else:
            self._packet_deadline = float("inf")
        return min(self._ka_deadline, self._packet_deadline)

    async def _receive_tcp(self: Connection, max_bytes: int) -> bytes:
        """`SocketStream.receive_some` for a plain TCP socket, with less overhead per read:
        wait until readable, then one read (trio's version tries a read first, which
        for a device sending one packet now and then fails almost every time, and wraps
        it in more bookkeeping; together about a quarter of the cost of a small read).
        Closing the stream wakes the wait with ClosedResourceError, as in trio's."""
        sock = self.stream.socket
        while True:
            fd = sock.fileno()
            if fd < 0:
                raise trio.ClosedResourceError("the socket was closed")
            await trio.lowlevel.wait_readable(fd)
            try:
                return os.read(fd, max_bytes)
            except BlockingIOError:
                continue  # woken without data (spurious): wait again

    def _read_timed_out(self: Connection) -> None:
        if trio.current_time() >= self._packet_deadline:
            log.info("client %s: packet not complete within packet_read_timeout_s (%g s, "
                     "%d bytes buffered)", shown(self.client_id),
                     self.gw.config.packet_read_timeout_s, self.codec.buffered)
        else:
            log.info("client %s: keep alive timeout (%d s)", shown(self.client_id),
                     self.keepalive)
        self.close(0x8D)  # Keep Alive timeout: no complete packet in time

    # -- gateway-wide budget for incomplete packets ------------------------------------------

    def _count_partial(self: Connection) -> None:
        """Account this connection's incomplete-packet bytes in `gw.partial_bytes`."""
        now = self.codec.buffered
        before = self._partial
        if now != before:
            self._partial = now
            self.gw.partial_bytes_changed(now - before)

    def _release_partial(self: Connection) -> None:
        if self._partial:
            self.gw.partial_bytes_changed(-self._partial)
            self._partial = 0

    async def _within_partial_budget(self: Connection) -> bool:
        """Wait while the other connections' incomplete packets hold more than
        `max_partial_packet_bytes`; False if this packet's deadline passed meanwhile."""
        gw = self.gw
        limit = gw.config.max_partial_packet_bytes
        while gw.partial_bytes - self._partial > limit:
            with trio.move_on_at(self._read_deadline()) as scope:
                await gw.partial_bytes_freed()
            if scope.cancelled_caught:
                return False
        return True

    async def _linger(self: Connection) -> None:
        """Shut down writing, then read and drop input for a bounded time and size."""
        stream = self.stream
        cfg = self.gw.config
        if isinstance(stream, trio.SocketStream):
            await stream.send_eof()
        # TLS and WebSocket streams have no half-close: the client that read the reason
        # closes, and the drain below sees that.
        budget = cfg.close_linger_bytes
        with trio.move_on_after(cfg.close_linger_s):
            while budget > 0:
                data = await stream.receive_some(min(READ_SIZE, budget))
                if not data:
                    return  # the client closed too: a clean close, no reset
                budget -= len(data)

    # -- ACL read checks ------------------------------------------------------------------

    def _acl_decision(self: Connection, topic_filter: str) -> int:
        shared = parse_shared_subscription(topic_filter)
        inner = shared.filter if shared is not None else topic_filter
        return self.gw.auth.subscription(self.username, self.client_id, inner)

    def _note_acl(self: Connection, topic_filter: str, decision: int) -> None:
        # A resumed session's filter the ACL now refuses (rules or user changed) is
        # checked per message too, rather than delivered unchecked.
        if decision == SUB_ALLOWED:
            self.acl_checked.discard(topic_filter)
        else:
            self.acl_checked.add(topic_filter)

    def may_read(self: Connection, topic: str) -> bool:
        """May a message on `topic` go to this client? (asked only while `acl_checked`)"""
        cache = self._readable
        ok = cache.get(topic)
        if ok is None:
            if len(cache) >= READ_CACHE_MAX:
                cache.clear()
            ok = cache[topic] = self.gw.auth.can_read(self.username, self.client_id, topic)
        return ok
