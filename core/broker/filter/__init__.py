"""Broker-side message filtering: tag subscriptions and SQL92 selectors.

Replaces RocketMQ's filter server (which ran classes uploaded by clients) with safe,
broker-side evaluation; see ``sql92`` for the language and ``message_filter`` for what
the store calls while serving a pull.
"""

from core.broker.filter.errors import FilterParseError
from core.broker.filter.message_filter import (
    ExpressionType,
    MessageFilter,
    SqlMessageFilter,
    TagMessageFilter,
    build_message_filter,
)
from core.broker.filter.sql92 import (
    DEFAULT_FILTER_LIMITS,
    DEFAULT_MAX_EXPRESSION_LENGTH,
    DEFAULT_MAX_NESTING_DEPTH,
    DEFAULT_MAX_NUMBER_LENGTH,
    DEFAULT_MAX_TAG_EXPRESSION_LENGTH,
    FilterLimits,
    SqlFilter,
    compile_sql92,
)
from core.broker.filter.tags import (
    SUB_ALL,
    TagSubscription,
    java_string_hash,
    parse_tag_expression,
)

__all__ = [
    "DEFAULT_FILTER_LIMITS",
    "DEFAULT_MAX_EXPRESSION_LENGTH",
    "DEFAULT_MAX_NESTING_DEPTH",
    "DEFAULT_MAX_NUMBER_LENGTH",
    "DEFAULT_MAX_TAG_EXPRESSION_LENGTH",
    "SUB_ALL",
    "ExpressionType",
    "FilterLimits",
    "FilterParseError",
    "MessageFilter",
    "SqlFilter",
    "SqlMessageFilter",
    "TagMessageFilter",
    "TagSubscription",
    "build_message_filter",
    "compile_sql92",
    "java_string_hash",
    "parse_tag_expression",
]
