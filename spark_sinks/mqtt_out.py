"""Rows with an `mqttTopic`: MQTT traffic written by the sink (docs/spark.md, "MQTT traffic").

Such a row is stored as the MQTT gateway stores a PUBLISH: on the gateway's store topic
(option ``lmq.mqttStoreTopic``, default ``MQTT_MESSAGES``), body = payload, the MQTT
metadata in the same properties (`gateway.mqtt.message.to_properties`: MQTT_TOPIC,
MQTT_QOS, MQTT_RETAIN), and INNER_MULTI_DISPATCH naming the LMQ of every MQTT route of the
shared routing table that matches the topic, so the broker indexes it into the LMQs MQTT
subscribers read; a retained row (``retain`` true) also names the retained LMQ
(``%LMQ%mqtt_retained``), so every gateway's retained table takes it as the topic's
retained message.

The table is read from the route log topics (gateway/routing/route_log.py) by a read-only
follower per Python process (`RouteReader`): it never writes (no acknowledgements, no
snapshots, no topics), and each task brings it up to the log's end before its first MQTT
row, so every route added before the task started is applied.
"""

from __future__ import annotations

import threading
import uuid

from core.client.errors import MQClientError
from core.common.properties import MessageConst
from gateway.mqtt.broker_link import RETAINED_LMQ
from gateway.mqtt.message import MqttMessage, lmq_dispatch_value, to_properties
from gateway.mqtt.topics import validate_topic_name
from gateway.routing.route_log import RouteLog, RouteLogConfig
from spark_sinks.conn import client_for

__all__ = ["DEFAULT_STORE_TOPIC", "RouteReader", "mqtt_properties", "routes_for"]

DEFAULT_STORE_TOPIC = "MQTT_MESSAGES"

_readers: dict[str, RouteReader] = {}
_lock = threading.Lock()


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


async def _make_reader(instance) -> RouteReader:
    """A reader on the broker holding the route log: the first master by name (where a
    single-broker `lmq serve` keeps it)."""
    info = await instance.api.get_cluster_info()
    if not info.brokers:
        raise MQClientError("no broker to read MQTT routes from")
    # The first broker *name*: during a failover it has no master for a few seconds, and
    # another name holds no route log (retried by the caller, spark_sinks/retry.py).
    name = sorted(info.brokers)[0]
    addr = info.brokers[name].master_addr()
    if not addr:
        raise MQClientError(f"no broker master for {name} (MQTT routes) yet")
    masters = {name: addr}
    # Joining the route log's member group as a "writer-" tells the MQTT gateways that LMQs
    # get entries they did not write, so they read them by long polls from then on instead
    # of predicting their tails (gateway/mqtt/server.py, FOREIGN_WRITER_PREFIXES).
    writer_id = f"writer-spark-{uuid.uuid4().hex[:12]}"
    reader = RouteReader(instance, masters[name], name, writer_id, RouteLogConfig())
    reader._loaded = False
    await reader.join()
    return reader


def routes_for(namesrv: str, request_timeout: float) -> RouteReader:
    """The process's route reader for `namesrv`, caught up with the log."""
    from spark_sinks.retry import DEFAULT_RETRY_TIMEOUT_MS, call_retrying

    client = client_for(namesrv, request_timeout)
    budget = DEFAULT_RETRY_TIMEOUT_MS / 1000
    with _lock:
        reader = _readers.get(namesrv)
        if reader is None:
            reader = _readers[namesrv] = call_retrying(
                client, budget, "reading MQTT routes",
                lambda _n: client.call(_make_reader, client.instance))

    def attempt(n: int) -> None:
        if n:  # the route log's master may have moved (failover)
            client.call(reader.master.reresolve)
        client.call(reader.catch_up)

    call_retrying(client, budget, "reading MQTT routes", attempt)
    return reader


def mqtt_properties(topic: str, qos: int | None, retain: bool | None,
                    lmqs: set[str]) -> dict[str, str]:
    """The properties of an MQTT row (as the gateway stores a PUBLISH); raises ValueError
    for a topic name or QoS an MQTT publisher could not use."""
    try:
        validate_topic_name(topic)
    except Exception as exc:  # MqttProtocolError: say which column was wrong
        raise ValueError(f"column 'mqttTopic': invalid MQTT topic name {topic!r}: {exc}") \
            from None
    q = 0 if qos is None else int(qos)
    if q not in (0, 1, 2):
        raise ValueError(f"column 'qos' must be 0, 1 or 2, not {qos!r}")
    props = to_properties(MqttMessage(topic, b"", q, bool(retain)))
    if retain:
        # As a gateway stores a retained PUBLISH: also indexed into the retained LMQ, which
        # every MQTT gateway follows into its retained table (gateway/mqtt/retained.py).
        lmqs = {*lmqs, RETAINED_LMQ}
    if lmqs:
        props[MessageConst.INNER_MULTI_DISPATCH] = lmq_dispatch_value(sorted(lmqs))
    return props
