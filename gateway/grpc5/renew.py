"""Auto-renew for push consumers (docs/grpc.md "Auto-renew").

A push consumer's ReceiveMessage asks for `auto_renew` and names no invisible duration:
the front end pops with `auto_renew_invisible_s` (60 s) and, while the client has neither
acked nor changed the message, pushes the deadline out again shortly before it passes
(CHANGE_MESSAGE_INVISIBLETIME), for at most `MAX_RENEW_S`. Each renewal gives the
message a new POP handle; the client keeps the one it received, so acks and changes
naming it are translated to the current one here. This is the one piece of per-message
state in the front end: a proxy that dies stops renewing, and its messages come back
when their deadline passes (at least once), as with Apache's proxy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

__all__ = ["Renewer", "MAX_RENEW_S", "MAX_RENEWALS"]

log = logging.getLogger(__name__)

#: Longest a message is kept invisible by renewals (Apache's proxy: 3 h).
MAX_RENEW_S = 3 * 3600
#: Messages being renewed at once per proxy; beyond, new ones are not renewed.
MAX_RENEWALS = 100_000
#: How often due renewals are looked for.
TICK_S = 0.5


@dataclass(slots=True)
class _Renewal:
    group: str
    topic: str
    route_topic: str | None
    current: str  # the handle the broker holds now
    invisible_ms: int
    until: float  # wall clock: stop renewing
    busy: trio.Event | None = None  # set when a renewal in flight has finished


def _deadline_s(handle: str) -> float:
    f = handle.split(" ")
    return (int(f[1]) + int(f[2])) / 1000


class Renewer:
    """original handle -> renewal; `run` renews what is due."""

    def __init__(self, change: Callable[[str, str, str, int, str | None], Awaitable[str]]
                 ) -> None:
        #: change(group, topic, handle, invisible_ms, route_topic) -> the new handle
        self._change = change
        self._items: dict[str, _Renewal] = {}

    def __len__(self) -> int:
        return len(self._items)

    def add(self, group: str, topic: str, handle: str, invisible_ms: int,
            route_topic: str | None = None) -> None:
        if len(self._items) < MAX_RENEWALS:
            self._items[handle] = _Renewal(group, topic, route_topic, handle, invisible_ms,
                                           time.time() + MAX_RENEW_S)

    async def take(self, handle: str) -> str:
        """The broker's current handle for a client's one (it stops being renewed); waits
        for a renewal in flight, whose new handle it then is."""
        item = self._items.pop(handle, None)
        if item is None:
            return handle
        if item.busy is not None:
            await item.busy.wait()
        return item.current

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(TICK_S)
            now = time.time()
            for original, item in list(self._items.items()):
                ahead = min(10.0, item.invisible_ms / 3000)
                if _deadline_s(item.current) - ahead > now:
                    continue
                if now > item.until:
                    self._items.pop(original, None)
                    continue
                item.busy = trio.Event()
                try:
                    item.current = await self._change(item.group, item.topic, item.current,
                                                      item.invisible_ms, item.route_topic)
                except Exception as exc:  # redelivered meanwhile, broker away
                    log.debug("renewal of %s stopped: %r", original, exc)
                    self._items.pop(original, None)
                finally:
                    item.busy.set()
                    item.busy = None
