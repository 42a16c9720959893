"""The broker link's view of the cluster (a mixin of `BrokerLink`, broker_link.py): wait
for the brokers at start, create the store topic on each master, follow masters that
change (a failover) and brokers that join, and watch the LMQs once other gateways write
them too."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from core.client.errors import MQClientError
from core.remoting.errors import RemotingError
from gateway.mqtt.lmq_watch import watch_lmq

if TYPE_CHECKING:
    from gateway.mqtt.lmq_state import LmqState

__all__ = ["CLUSTER_REFRESH_S", "CLUSTER_WAIT_S", "ERROR_REFRESH_S", "LinkCluster",
           "NO_MASTER_LOG_INTERVAL_S"]

log = logging.getLogger("gateway.mqtt.broker_link")

#: After a broker could not be reached, the cluster is read again at once (at most this
#: often) instead of at the next CLUSTER_REFRESH_S tick: publishes follow a broker name's
#: new master after a failover (docs/ha.md) within a send attempt or two.
ERROR_REFRESH_S = 1.0
CLUSTER_WAIT_S = 30.0
CLUSTER_REFRESH_S = 30.0
#: "cluster info lists no master broker" is logged when it starts, then at most once per
#: this many seconds with the number of times it was seen meanwhile (`start()` asks every
#: 0.2 s while it waits for a broker).
NO_MASTER_LOG_INTERVAL_S = 60.0


class LinkCluster:
    """Cluster bookkeeping of `BrokerLink` (whose attributes it uses: client, config,
    brokers, queues, on_brokers_added, the no-master log state, and for the LMQ watches
    states, foreign_writers, _watched and _nursery)."""

    async def start(self) -> None:
        """Wait for the brokers, create the store topic on each master."""
        deadline = trio.current_time() + CLUSTER_WAIT_S
        while True:
            try:
                await self.refresh_cluster()
                if self.queues:
                    return
            except (MQClientError, RemotingError) as exc:
                if trio.current_time() > deadline:
                    raise
                log.debug("cluster not ready: %r", exc)
            if trio.current_time() > deadline:
                raise MQClientError("no broker registered with the name servers")
            await trio.sleep(0.2)

    async def refresh_cluster(self) -> None:
        info = await self.client.api.get_cluster_info()
        masters = info.master_addrs(None)
        if not masters:
            # A name server that restarted knows no broker until they register again
            # (within their 30 s heartbeat): keep what we knew rather than lose every queue.
            self._log_no_master()
            return
        if self._no_master_logged_at is not None:
            self._no_master_logged_at = None
            self._no_master_unlogged = 0
            log.info("cluster info lists master brokers again: %s", ", ".join(sorted(masters)))
        self.client.pin_brokers({n: info.brokers[n].broker_addrs for n in masters})
        for name, addr in sorted(masters.items()):
            if self.brokers.get(name) != addr:
                n = self.config.store_queues
                await self.client.api.create_topic(addr, self.config.store_topic, n, n)
                log.info("MQTT store topic %s ready on %s (%s)", self.config.store_topic, name, addr)
        added = [n for n in masters if n not in self.brokers]
        had_brokers = bool(self.brokers)
        self.brokers = dict(masters)
        self.queues = [(name, q) for name in sorted(masters) for q in range(self.config.store_queues)]
        if added and had_brokers and self.on_brokers_added is not None:
            self.on_brokers_added(added)

    def _log_no_master(self) -> None:
        """Rate-limited (NO_MASTER_LOG_INTERVAL_S): first occurrence, then a count."""
        now = trio.current_time()
        last = self._no_master_logged_at
        if last is not None and now - last < NO_MASTER_LOG_INTERVAL_S:
            self._no_master_unlogged += 1
            return
        more, self._no_master_unlogged = self._no_master_unlogged, 0
        self._no_master_logged_at = now
        if last is None or not more:
            log.warning("cluster info lists no master broker; keeping the %d known",
                        len(self.brokers))
        else:
            log.warning("cluster info lists no master broker; keeping the %d known "
                        "(seen %d more times in the last %.0f s)", len(self.brokers), more,
                        now - last)

    async def _refresh_after_error(self) -> None:
        """Re-read the cluster now (at most once per ERROR_REFRESH_S): the broker may have
        lost its master role to a slave."""
        now = trio.current_time()
        if now - self._error_refresh_at < ERROR_REFRESH_S:
            return
        self._error_refresh_at = now
        try:
            await self.refresh_cluster()
        except (MQClientError, RemotingError, OSError) as exc:
            log.debug("cluster refresh after a send error failed: %r", exc)

    async def refresh_loop(self) -> None:
        while True:
            await trio.sleep(CLUSTER_REFRESH_S)
            try:
                await self.refresh_cluster()
            except Exception as exc:
                log.warning("cluster refresh failed: %r", exc)

    def addr(self, broker: str) -> str:
        addr = self.brokers.get(broker) or self.client.find_broker_addr(broker)
        if addr is None:
            raise MQClientError(f"broker {broker!r} is unknown")
        return addr

    # -- several gateways -------------------------------------------------------------

    def share_lmqs(self) -> None:
        """Other gateways write our LMQs from now on: forget the predicted tails (readers
        pull to the end) and watch every LMQ read from here on."""
        if self.foreign_writers:
            return
        self.foreign_writers = True
        log.info("MQTT: other gateways write the LMQs too; watching them with long polls")
        for st in self.states.values():
            st.tail = None
            st.version += 1
            for w in list(st.watchers):
                w.wake()

    def _watch(self, st: LmqState) -> None:
        key = (st.broker, st.lmq)
        if key not in self._watched and self._nursery is not None:
            self._watched[key] = None
            self._nursery.start_soon(watch_lmq, self, st, self._watched)
