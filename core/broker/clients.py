"""Live producer and consumer channels of the broker (docs/protocol.md §5.5–§5.7).

A client registers its groups with HEART_BEAT on one connection; a channel is dropped when
its connection closes, when it unregisters, or after `client_channel_expiry_s` (Java:
120 s) without a heartbeat. Any change of a consumer group's membership or subscriptions
calls `on_consumer_change(group, connections)` so the broker can send
NOTIFY_CONSUMER_IDS_CHANGED to every remaining member (docs/protocol.md §5.14).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from core.broker.filter import DEFAULT_FILTER_LIMITS, FilterLimits, FilterParseError
from core.broker.filter.tags import parse_tag_expression

SUB_ALL = "*"
EXPRESSION_TAG = "TAG"
EXPRESSION_SQL92 = "SQL92"

CONSUME_TYPES = ("CONSUME_ACTIVELY", "CONSUME_PASSIVELY")
MESSAGE_MODELS = ("BROADCASTING", "CLUSTERING")
CONSUME_FROM_WHERE = (
    "CONSUME_FROM_LAST_OFFSET",
    "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
    "CONSUME_FROM_MIN_OFFSET",
    "CONSUME_FROM_MAX_OFFSET",
    "CONSUME_FROM_FIRST_OFFSET",
    "CONSUME_FROM_TIMESTAMP",
)


def enum_name(value: Any, names: tuple[str, ...], default: str) -> str:
    """Heartbeat enums arrive as ordinals from C++ and as names from Java (docs/protocol.md §6.2)."""
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return names[value] if 0 <= value < len(names) else default
    if isinstance(value, str):
        text = value.strip()
        if text.lstrip("-").isdigit():
            return enum_name(int(text), names, default)
        if text in names:
            return text
    return default


def check_expression_length(
    expression_type: str | None, expression: str | None,
    limits: FilterLimits = DEFAULT_FILTER_LIMITS,
) -> None:
    """FilterParseError (SUBSCRIPTION_PARSE_FAILED) when a peer's expression is longer
    than the filter limits allow; checked before anything parses or stores it."""
    if expression is None:
        return
    sql = (expression_type or EXPRESSION_TAG).upper() == EXPRESSION_SQL92
    limit = limits.max_expression_length if sql else limits.max_tag_expression_length
    if len(expression) > limit:
        raise FilterParseError(
            f"{'SQL92' if sql else 'tag'} expression is {len(expression)} characters long, "
            f"the limit is {limit}"
        )


def parse_tags(sub_string: str | None) -> tuple[list[str], frozenset[int]] | None:
    """`"TagA || TagB"` -> (tags, Java hash codes); None means "every tag" (`*` or blank).
    Hashes are computed here: the C++ heartbeat's codeSet is `atoi(tag)` garbage (docs/protocol.md §6.2)."""
    parsed = parse_tag_expression(sub_string)
    if parsed.match_all:
        return None
    return sorted(parsed.tags), parsed.codes


@dataclass
class SubscriptionData:
    """One topic subscription of a consumer group."""

    topic: str
    sub_string: str = SUB_ALL
    expression_type: str = EXPRESSION_TAG
    sub_version: int = 0
    tags_set: list[str] = field(default_factory=list)
    code_set: frozenset[int] | None = None  # None = all tags

    @classmethod
    def build(
        cls, topic: str, sub_string: str | None, expression_type: str | None = None,
        sub_version: int = 0,
    ) -> SubscriptionData:
        etype = (expression_type or EXPRESSION_TAG).upper()
        sub = sub_string if sub_string is not None else SUB_ALL
        if etype == EXPRESSION_TAG:
            parsed = parse_tags(sub)
            if parsed is None:
                return cls(topic, SUB_ALL, etype, sub_version)
            return cls(topic, sub, etype, sub_version, parsed[0], parsed[1])
        return cls(topic, sub, etype, sub_version)

    @classmethod
    def from_heartbeat(
        cls, raw: dict[str, Any], limits: FilterLimits = DEFAULT_FILTER_LIMITS
    ) -> SubscriptionData:
        """Parse one `subscriptionDataSet` entry (C++ or Java form, docs/protocol.md §6.2). ValueError for
        an unusable entry; FilterParseError (a ValueError) for an expression over the
        limits, before it is parsed."""
        topic = raw.get("topic")
        if not isinstance(topic, str) or not topic:
            raise ValueError("subscription without topic")
        try:
            version = int(str(raw.get("subVersion", 0) or 0))
        except ValueError:
            version = 0
        sub_string = raw.get("subString")
        sub_string = sub_string if isinstance(sub_string, str) else None
        etype = raw.get("expressionType")
        etype = etype if isinstance(etype, str) else None
        check_expression_length(etype, sub_string, limits)
        return cls.build(topic, sub_string, etype, version)

    def same_filter(self, other: SubscriptionData) -> bool:
        return (
            self.sub_string == other.sub_string
            and self.expression_type == other.expression_type
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "classFilterMode": False,
            "topic": self.topic,
            "subString": self.sub_string,
            "tagsSet": list(self.tags_set),
            "codeSet": sorted(self.code_set or ()),
            "subVersion": self.sub_version,
            "expressionType": self.expression_type,
        }


