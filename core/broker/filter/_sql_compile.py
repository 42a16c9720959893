"""Type-check an SQL92 selector AST and turn it into nested Python closures.

Evaluation is three-valued, as in RocketMQ (ActiveMQ's JMS selector semantics): a boolean
closure returns True, False or None (unknown). A missing property is NULL; a comparison
involving NULL is unknown; ``unknown AND false`` is false, ``unknown OR true`` is true,
``NOT unknown`` is unknown; a message matches only when the whole expression is True.

Property values are strings. Compared with a numeric literal, a value is converted the
way Java converts it (``Long.valueOf`` for an integer literal, ``Double.valueOf`` for a
decimal one); a value that does not convert makes the comparison unknown. RocketMQ
throws there, which fails the whole expression for that message; unknown gives the same
answer except under an OR with another true branch, where we match and Java does not.

Compile-time checks mirror RocketMQ's (``ComparisonExpression.check*``) and add a few
for combinations that can never be true there (they throw at evaluation time in Java):
strings, booleans and NULL cannot be ordered; NULL cannot be compared with ``=``; IN
needs a property; a string or number alone is not a condition; booleans are not compared
with string or number literals.

Kinds of compiled values (static, known at compile time):
``bool`` (closure or constant True/False/None), ``prop`` (property name), ``str``,
``num`` and ``null`` (constants).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

from core.broker.filter._sql_parser import (
    And,
    Between,
    BoolLit,
    Compare,
    In,
    IsNull,
    Node,
    Not,
    NullLit,
    NumLit,
    Or,
    Prop,
    StrLit,
    StrMatch,
)
from core.broker.filter.errors import FilterParseError

Props = Mapping[str, str]
BoolFn = Callable[[Props], "bool | None"]

_LONG_MIN = -(1 << 63)
_LONG_MAX = (1 << 63) - 1
# Java's String.trim() (inside Double.valueOf) strips every char <= ' '.
_JAVA_TRIM = "".join(map(chr, range(0x21)))
# Double.valueOf's decimal syntax, with optional f/d suffix. NaN is left out on purpose:
# Java orders NaN above every number, which would make `a > 1` true for a = "NaN".
# Every character has exactly one way to match (the digits before a dot belong to the
# first group, those after it to the optional fraction), so a failing match costs linear
# time. The former `[0-9]+\.?[0-9]*` could split a run of digits at any point and made a
# 20 kB property take seconds to reject.
_JAVA_DOUBLE = re.compile(
    r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?|Infinity)"
)
# Property values longer than this never convert to a number: the comparison is unknown
# (FilterLimits.max_number_length, where the default is explained).
DEFAULT_MAX_NUMBER_LENGTH = 256

_ORDER = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
# `5 < a` is `a > 5`.
_FLIP = {">": "<", ">=": "<=", "<": ">", "<=": ">="}


def to_long(text: str, max_length: int = DEFAULT_MAX_NUMBER_LENGTH) -> int | None:
    """Java ``Long.valueOf``: optional sign and decimal digits, 64-bit range; else None.

    Text longer than ``max_length`` characters is None without being looked at."""
    if len(text) > max_length:
        return None
    body = text[1:] if text[:1] in ("+", "-") else text
    if not body.isdecimal():  # also rejects "", spaces and "_" that int() would take
        return None
    try:
        value = int(text)
    except ValueError:  # more than 4300 digits
        return None
    return value if _LONG_MIN <= value <= _LONG_MAX else None


def to_double(text: str, max_length: int = DEFAULT_MAX_NUMBER_LENGTH) -> float | None:
    """Java ``Double.valueOf`` (decimal forms and Infinity, not NaN or hex); else None.

    Text longer than ``max_length`` characters (before trimming) is None."""
    if len(text) > max_length:
        return None
    text = text.strip(_JAVA_TRIM)
    if _JAVA_DOUBLE.fullmatch(text) is None:
        return None
    if text[-1] in "fFdD":
        text = text[:-1]
    return float(text)


def _converter(literal: int | float, max_length: int) -> Callable[[str], int | float | None]:
    convert = to_double if isinstance(literal, float) else to_long
    if max_length == DEFAULT_MAX_NUMBER_LENGTH:
        return convert
    return lambda text: convert(text, max_length)


def _java_bool(text: str) -> bool:
    """Java ``Boolean.valueOf``: true only for "true", any case."""
    return len(text) == 4 and text.lower() == "true"


class _V:
    """A compiled sub-expression: its kind and either a constant or a closure."""

    __slots__ = ("kind", "const", "value", "fn")

    def __init__(self, kind: str, *, value: Any = None, fn: Callable | None = None) -> None:
        self.kind = kind
        # A property is known only per message; literals and folded results are constant.
        self.const = fn is None and kind != "prop"
        self.value = value
        self.fn = fn


def _const(value: bool | None) -> _V:
    return _V("bool", value=value)


def _dyn(fn: BoolFn) -> _V:
    return _V("bool", fn=fn)


def compile_node(node: Node, max_number_length: int = DEFAULT_MAX_NUMBER_LENGTH) -> _V:
    """Compile the whole expression; the result is a boolean value (const or closure).

    ``max_number_length``: longest property value converted to a number."""
    return _condition(_compile(node, max_number_length), node)


def _compile(node: Node, cap: int) -> _V:
    if isinstance(node, Prop):
        return _V("prop", value=node.name)
    if isinstance(node, StrLit):
        return _V("str", value=node.value)
    if isinstance(node, NumLit):
        return _V("num", value=node.value)
    if isinstance(node, BoolLit):
        return _const(node.value)
    if isinstance(node, NullLit):
        return _V("null")
    if isinstance(node, Not):
        return _not(_condition(_compile(node.operand, cap), node.operand))
    if isinstance(node, And | Or):
        operands = [_condition(_compile(child, cap), child) for child in node.operands]
        return _junction(operands, isinstance(node, Or))
    if isinstance(node, Compare):
        left, right = _compile(node.left, cap), _compile(node.right, cap)
        if node.op in ("=", "<>"):
            result = _equal(left, right, node, cap)
            return _not(result) if node.op == "<>" else result
        return _ordering(node.op, left, right, node, cap)
    if isinstance(node, IsNull):
        return _is_null(_compile(node.operand, cap), node.negated)
    if isinstance(node, Between):
        return _between(node, cap)
    if isinstance(node, In):
        return _in(node, cap)
    if isinstance(node, StrMatch):
        return _str_match(node, cap)
    raise AssertionError(f"unknown node {node!r}")  # pragma: no cover


def _condition(v: _V, node: Node) -> _V:
    """Use ``v`` where a boolean is required (AND/OR/NOT operands, the whole expression)."""
    if v.kind == "bool":
        return v
    if v.kind == "null":
        return _const(None)
    if v.kind == "prop":
        # RocketMQ's boolean cast of a property: its value is a String, never a Boolean,
        # so the result is FALSE when present and NULL when missing.
        name = v.value

        def prop_as_bool(p: Props) -> bool | None:
            return None if p.get(name) is None else False

        return _dyn(prop_as_bool)
    raise FilterParseError(f"expression will not result in a boolean value: {node}")


def _bool_fn(v: _V) -> BoolFn:
    if v.const:
        value = v.value
        return lambda p: value
    return v.fn  # type: ignore[return-value]


def _not(v: _V) -> _V:
    if v.const:
        return _const(None if v.value is None else not v.value)
    f = v.fn

    def not_(p: Props) -> bool | None:
        r = f(p)
        return None if r is None else not r

    return _dyn(not_)


def _junction(operands: list[_V], decider: bool) -> _V:
    """AND (``decider`` False) or OR (``decider`` True) in SQL's three-valued logic.

    Constant folding: the decider decides, its opposite drops out, NULL stays (it can turn
    the opposite into unknown but never hides the decider)."""
    other = not decider
    if any(v.const and v.value is decider for v in operands):
        return _const(decider)
    fns = [_bool_fn(v) for v in operands if not (v.const and v.value is other)]
    if not fns:
        return _const(other)
    if all(v.const for v in operands):
        return _const(None)
    if len(fns) == 1:
        return _dyn(fns[0])
    if len(fns) == 2:
        f, g = fns

        def junction2(p: Props) -> bool | None:
            a = f(p)
            if a is decider:
                return decider
            b = g(p)
            if b is decider:
                return decider
            return None if a is None or b is None else other

        return _dyn(junction2)
    fs = tuple(fns)

    def junction_n(p: Props) -> bool | None:
        unknown = False
        for fn in fs:
            r = fn(p)
            if r is decider:
                return decider
            if r is None:
                unknown = True
        return None if unknown else other

    return _dyn(junction_n)


def _equal(left: _V, right: _V, node: Node, cap: int) -> _V:
    """``left = right`` (``<>`` is its negation)."""
    kinds = {left.kind, right.kind}
    if "null" in kinds:
        raise FilterParseError(f"NULL cannot be compared with '=' or '<>', use IS NULL: {node}")
    if left.kind != right.kind and "bool" in kinds:
        # TRUE = 'x' is rejected by RocketMQ; 'x' = TRUE and (a = 1) = 5 can never match.
        if "prop" not in kinds:
            raise FilterParseError(f"a boolean cannot be compared with a literal: {node}")
        # prop = boolean: the property converts like Java's Boolean.valueOf.
        prop, other = (left, right) if left.kind == "prop" else (right, left)
        name, bfn = prop.value, _bool_fn(other)

        def prop_eq_bool(p: Props) -> bool | None:
            x = p.get(name)
            if x is None:
                return None
            b = bfn(p)
            return None if b is None else _java_bool(x) == b

        return _dyn(prop_eq_bool)
    if kinds == {"bool"}:
        if left.const and right.const:
            a, b = left.value, right.value
            return _const(None if a is None or b is None else a == b)
        f, g = _bool_fn(left), _bool_fn(right)

        def bool_eq(p: Props) -> bool | None:
            a = f(p)
            if a is None:
                return None
            b = g(p)
            return None if b is None else a == b

        return _dyn(bool_eq)
    if "num" in kinds:
        if kinds == {"num"}:
            return _const(left.value == right.value)
        num, other = (left, right) if left.kind == "num" else (right, left)
        return _scalar_vs_number(other, operator.eq, num.value, cap)
    # Strings and properties: string equality.
    if left.const and right.const:
        return _const(left.value == right.value)
    if left.kind == "prop" and right.kind == "prop":
        a_name, b_name = left.value, right.value

        def prop_eq_prop(p: Props) -> bool | None:
            a = p.get(a_name)
            b = p.get(b_name)
            return None if a is None or b is None else a == b

        return _dyn(prop_eq_prop)
    prop, lit = (left, right) if left.kind == "prop" else (right, left)
    name, s = prop.value, lit.value

    def prop_eq_str(p: Props) -> bool | None:
        x = p.get(name)
        return None if x is None else x == s

    return _dyn(prop_eq_str)


def _scalar_vs_number(
    v: _V, op: Callable[[Any, Any], bool], number: int | float, cap: int
) -> _V:
    """``op(convert(v), number)`` for a property or string literal ``v``."""
    convert = _converter(number, cap)
    if v.kind == "str":
        x = convert(v.value)
        return _const(None if x is None else op(x, number))
    name = v.value

    def prop_vs_number(p: Props) -> bool | None:
        x = p.get(name)
        if x is None:
            return None
        y = convert(x)
        return None if y is None else op(y, number)

    return _dyn(prop_vs_number)


def _ordering(op: str, left: _V, right: _V, node: Node, cap: int) -> _V:
    """``> >= < <=``: only numbers and properties (compared as numbers) may be ordered."""
    for v in (left, right):
        if v.kind not in ("prop", "num"):
            what = {"str": "a string", "bool": "a boolean", "null": "NULL"}[v.kind]
            raise FilterParseError(f"{what} cannot be compared with '{op}': {node}")
    if left.kind == "num" and right.kind == "num":
        return _const(_ORDER[op](left.value, right.value))
    if right.kind == "num":
        return _scalar_vs_number(left, _ORDER[op], right.value, cap)
    if left.kind == "num":
        return _scalar_vs_number(right, _ORDER[_FLIP[op]], left.value, cap)
    # Two properties: RocketMQ converts both with Double.valueOf.
    a_name, b_name, cmp = left.value, right.value, _ORDER[op]

    def prop_vs_prop(p: Props) -> bool | None:
        a = p.get(a_name)
        b = p.get(b_name)
        if a is None or b is None:
            return None
        x = to_double(a, cap)
        y = to_double(b, cap)
        return None if x is None or y is None else cmp(x, y)

    return _dyn(prop_vs_prop)


def _between(node: Between, cap: int) -> _V:
    value = _compile(node.operand, cap)
    low, high = _compile(node.low, cap), _compile(node.high, cap)
    if node.negated:
        return _junction(
            [_ordering("<", value, low, node, cap), _ordering(">", value, high, node, cap)], True
        )
    if low.kind == "num" and high.kind == "num" and high.value < low.value:
        # RocketMQ refuses an empty range at compile time (createBetween).
        raise FilterParseError(f"BETWEEN bounds are reversed ({low.value} > {high.value}): {node}")
    return _junction(
        [_ordering(">=", value, low, node, cap), _ordering("<=", value, high, node, cap)], False
    )


def _in(node: In, cap: int) -> _V:
    operand = _compile(node.operand, cap)
    if operand.kind != "prop":
        raise FilterParseError(f"IN needs a property on its left: {node}")
    name, values, negated = operand.value, frozenset(node.values), node.negated

    def in_(p: Props) -> bool | None:
        x = p.get(name)
        if x is None:
            return None
        return (x in values) is not negated

    return _dyn(in_)


def _str_match(node: StrMatch, cap: int) -> _V:
    operand = _compile(node.operand, cap)
    if operand.kind not in ("prop", "str"):
        raise FilterParseError(f"{node.op} needs a property or a string on its left: {node}")
    pattern, negated = node.pattern, node.negated
    test: Callable[[str, str], bool] = {
        "CONTAINS": operator.contains,
        "STARTSWITH": str.startswith,
        "ENDSWITH": str.endswith,
    }[node.op]
    # RocketMQ: an empty pattern or a missing property gives FALSE, for the NOT forms
    # too; these operators are two-valued.
    if not pattern:
        return _const(False)
    if operand.kind == "str":
        return _const(test(operand.value, pattern) is not negated)
    name = operand.value

    def str_match(p: Props) -> bool:
        x = p.get(name)
        if x is None:
            return False
        return test(x, pattern) is not negated

    return _dyn(str_match)


def _is_null(v: _V, negated: bool) -> _V:
    if v.kind == "prop":
        name = v.value
        if negated:
            return _dyn(lambda p: p.get(name) is not None)
        return _dyn(lambda p: p.get(name) is None)
    if v.kind == "bool" and not v.const:
        f = v.fn
        if negated:
            return _dyn(lambda p: f(p) is not None)
        return _dyn(lambda p: f(p) is None)
    return _const((v.value is None) is not negated)
