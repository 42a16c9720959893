"""Follow the master of a broker name across a failover (docs/stateless-gateways.md,
"When a broker fails").

The gateways keep their shared state (route log, client registry, cluster sessions) on
one broker name. In controller mode a slave takes that name over when its master dies
(docs/ha.md, "Failover of writes"): the name servers then list the new master as
brokerId 0. `MasterFollower` holds the address requests go to and, when one fails, reads
the cluster info from the name servers again and moves to the master listed now. Reads
are at most one per `min_interval_s` however many tasks fail at once, so a dead broker
costs the name servers a request every half second per gateway, not a storm.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from core.client.errors import MQClientError
from core.remoting.errors import RemotingError

__all__ = ["MasterFollower"]

log = logging.getLogger(__name__)


class MasterFollower:
    """The address of `broker_name`'s master, re-read from the name servers on demand."""

    def __init__(self, client, broker_name: str, addr: str, *,
                 min_interval_s: float = 0.5,
                 on_change: Callable[[str, str], None] | None = None) -> None:
        self.client = client
        self.broker_name = broker_name
        self.addr = addr
        self.min_interval_s = min_interval_s
        #: called with (old address, new address) after a move
        self.on_change = on_change
        self._lock = trio.Lock()
        self._last = -float("inf")
        #: moves to another address so far
        self.moves = 0

    async def reresolve(self) -> bool:
        """Read where `broker_name`'s master is now; True if the address changed. A
        failed read (name servers down too) keeps the address known."""
        async with self._lock:
            now = trio.current_time()
            if now - self._last < self.min_interval_s:
                return False
            self._last = now
            try:
                info = await self.client.api.get_cluster_info()
            except (MQClientError, RemotingError, OSError) as exc:
                log.debug("re-reading the master of %s failed: %r", self.broker_name, exc)
                return False
            bd = info.brokers.get(self.broker_name)
            new = bd.master_addr() if bd is not None else None
            if not new or new == self.addr:
                return False
            old, self.addr = self.addr, new
            self.moves += 1
            # The client's own table too: other requests for this name go there now.
            addrs = self.client.broker_addrs.get(self.broker_name)
            if addrs is not None:
                addrs.update(bd.broker_addrs)
                for bid in [b for b in addrs if b not in bd.broker_addrs]:
                    del addrs[bid]
            log.warning("broker %s: master moved from %s to %s", self.broker_name, old, new)
        if self.on_change is not None:
            self.on_change(old, new)
        return True