@dataclass
class ClientChannelInfo:
    """One client on one connection."""

    connection: Any
    client_id: str
    language: str = "JAVA"
    version: int = 0
    last_update: float = field(default_factory=time.monotonic)

    @property
    def remote_addr(self) -> str:
        return str(getattr(self.connection, "remote_addr", ""))

    def to_json(self) -> dict[str, Any]:
        return {
            "clientId": self.client_id,
            "clientAddr": self.remote_addr,
            "language": self.language,
            "version": self.version,
        }


@dataclass
class ConsumerGroupInfo:
    """Members and subscriptions of one consumer group."""

    group_name: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    channels: dict[Any, ClientChannelInfo] = field(default_factory=dict)
    subscriptions: dict[str, SubscriptionData] = field(default_factory=dict)

    def client_ids(self) -> list[str]:
        """Sorted ids of the live members: every member allocates queues over the same
        list (docs/protocol.md §5.7)."""
        return sorted({c.client_id for c in self.channels.values()})

    def connections(self) -> list[Any]:
        return list(self.channels)

    def update_subscriptions(self, subs: Iterable[SubscriptionData]) -> bool:
        """Replace the subscription set; True when a topic or a filter changed."""
        new = {s.topic: s for s in subs}
        changed = set(new) != set(self.subscriptions)
        for topic, sub in new.items():
            old = self.subscriptions.get(topic)
            if old is not None and not old.same_filter(sub):
                changed = True
        self.subscriptions = new
        return changed


class _GroupsByConnection:
    """The groups each connection is a member of (consumer and producer managers)."""

    _by_connection: dict[Any, set[str]]  # connection -> its groups

    def groups_of_connection(self, connection: Any) -> set[str]:
        """The groups `connection` is a member of (do not modify)."""
        return self._by_connection.get(connection) or set()

    def _left(self, group: str, connection: Any) -> None:
        mine = self._by_connection.get(connection)
        if mine is not None:
            mine.discard(group)
            if not mine:
                del self._by_connection[connection]


