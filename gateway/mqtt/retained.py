"""Retained messages: the last RETAIN=1 message per topic, durable in the gateway's KV.

A retained publish is stored in the CommitLog like any other (and delivered to current
subscribers); once the broker has stored it, the gateway keeps it here as well, keyed by
topic (MQTT-3.3.1-5). An empty payload deletes it (MQTT-3.3.1-6/-7). A new subscription
receives the retained messages its filter matches, RETAIN=1, unless its Retain Handling
says otherwise (v5 §3.8.3.1). Expired messages are dropped when found (MQTT-3.3.2-5).

The table lives in memory too (topic -> message) so matching a filter costs a scan of the
names, bounded by `max_retained` (default 100k); a filter without wildcards is one lookup.
"""

from __future__ import annotations

from gateway.mqtt.message import MqttMessage, from_properties, now_ms, to_properties
from gateway.mqtt.session_store import SessionStore
from gateway.mqtt.topics import is_wildcard_filter, topic_matches

__all__ = ["RetainedStore"]


class RetainedStore:
    """topic -> retained message, mirrored in `SessionStore` (prefix b"r")."""

    def __init__(self, store: SessionStore, max_retained: int) -> None:
        self.store = store
        self.max_retained = max_retained
        self.messages: dict[str, MqttMessage] = {}

    def load(self) -> int:
        for topic, record in self.store.load_retained():
            payload, props = record
            msg = from_properties(props, payload)
            if msg is not None:
                msg.retain = True
                self.messages[topic] = msg
        return len(self.messages)

    def __len__(self) -> int:
        return len(self.messages)

    def would_refuse(self, topic: str, payload_len: int) -> bool:
        """True if storing a new retained topic would exceed `max_retained`."""
        return (payload_len > 0 and topic not in self.messages
                and len(self.messages) >= self.max_retained)

    def set(self, msg: MqttMessage) -> None:
        """Apply a stored RETAIN=1 publish: keep it, or delete on an empty payload."""
        topic = msg.topic
        if not msg.payload:
            if self.messages.pop(topic, None) is not None:
                self.store.put_retained(topic, None)
            return
        if topic not in self.messages and len(self.messages) >= self.max_retained:
            return
        kept = MqttMessage(topic, bytes(msg.payload), msg.qos, True, msg.props, msg.expiry_at,
                           msg.sender, msg.broker, msg.commitlog_offset)
        self.messages[topic] = kept
        if not topic.startswith("$SYS/"):  # statistics are republished at start anyway
            self.store.put_retained(topic, [kept.payload, to_properties(kept)])

    def get(self, topic: str) -> MqttMessage | None:
        return self.messages.get(topic)

    def match(self, topic_filter: str) -> list[MqttMessage]:
        """Retained messages whose topic `topic_filter` matches, expired ones removed."""
        now = now_ms()
        if not is_wildcard_filter(topic_filter):
            msg = self.messages.get(topic_filter)
            found = [msg] if msg is not None else []
        else:
            found = [m for t, m in self.messages.items() if topic_matches(topic_filter, t)]
        out = []
        for msg in found:
            if msg.expired(now):
                self.messages.pop(msg.topic, None)
                self.store.put_retained(msg.topic, None)
            else:
                out.append(msg)
        return out
