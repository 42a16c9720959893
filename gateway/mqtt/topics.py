"""Topic names and topic filters: validation, shared subscriptions, reference matching.

Rules (MQTT 5.0 §4.7, identical in 3.1.1):

* Names and filters are at least one character (MQTT-4.7.3-1), contain no U+0000
  (MQTT-4.7.3-2) and are at most 65,535 bytes of UTF-8 (MQTT-4.7.3-3).
* A topic name has no wildcards (MQTT-3.3.2-2).
* In a filter `#` is alone in the last level (MQTT-4.7.1-1), `+` is alone in its level
  (MQTT-4.7.1-2). Empty levels (`a//b`, `/a`, `a/`) are real levels.
* `$share/<ShareName>/<filter>` is a shared subscription (§4.8.2): the share name is at
  least one character and contains none of `/`, `+`, `#`; the filter after it is a
  valid, non-empty topic filter.

A syntax violation is a Malformed Packet (0x81): the spec's own reason codes 0x8F / 0x90
are for names that are "correctly formed but not accepted", which is what the
configurable limits below report (length over `max_length`, more levels than
`max_levels`). The default level limit of 128 is deliberately generous (Mosquitto's
compile-time TOPIC_HIERARCHY_LIMIT is 200; HiveMQ defaults to 1000 levels) but keeps a
malicious `a/a/a/...` from costing a trie walk of 32k levels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gateway.mqtt.packets import MqttProtocolError, ReasonCode

__all__ = [
    "filter_matcher",
    "DEFAULT_MAX_TOPIC_LENGTH",
    "DEFAULT_MAX_TOPIC_LEVELS",
    "SHARE_PREFIX",
    "SharedSubscription",
    "is_wildcard_filter",
    "parse_shared_subscription",
    "topic_matches",
    "validate_topic_filter",
    "validate_topic_name",
]

#: Wire maximum of a UTF-8 string, hence of a topic name or filter (MQTT-4.7.3-3).
DEFAULT_MAX_TOPIC_LENGTH = 65535
#: Default maximum number of levels ("/"-separated parts) in a name or filter.
DEFAULT_MAX_TOPIC_LEVELS = 128
SHARE_PREFIX = "$share/"


@dataclass(frozen=True, slots=True)
class SharedSubscription:
    """A parsed `$share/<group>/<filter>` subscription (5.0 §4.8.2)."""

    group: str
    filter: str


def _malformed(message: str) -> MqttProtocolError:
    return MqttProtocolError(ReasonCode.MALFORMED_PACKET, message)


def _utf8_length(text: str) -> int:
    if text.isascii():
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:  # lone surrogate: not well-formed UTF-8 (MQTT-1.5.4-1)
        raise _malformed("topic is not well-formed UTF-8") from None


def validate_topic_name(
    name: str,
    *,
    max_length: int = DEFAULT_MAX_TOPIC_LENGTH,
    max_levels: int = DEFAULT_MAX_TOPIC_LEVELS,
) -> None:
    """Check a PUBLISH (or Will) topic name.

    Raises `MqttProtocolError` 0x81 for a syntax violation (empty, wildcard, U+0000,
    ill-formed UTF-8) and 0x90 (Topic Name invalid) for a name over `max_length` bytes
    or `max_levels` levels.
    """
    if not name:
        raise _malformed("empty topic name")
    if "+" in name or "#" in name:
        raise _malformed("wildcard in topic name")
    if "\x00" in name:
        raise _malformed("U+0000 in topic name")
    if _utf8_length(name) > max_length:
        raise MqttProtocolError(ReasonCode.TOPIC_NAME_INVALID, "topic name too long")
    if name.count("/") >= max_levels:
        raise MqttProtocolError(ReasonCode.TOPIC_NAME_INVALID, "too many topic levels")


def _check_filter_syntax(topic_filter: str) -> None:
    if not topic_filter:
        raise _malformed("empty topic filter")
    if "\x00" in topic_filter:
        raise _malformed("U+0000 in topic filter")
    if "+" not in topic_filter and "#" not in topic_filter:
        return
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if len(level) == 1 or ("+" not in level and "#" not in level):
            if level == "#" and i != last:
                raise _malformed("'#' must be the last level of a topic filter")
            continue
        raise _malformed("wildcard must occupy a whole topic level")


def parse_shared_subscription(topic_filter: str) -> SharedSubscription | None:
    """Split `$share/<group>/<filter>`; None if `topic_filter` is not shared.

    Raises `MqttProtocolError` 0x81 for a bad share name or a missing / invalid filter.
    """
    if not topic_filter.startswith(SHARE_PREFIX):
        return None
    group, sep, inner = topic_filter[len(SHARE_PREFIX) :].partition("/")
    if not group or not sep:
        raise _malformed("shared subscription needs $share/<group>/<filter>")
    if "+" in group or "#" in group:
        raise _malformed("share name must not contain '+' or '#'")
    _check_filter_syntax(inner)
    return SharedSubscription(group, inner)


def validate_topic_filter(
    topic_filter: str,
    *,
    max_length: int = DEFAULT_MAX_TOPIC_LENGTH,
    max_levels: int = DEFAULT_MAX_TOPIC_LEVELS,
    allow_shared: bool = True,
) -> SharedSubscription | None:
    """Check a SUBSCRIBE / UNSUBSCRIBE topic filter.

    Returns the parsed `SharedSubscription` for a `$share/...` filter (when
    `allow_shared`; otherwise `$share` is an ordinary first level) and None for an
    ordinary filter. Raises `MqttProtocolError` 0x81 for a syntax violation and 0x8F
    (Topic Filter invalid) for a filter over `max_length` bytes, or whose subscribed
    part has more than `max_levels` levels.
    """
    shared = parse_shared_subscription(topic_filter) if allow_shared else None
    inner = topic_filter
    if shared is not None:
        inner = shared.filter
    else:
        _check_filter_syntax(topic_filter)
    if _utf8_length(topic_filter) > max_length:
        raise MqttProtocolError(ReasonCode.TOPIC_FILTER_INVALID, "topic filter too long")
    if inner.count("/") >= max_levels:
        raise MqttProtocolError(ReasonCode.TOPIC_FILTER_INVALID, "too many topic levels")
    return shared


def is_wildcard_filter(topic_filter: str) -> bool:
    """True if the filter contains `+` or `#` (so it can match more than one name)."""
    return "+" in topic_filter or "#" in topic_filter


def topic_matches(topic_filter: str, topic: str) -> bool:
    """Does a (valid, non-shared) filter match a topic name? Reference implementation.

    For one-off checks (retained messages, ACLs); routing many filters uses
    `gateway.routing.topic_trie.TopicTrie`. A filter starting with a wildcard does not
    match a name starting with `$` (MQTT-4.7.2-1).
    """
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    f_levels = topic_filter.split("/")
    t_levels = topic.split("/")
    for i, level in enumerate(f_levels):
        if level == "#":
            return True  # matches the parent level too: "a/#" matches "a"
        if i >= len(t_levels):
            return False
        if level != "+" and level != t_levels[i]:
            return False
    return len(f_levels) == len(t_levels)


def filter_matcher(topic_filter: str) -> Callable[[str], bool]:
    """`topic_matches(topic_filter, topic)` as a function of the topic, the filter's work
    done once (a delivery checks every entry it reads): a filter whose only wildcard is a
    last `+` level is a prefix test and a search for `/`; others keep their levels split."""
    if topic_filter.endswith("/+") and "+" not in topic_filter[:-2] and "#" not in topic_filter:
        prefix = topic_filter[:-1]
        n = len(prefix)
        return lambda topic: topic.startswith(prefix) and topic.find("/", n) < 0
    f_levels = topic_filter.split("/")
    dollar_blind = topic_filter[:1] in ("+", "#")
    count = len(f_levels)
    hash_at = f_levels.index("#") if f_levels[-1] == "#" else -1

    def match(topic: str) -> bool:
        if dollar_blind and topic.startswith("$"):
            return False
        t_levels = topic.split("/")
        if hash_at < 0:
            if len(t_levels) != count:
                return False
        elif len(t_levels) < hash_at:
            return False
        for i, level in enumerate(f_levels):
            if i == hash_at:
                return True
            if level != "+" and level != t_levels[i]:
                return False
        return True

    return match
