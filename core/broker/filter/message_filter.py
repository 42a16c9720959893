"""Store-facing message filters, built from a pull's subscription (docs/protocol.md §5.2).

While serving a pull the store asks the filter twice, as RocketMQ's ``MessageFilter``
does: ``is_matched_by_consume_queue(tags_code)`` for every consume-queue unit it scans
(cheap: only the unit's tag hash, docs/protocol.md §7.10), then ``is_matched_by_commit_log(record)`` for
each unit that passed, with the stored record (docs/protocol.md §7.1) as a memoryview of the CommitLog.

* TAG subscriptions filter in the consume queue by hash code; the commit-log check passes
  everything because the client re-checks the exact tag (RocketMQ's behaviour). Our own
  gateways, which hand messages on without a client-side check, use ``exact=True``.
* SQL92 subscriptions cannot be decided from the consume queue (RocketMQ's bloom-filter
  extension is not implemented), so they evaluate the record's properties. ``TAGS`` is an
  ordinary property there.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from core.broker.filter.errors import FilterParseError
from core.broker.filter.sql92 import (
    DEFAULT_FILTER_LIMITS,
    FilterLimits,
    SqlFilter,
    compile_sql92,
)
from core.broker.filter.tags import TagSubscription, parse_tag_expression
from core.common.codec import record_properties
from core.common.properties import MessageConst
from core.common.taghash import tag_hash

# What decoding a damaged record may raise (RecordError is a ValueError; a short buffer can
# also surface as struct.error or IndexError).
_DAMAGED = (ValueError, IndexError, struct.error)

__all__ = [
    "ExpressionType",
    "MessageFilter",
    "SqlMessageFilter",
    "TagMessageFilter",
    "build_message_filter",
]


class ExpressionType:
    """Values of the pull/heartbeat ``expressionType`` field (Java ``ExpressionType``)."""

    TAG = "TAG"
    SQL92 = "SQL92"

    @staticmethod
    def is_tag_type(expression_type: str | None) -> bool:
        """Java treats a missing or empty type as TAG (the C++ client omits the field)."""
        return not expression_type or expression_type == ExpressionType.TAG


@runtime_checkable
class MessageFilter(Protocol):
    """What the store calls while scanning a queue for a pull."""

    def is_matched_by_consume_queue(self, tags_code: int) -> bool:
        """Decide from a consume-queue unit's tag hash code alone (False skips the unit)."""
        ...

    def is_matched_by_commit_log(self, record: memoryview | bytes) -> bool:
        """Decide from the whole stored record (called only for units that passed)."""
        ...

    def matches_properties(self, props: Mapping[str, str]) -> bool:
        """Decide from already-decoded properties (for callers that have them)."""
        ...


class TagMessageFilter:
    """Filter of a TAG subscription (``TagA || TagB``).

    ``exact=False`` (RocketMQ): only the consume-queue hash check filters.
    ``exact=True``: the commit-log check also compares the record's ``TAGS`` property
    with the subscribed tags, which removes hash collisions for consumers that do not
    re-filter.
    """

    __slots__ = ("subscription", "exact", "_codes", "_tags", "_match_all")

    def __init__(self, subscription: TagSubscription | str | None, *, exact: bool = False) -> None:
        if not isinstance(subscription, TagSubscription):
            subscription = parse_tag_expression(subscription)
        self.subscription = subscription
        self.exact = exact
        self._codes = subscription.codes
        self._tags = subscription.tags
        self._match_all = subscription.match_all

    def is_matched_by_consume_queue(self, tags_code: int) -> bool:
        if self._match_all or tags_code in self._codes:
            return True
        if -0x80000000 <= tags_code <= 0x7FFFFFFF:
            return False
        return self.subscription.matches_code(tags_code)  # rare: an int64 outside int32

    def is_matched_by_commit_log(self, record: memoryview | bytes) -> bool:
        if not self.exact or self._match_all:
            return True
        try:
            props = record_properties(record)
        except _DAMAGED:
            return False  # a damaged record matches nothing (Java: decode fails → false)
        return props.get(MessageConst.TAGS) in self._tags

    def matches_properties(self, props: Mapping[str, str]) -> bool:
        """The answer the two store checks together give for a message with these
        properties (by hash code unless ``exact``)."""
        if self._match_all:
            return True
        tag = props.get(MessageConst.TAGS)
        if self.exact:
            return tag in self._tags
        return self.subscription.matches_code(tag_hash(tag))

    def __repr__(self) -> str:
        return f"TagMessageFilter({self.subscription.sub_string!r}, exact={self.exact})"


class SqlMessageFilter:
    """Filter of an SQL92 subscription: every consume-queue unit is a candidate, and the
    record's properties decide."""

    __slots__ = ("sql",)

    def __init__(self, sql: SqlFilter | str, limits: FilterLimits = DEFAULT_FILTER_LIMITS) -> None:
        self.sql = sql if isinstance(sql, SqlFilter) else compile_sql92(sql, limits)

    def is_matched_by_consume_queue(self, tags_code: int) -> bool:
        return True

    def is_matched_by_commit_log(self, record: memoryview | bytes) -> bool:
        try:
            props = record_properties(record)
        except _DAMAGED:
            return False
        return self.sql.matches(props)

    def matches_properties(self, props: Mapping[str, str]) -> bool:
        return self.sql.matches(props)

    def __repr__(self) -> str:
        return f"SqlMessageFilter({self.sql.expression!r})"


def build_message_filter(
    expression_type: str | None,
    expression: str | None,
    *,
    exact_tags: bool = False,
    limits: FilterLimits = DEFAULT_FILTER_LIMITS,
) -> TagMessageFilter | SqlMessageFilter | None:
    """The filter for a pull's subscription, or None when it matches every message.

    ``expression_type`` is ``TAG`` (also when None or empty) or ``SQL92``; anything else,
    an empty SQL92 expression or an invalid one raises FilterParseError, which the broker
    answers with SUBSCRIPTION_PARSE_FAILED (23).
    """
    if ExpressionType.is_tag_type(expression_type):
        if expression is not None and len(expression) > limits.max_tag_expression_length:
            raise FilterParseError(
                f"tag expression is {len(expression)} characters long, "
                f"the limit is {limits.max_tag_expression_length}"
            )
        subscription = parse_tag_expression(expression)
        if subscription.match_all:
            return None
        return TagMessageFilter(subscription, exact=exact_tags)
    if expression_type == ExpressionType.SQL92:
        if expression is None:
            raise FilterParseError("SQL92 expression is empty")
        return SqlMessageFilter(compile_sql92(expression, limits))
    raise FilterParseError(f"unsupported expression type {expression_type!r}")
