"""A read-only follower of the route log, for writers of MQTT traffic that are no gateway
(the Spark sink's MQTT rows, spark_sinks/mqtt_out.py; 5.x sends to MQTT topics,
gateway/grpc5/mqtt_out.py).

`RouteReader` never writes to the route log (no acknowledgements, no snapshots, no
topics); `catch_up` brings its table up to the log's end. `open_reader` makes one on the
broker holding the log and joins the gateways' member group as `writer-<kind>-<id>`, which
tells the MQTT gateways that LMQs get entries they did not write (gateway/mqtt/server.py,
FOREIGN_WRITER_PREFIXES). Moved here from spark_sinks/mqtt_out.py to be shared.
"""

from __future__ import annotations

import uuid

from core.client import ClientInstance
from core.client.errors import MQClientError
from gateway.routing.route_log import RouteLog, RouteLogConfig

__all__ = ["RouteReader", "open_reader"]


class RouteReader(RouteLog):
    """A copy of the routing table that follows the route log and never writes to it."""

    async def ensure_topics(self) -> None:
        return None  # the gateways create them; a reader needs no admin right

    async def catch_up(self) -> None:
        """Apply the log up to its current end (loading the table on first use)."""
        if not self._loaded:
            await self._first_load()
            return
        while await self._apply_log(0):
            pass

    async def _first_load(self) -> None:
        cfg = self.config
        route = await self.client.update_route(cfg.log_topic)
        if route is None or not route.queue_datas:
            return  # no gateway ever ran: no routes yet; look again next time
        start = await self._load_snapshot()
        if start is None:
            start = await self.client.api.get_min_offset(self.addr, cfg.log_topic, 0)
        self._log_offset = start
        while await self._apply_log(0):
            pass
        self._loaded = True


async def open_reader(instance: ClientInstance, kind: str) -> RouteReader:
    """A reader on the broker holding the route log (the first master by name, where a
    single-broker `lmq serve` keeps it), a member of the gateways' group as
    `writer-<kind>-<random>`. Keep it a member with `reader._heartbeat_loop()`."""
    info = await instance.api.get_cluster_info()
    if not info.brokers:
        raise MQClientError("no broker to read MQTT routes from")
    # The first broker *name*: during a failover it has no master for a few seconds, and
    # another name holds no route log (the caller retries).
    name = sorted(info.brokers)[0]
    addr = info.brokers[name].master_addr()
    if not addr:
        raise MQClientError(f"no broker master for {name} (MQTT routes) yet")
    # Joining the route log's member group as a "writer-" tells the MQTT gateways that LMQs
    # get entries they did not write, so they read them by long polls from then on instead
    # of predicting their tails (gateway/mqtt/server.py, FOREIGN_WRITER_PREFIXES).
    writer_id = f"writer-{kind}-{uuid.uuid4().hex[:12]}"
    reader = RouteReader(instance, addr, name, writer_id, RouteLogConfig())
    reader._loaded = False
    await reader.join()
    return reader
