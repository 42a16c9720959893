"""RocketMQ's SQL92 message selector (``MessageSelector.bySql``), evaluated safely.

This replaces the old filter server, which compiled and ran Java classes uploaded by
clients (docs/protocol.md §5.2): an expression here is tokenized and parsed by
hand into a tree of small immutable nodes, type-checked, then turned into nested Python
closures. Nothing is ever passed to ``eval``/``exec``; the only thing a subscriber
controls is which of a fixed set of closures are built and with which constants.

Language (as in RocketMQ; details in ``_sql_lexer``, ``_sql_parser``, ``_sql_compile``)::

    a = 'x'   a <> 'x'   a > 5   a >= 1.5   a < -3   a <= 10L
    a BETWEEN 1 AND 9   a NOT BETWEEN 1 AND 9
    a IN ('x', 'y')     a NOT IN ('x')
    a IS NULL           a IS NOT NULL
    a CONTAINS 'x'      a NOT CONTAINS 'x'   (also STARTSWITH / ENDSWITH, RocketMQ 5.1.3+)
    AND  OR  NOT  ( )   TRUE  FALSE  NULL

Compile once per subscription (results are cached), then call ``matches`` per message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from core.broker.filter._sql_compile import DEFAULT_MAX_NUMBER_LENGTH, compile_node
from core.broker.filter._sql_parser import Node, parse, property_names
from core.broker.filter.errors import FilterParseError

__all__ = [
    "DEFAULT_FILTER_LIMITS",
    "DEFAULT_MAX_EXPRESSION_LENGTH",
    "DEFAULT_MAX_NESTING_DEPTH",
    "DEFAULT_MAX_NUMBER_LENGTH",
    "DEFAULT_MAX_TAG_EXPRESSION_LENGTH",
    "FilterLimits",
    "FilterParseError",
    "SqlFilter",
    "compile_sql92",
]

# RocketMQ has no such limits; an expression is bounded there only by the request size.
# 4 KiB holds an IN list of a few hundred ids, and 64 levels is far beyond what people
# write by hand while keeping parsing and evaluation well inside Python's stack.
DEFAULT_MAX_EXPRESSION_LENGTH = 4096
DEFAULT_MAX_NESTING_DEPTH = 64
# A tag expression ("TagA || TagB") costs a Java hash per character, in Python: about
# 0.4 us a character, so a 16 MiB one held the loop for seconds. 16 KiB is ~1000 tags.
DEFAULT_MAX_TAG_EXPRESSION_LENGTH = 16384
# Each nesting level costs up to six parser frames; above this the interpreter's own
# recursion limit (1000) would be at risk.
_HARD_MAX_NESTING_DEPTH = 128


@dataclass(frozen=True, slots=True)
class FilterLimits:
    """Limits applied when compiling a subscription expression.

    ``max_expression_length``: characters in the expression (default 4096).
    ``max_nesting_depth``: parentheses/unary operators nested, and height of the parsed
    tree (default 64, at most 128).
    Exceeding either raises FilterParseError (SUBSCRIPTION_PARSE_FAILED).
    ``max_number_length``: the longest property value (in characters) that a comparison
    with a number converts (default 256); a longer value makes the comparison unknown, as
    a value that is not a number does. The publisher controls property values (up to
    32 KiB): the cap keeps the per-message work small whatever they send. A Java
    ``long`` needs at most 20 characters and the shortest text of any ``double`` at most
    24, so 256 leaves room for padding, leading zeros and long decimal expansions.
    ``max_tag_expression_length``: characters in a TAG expression (default 16384); a
    longer one raises FilterParseError (SUBSCRIPTION_PARSE_FAILED).
    """

    max_expression_length: int = DEFAULT_MAX_EXPRESSION_LENGTH
    max_nesting_depth: int = DEFAULT_MAX_NESTING_DEPTH
    max_number_length: int = DEFAULT_MAX_NUMBER_LENGTH
    max_tag_expression_length: int = DEFAULT_MAX_TAG_EXPRESSION_LENGTH

    def __post_init__(self) -> None:
        if self.max_expression_length < 1:
            raise ValueError("max_expression_length must be at least 1")
        if not 1 <= self.max_nesting_depth <= _HARD_MAX_NESTING_DEPTH:
            raise ValueError(f"max_nesting_depth must be within 1..{_HARD_MAX_NESTING_DEPTH}")
        if self.max_number_length < 1:
            raise ValueError("max_number_length must be at least 1")


DEFAULT_FILTER_LIMITS = FilterLimits()


class SqlFilter:
    """A compiled SQL92 selector. Immutable and safe to share between subscriptions.

    ``expression`` is the source text, ``ast`` the parsed tree, ``property_names`` the
    properties it reads.
    """

    __slots__ = ("expression", "ast", "property_names", "_fn")

    def __init__(
        self, expression: str, ast: Node, max_number_length: int = DEFAULT_MAX_NUMBER_LENGTH
    ) -> None:
        self.expression = expression
        self.ast = ast
        self.property_names: frozenset[str] = property_names(ast)
        compiled = compile_node(ast, max_number_length)
        if compiled.const:
            value = compiled.value
            self._fn = lambda props: value
        else:
            self._fn = compiled.fn

    def matches(self, props: Mapping[str, str]) -> bool:
        """True when the expression is TRUE for a message with these properties."""
        return self._fn(props) is True

    def evaluate(self, props: Mapping[str, str]) -> bool | None:
        """The three-valued result: True, False or None (unknown)."""
        return self._fn(props)

    def __repr__(self) -> str:
        return f"SqlFilter({self.expression!r})"


def compile_sql92(expression: str, limits: FilterLimits = DEFAULT_FILTER_LIMITS) -> SqlFilter:
    """Compile a selector; raise FilterParseError for any invalid or over-limit input."""
    if not isinstance(expression, str):
        raise FilterParseError("SQL92 expression must be a string")
    if len(expression) > limits.max_expression_length:
        raise FilterParseError(
            f"expression is {len(expression)} characters long, "
            f"the limit is {limits.max_expression_length}"
        )
    if not expression.strip():
        # Java's FilterAPI.build: "Expression can't be null!"
        raise FilterParseError("SQL92 expression is empty")
    return _compile_cached(expression, limits)


@lru_cache(maxsize=1024)
def _compile_cached(expression: str, limits: FilterLimits) -> SqlFilter:
    # A pull carries its subscription each time (docs/protocol.md §5.2): cache so that the
    # broker compiles each distinct expression once. Errors are not cached; they cost
    # one bounded parse.
    try:
        ast = parse(expression, limits.max_nesting_depth)
        return SqlFilter(expression, ast, limits.max_number_length)
    except RecursionError:  # defence in depth: the depth limits should prevent it
        raise FilterParseError("expression nested too deeply") from None
