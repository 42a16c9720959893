"""MQTT topic filters for the `mqttTopic` option (validation and matching reuse the gateway's
reference functions, so the source matches exactly what an MQTT subscriber would get)."""

from __future__ import annotations

from gateway.mqtt.topics import topic_matches, validate_topic_filter
from spark_sinks.options import LmqOptionError


def validate_filter(topic_filter: str) -> None:
    """Raise LmqOptionError unless `topic_filter` is a valid, non-shared MQTT filter."""
    if not topic_filter:
        raise LmqOptionError("option 'mqttTopic' must not be empty")
    try:
        shared = validate_topic_filter(topic_filter)
    except Exception as exc:  # MqttProtocolError: say which option was wrong
        raise LmqOptionError(f"option 'mqttTopic': invalid MQTT topic filter "
                             f"{topic_filter!r}: {exc}") from None
    if shared is not None:
        raise LmqOptionError("option 'mqttTopic': a $share filter cannot be read by Spark")


__all__ = ["topic_matches", "validate_filter"]
