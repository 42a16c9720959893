"""Admission control: the gateway accepts publishes only as fast as it delivers them.

Devices do not wait for subscribers. If the gateway read every publishing socket as fast
as the kernel fills it, the event loop would spend its time storing messages while the
delivery tasks fall further behind, until the readers of an LMQ drop out of its cache of
recent entries, each message then costs a pull and a decode, and the sessions are finally
cut (a metastable collapse). So the readers of publishing connections pass a gate:

* a delivery `Pump` that is *runnable* (its client takes what it is given) and more than
  `backpressure_lag` messages behind the newest stored closes the gate;
* while the gate is closed, connections that publish do not read their sockets: TCP's own
  flow control pushes back on the devices, as a single-threaded broker such as Mosquitto
  does by being busy. Every waiting reader wakes when the gate opens and reads one chunk
  before it looks again, so no publisher is starved;
* a slow *client* must not throttle everyone: a pump that has waited `STUCK_S` on its
  client (a socket write that does not finish, or acknowledgements of a full in-flight
  window that do not come) leaves the gate and is marked slow until it has caught up. Its backlog is bounded per client instead
  (`max_queued_messages` for QoS 0, `max_session_lag` for QoS 1/2; see delivery.py).

Connections that only subscribe always read, so PUBACKs and PINGREQs keep flowing.
"""

from __future__ import annotations

import logging
import select
from typing import Protocol

import trio

__all__ = ["DeliveryGate", "STUCK_S", "writable"]

log = logging.getLogger(__name__)

#: A pump that waited this long on its client (a write, acknowledgements) is slow.
STUCK_S = 0.2


class _Member(Protocol):
    slow: bool
    #: trio time it began waiting on its client (0.0 while not)
    held_since: float

    def held_by_client(self) -> bool:
        """Is the wait really the client's (not a busy event loop's)?"""


class DeliveryGate:
    """Open while no runnable delivery task is too far behind (see the module doc)."""

    def __init__(self) -> None:
        self._behind: dict[_Member, None] = {}
        self._opened = trio.Event()
        self._opened.set()
        self._watching = False
        #: times the gate closed, members found held up by their clients (diagnostics)
        self.closings = 0
        self.evictions = 0

    @property
    def is_open(self) -> bool:
        return not self._behind

    def set_behind(self, member: _Member, behind: bool) -> None:
        members = self._behind
        if behind:
            if member not in members:
                members[member] = None
                if len(members) == 1:
                    self.closings += 1
                    self._opened = trio.Event()
        elif members and members.pop(member, 1) is None and not members:
            self._opened.set()

    async def wait_open(self) -> None:
        """Return once the gate is open. One waiter at a time also watches the members
        for clients that hold them up (the others just sleep on the event)."""
        while self._behind:
            if self._watching:
                await self._opened.wait()
                continue
            self._watching = True
            try:
                with trio.move_on_after(STUCK_S):
                    await self._opened.wait()
            finally:
                self._watching = False
            if self._behind:
                self._evict_held()

    def _evict_held(self) -> None:
        now = trio.current_time()
        for member in list(self._behind):
            since = member.held_since
            if since and now - since >= STUCK_S and member.held_by_client():
                member.slow = True
                self.evictions += 1
                log.info("delivery to %r is held up by its client; publishers no longer wait "
                         "for it", getattr(member, "client_id", "?"))
                self.set_behind(member, False)


def writable(stream) -> bool:
    """Has the kernel room for more of this stream's output now? (unknown: False)"""
    sock = getattr(stream, "socket", None)
    if sock is None:
        sock = getattr(getattr(stream, "transport_stream", None), "socket", None)
    if sock is None:
        return False
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLOUT)
    return bool(poller.poll(0))