class ConsumerManager(_GroupsByConnection):
    """Consumer groups by name (docs/protocol.md §5.5)."""

    def __init__(
        self,
        *,
        expiry_s: float = 120.0,
        on_change: Callable[[str, list[Any]], None] | None = None,
    ) -> None:
        self.groups: dict[str, ConsumerGroupInfo] = {}
        self.expiry_s = expiry_s
        self.on_change = on_change
        self._by_connection: dict[Any, set[str]] = {}  # connection -> its groups

    def _changed(self, group: str) -> None:
        if self.on_change is None:
            return
        info = self.groups.get(group)
        conns = info.connections() if info is not None else []
        if conns:
            self.on_change(group, conns)

    def register(
        self,
        group: str,
        channel: ClientChannelInfo,
        *,
        consume_type: str,
        message_model: str,
        consume_from_where: str,
        subscriptions: list[SubscriptionData],
        notify: bool = True,
    ) -> bool:
        """Add/refresh a member; returns True (and notifies) when membership or
        subscriptions changed."""
        info = self.groups.get(group)
        if info is None:
            info = self.groups[group] = ConsumerGroupInfo(group)
        info.consume_type = consume_type
        info.message_model = message_model
        info.consume_from_where = consume_from_where
        old = info.channels.get(channel.connection)
        if old is not None and old.client_id == channel.client_id:
            old.last_update = time.monotonic()
            old.language, old.version = channel.language, channel.version
            new_member = False
        else:
            info.channels[channel.connection] = channel
            self._by_connection.setdefault(channel.connection, set()).add(group)
            new_member = True
        subs_changed = info.update_subscriptions(subscriptions)
        changed = new_member or subs_changed
        if changed and notify:
            self._changed(group)
        return changed

    def unregister(self, group: str, connection: Any, client_id: str | None = None,
                   *, notify: bool = True) -> bool:
        info = self.groups.get(group)
        if info is None:
            return False
        ch = info.channels.get(connection)
        if ch is None or (client_id and ch.client_id != client_id):
            return False
        del info.channels[connection]
        self._left(group, connection)
        if not info.channels:
            del self.groups[group]
        elif notify:
            self._changed(group)
        return True

    def connection_closed(self, connection: Any) -> list[str]:
        """Drop `connection` from every group; returns the groups it left."""
        left = []
        self._by_connection.pop(connection, None)
        for group, info in list(self.groups.items()):
            if info.channels.pop(connection, None) is None:
                continue
            left.append(group)
            if not info.channels:
                del self.groups[group]
            else:
                self._changed(group)
        return left

    def scan_expired(self, now: float | None = None) -> list[tuple[str, str, Any]]:
        """Remove members silent for more than `expiry_s`; returns (group, client id,
        connection) so the owner can close the connections, as Java's housekeeping does."""
        now = time.monotonic() if now is None else now
        removed = []
        for group, info in list(self.groups.items()):
            stale = [c for c, ch in info.channels.items() if now - ch.last_update > self.expiry_s]
            for conn in stale:
                removed.append((group, info.channels.pop(conn).client_id, conn))
                self._left(group, conn)
            if stale:
                if not info.channels:
                    del self.groups[group]
                else:
                    self._changed(group)
        return removed

    def get(self, group: str) -> ConsumerGroupInfo | None:
        return self.groups.get(group)

    def find_subscription(self, group: str, topic: str) -> SubscriptionData | None:
        info = self.groups.get(group)
        return None if info is None else info.subscriptions.get(topic)

    def groups_of_topic(self, topic: str) -> list[str]:
        return [g for g, info in self.groups.items() if topic in info.subscriptions]


class ProducerManager(_GroupsByConnection):
    """Producer groups by name; CHECK_TRANSACTION_STATE goes to one of their channels."""

    def __init__(self, *, expiry_s: float = 120.0) -> None:
        self.groups: dict[str, dict[Any, ClientChannelInfo]] = {}
        self.expiry_s = expiry_s
        self._by_connection: dict[Any, set[str]] = {}  # connection -> its groups

    def register(self, group: str, channel: ClientChannelInfo) -> None:
        channels = self.groups.setdefault(group, {})
        old = channels.get(channel.connection)
        if old is not None and old.client_id == channel.client_id:
            old.last_update = time.monotonic()
        else:
            channels[channel.connection] = channel
            self._by_connection.setdefault(channel.connection, set()).add(group)

    def unregister(self, group: str, connection: Any) -> bool:
        channels = self.groups.get(group)
        if not channels or channels.pop(connection, None) is None:
            return False
        self._left(group, connection)
        if not channels:
            del self.groups[group]
        return True

    def connection_closed(self, connection: Any) -> None:
        self._by_connection.pop(connection, None)
        for group, channels in list(self.groups.items()):
            if channels.pop(connection, None) is not None and not channels:
                del self.groups[group]

    def scan_expired(self, now: float | None = None) -> list[tuple[str, str, Any]]:
        """Like ConsumerManager.scan_expired: (group, client id, connection) removed."""
        now = time.monotonic() if now is None else now
        removed = []
        for group, channels in list(self.groups.items()):
            for conn in [c for c, ch in channels.items() if now - ch.last_update > self.expiry_s]:
                removed.append((group, channels.pop(conn).client_id, conn))
                self._left(group, conn)
            if not channels:
                del self.groups[group]
        return removed

    def connections_of_group(self, group: str) -> list[Any]:
        """Live producer connections of `group` (most recently heard from first)."""
        channels = self.groups.get(group) or {}
        ordered = sorted(channels.values(), key=lambda ch: ch.last_update, reverse=True)
        return [ch.connection for ch in ordered]

    def channels_of_group(self, group: str) -> list[ClientChannelInfo]:
        return list((self.groups.get(group) or {}).values())
