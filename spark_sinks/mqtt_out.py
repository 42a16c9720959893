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

from core.common.properties import MessageConst
from gateway.mqtt.broker_link import RETAINED_LMQ
from gateway.mqtt.message import MqttMessage, lmq_dispatch_value, to_properties
from gateway.mqtt.topics import validate_topic_name
from gateway.routing.route_reader import RouteReader, open_reader
from spark_sinks.conn import client_for

__all__ = ["DEFAULT_STORE_TOPIC", "RouteReader", "mqtt_properties", "routes_for"]

DEFAULT_STORE_TOPIC = "MQTT_MESSAGES"

_readers: dict[str, RouteReader] = {}
_lock = threading.Lock()


async def _make_reader(instance) -> RouteReader:
    """A reader on the broker holding the route log (gateway/routing/route_reader.py)."""
    return await open_reader(instance, "spark")


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
