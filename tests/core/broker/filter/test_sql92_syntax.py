"""SQL92 selector: tokens, grammar, precedence, compile-time errors and limits."""

from __future__ import annotations

import pytest

from core.broker.filter import (
    DEFAULT_MAX_EXPRESSION_LENGTH,
    DEFAULT_MAX_NESTING_DEPTH,
    FilterLimits,
    FilterParseError,
    SqlFilter,
    compile_sql92,
)
from core.remoting.codes import ResponseCode


def ev(expression: str, **props: str) -> bool | None:
    return compile_sql92(expression).evaluate(props)


def rejects(expression: str, limits: FilterLimits | None = None) -> FilterParseError:
    with pytest.raises(FilterParseError) as info:
        if limits is None:
            compile_sql92(expression)
        else:
            compile_sql92(expression, limits)
    return info.value


# --- tokens ----------------------------------------------------------------------------


def test_keywords_are_case_insensitive() -> None:
    expr = "a is not null and B in ('x') or not (c between 1 and 2) AnD d Contains 'q'"
    f = compile_sql92(expr)
    assert f.matches({"a": "1", "B": "x"})
    assert not f.matches({"B": "x"})


def test_property_names_are_case_sensitive() -> None:
    assert ev("a = 'x'", A="x") is None
    assert ev("a = 'x'", a="x") is True


@pytest.mark.parametrize(
    ("literal", "value"),
    [
        ("'it''s'", "it's"), ("''''", "'"), ("''", ""), ("'a''''b'", "a''b"),
        ("'中文 ☃'", "中文 ☃"), ("'line\nbreak'", "line\nbreak"),
        ("'--not a comment'", "--not a comment"),
    ],
)
def test_string_literals_and_quote_escape(literal: str, value: str) -> None:
    assert ev(f"a = {literal}", a=value) is True
    assert ev(f"a = {literal}", a=value + "x") is False


def test_identifiers() -> None:
    assert ev("$a.b_c9 = 'x'", **{"$a.b_c9": "x"}) is True
    assert ev("_x = 'y'", _x="y") is True
    assert compile_sql92("x.y = 'a' AND TAGS = 'b'").property_names == {"x.y", "TAGS"}


def test_keyword_cannot_be_a_property_but_may_prefix_one() -> None:
    rejects("in = 'x'")
    assert ev("index = 'x'", index="x") is True
    assert ev("and.x = 'x'", **{"and.x": "x"}) is True


@pytest.mark.parametrize(
    ("literal", "prop", "expected"),
    [
        ("10L", "10", True), ("10l", "10", True), ("1.5", "1.5", True), (".5", "0.5", True),
        ("5.", "5", True), ("1e3", "1000", True), ("1.5E-3", "0.0015", True),
        ("9223372036854775807", "9223372036854775807", True), ("0", "0", True),
    ],
)
def test_numeric_literals(literal: str, prop: str, expected: bool) -> None:
    assert ev(f"a = {literal}", a=prop) is expected


@pytest.mark.parametrize(
    "expression",
    [
        "a = 007",  # no octal: lexes as 0 0 7 as in JavaCC
        "a = 0L",
        "a = 0x1F",
        "a = 9223372036854775808",
        "a = -9223372036854775808",  # Java parses the literal before the minus
        "a = 1" + "0" * 5000,
        "a = 1e999",
        "a = 5e",
        "a = 1.5.5",
    ],
)
def test_bad_numeric_literals(expression: str) -> None:
    rejects(expression)


def test_comments_are_skipped() -> None:
    assert ev("a = '1' -- trailing\nAND b = '2'", a="1", b="2") is True
    assert ev("/* lead */ a = '1' /* mid * / */ AND b = '2' -- end", a="1", b="2") is True
    assert rejects("a = '1' /* never closed").position == 8


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("a != 1", "'<>'"),
        ("a == 1", "unexpected"),
        ("a = 1 && b = 2", "unexpected character"),
        ("a = \"x\"", "unexpected character"),
        ("a = 'x", "unterminated string"),
        ("a = 'x' b = 'y'", "unexpected"),
        ("(a = 'x'", "')'"),
        ("a = 'x')", "unexpected"),
        ("a IN ()", "string literal"),
        ("a IN ('x',)", "string literal"),
        ("a IN 'x'", "'('"),
        ("a BETWEEN 1 2", "AND"),
        ("a IS 'x'", "NULL"),
        ("a CONTAINS b", "string literal"),
        ("a NOT 'x'", "unexpected"),
        ("a LIKE 'x%'", "unexpected"),
        ("a = ", "unexpected end of input"),
        ("AND", "unexpected"),
        ("a = 1 +", "unexpected operator '+'"),
        ("a = 1 + 2", "unexpected"),  # no arithmetic in RocketMQ
        ("a = .", "unexpected character"),
    ],
)
def test_syntax_errors(expression: str, fragment: str) -> None:
    assert fragment in str(rejects(expression))


def test_syntax_error_reports_position() -> None:
    err = rejects("a = 'x' AND b ! 'y'")
    assert err.position == 14
    assert "position 14" in str(err)


def test_parse_error_carries_subscription_parse_failed() -> None:
    err = rejects("a >")
    assert err.response_code == ResponseCode.SUBSCRIPTION_PARSE_FAILED == 23
    assert isinstance(err, ValueError)


@pytest.mark.parametrize("expression", ["", "   ", "\n\t", "/* only a comment */", "-- x"])
def test_empty_expressions_are_rejected(expression: str) -> None:
    rejects(expression)


def test_non_string_is_rejected() -> None:
    with pytest.raises(FilterParseError):
        compile_sql92(None)  # type: ignore[arg-type]
    with pytest.raises(FilterParseError):
        compile_sql92(b"a = 'x'")  # type: ignore[arg-type]


# --- precedence ------------------------------------------------------------------------


def test_and_binds_tighter_than_or() -> None:
    props = {"a": "1", "b": "2", "c": "2"}
    assert compile_sql92("a = 1 OR b = 1 AND c = 1").matches(props)
    assert not compile_sql92("(a = 1 OR b = 1) AND c = 1").matches(props)
    assert compile_sql92("b = 1 AND c = 1 OR a = 1").matches(props)


def test_between_and_is_not_a_logical_and() -> None:
    f = compile_sql92("a BETWEEN 1 AND 5 AND b = 'x'")
    assert f.matches({"a": "3", "b": "x"})
    assert not f.matches({"a": "3", "b": "y"})
    assert not f.matches({"a": "7", "b": "x"})


def test_not_is_unary_and_binds_tightest_like_rocketmq() -> None:
    # RocketMQ parses `NOT a IS NULL` as `(NOT a) IS NULL`: NOT of a present (string)
    # property is TRUE, of a missing one NULL.
    f = compile_sql92("NOT a IS NULL")
    assert f.matches({})
    assert not f.matches({"a": "1"})
    g = compile_sql92("NOT (a IS NULL)")
    assert g.matches({"a": "1"}) and not g.matches({})
    # `(NOT a) = 'x'` can never be true in RocketMQ; we reject it at compile time.
    assert "boolean" in str(rejects("NOT a = 'x'"))
    rejects("NOT a > 1")
    rejects("NOT a IN ('x')")
    assert compile_sql92("NOT (a = 'x')").matches({"a": "y"})


def test_not_forms_of_comparison_operators() -> None:
    props = {"a": "5", "s": "hello"}
    assert compile_sql92("a NOT BETWEEN 6 AND 9").matches(props)
    assert compile_sql92("s NOT IN ('x', 'y')").matches(props)
    assert compile_sql92("s NOT CONTAINS 'z'").matches(props)
    assert compile_sql92("s NOT STARTSWITH 'z'").matches(props)
    assert compile_sql92("s NOT ENDSWITH 'z'").matches(props)


def test_comparison_chains_are_left_associative() -> None:
    # ((a = 'x') = TRUE) = FALSE
    f = compile_sql92("a = 'x' = TRUE = FALSE")
    assert f.evaluate({"a": "y"}) is True
    assert f.evaluate({"a": "x"}) is False
    assert f.evaluate({}) is None
    # (a > 1) > 2 orders a boolean
    rejects("a > 1 > 2")


def test_unary_plus_and_minus() -> None:
    assert ev("+a = 'x'", a="x") is True
    assert ev("a > +5", a="6") is True
    assert ev("a < -3", a="-4") is True
    assert ev("a = - -5", a="5") is True
    assert ev("a = -(5)", a="-5") is True
    assert ev("a = -1.5", a="-1.5") is True
    assert "numeric literals" in str(rejects("-a > 1"))
    rejects("a = -'x'")
    rejects("-TRUE")


def test_ast_is_immutable_and_printable() -> None:
    f = compile_sql92("a = 'x''y' AND NOT (b IN ('1','2') OR c IS NOT NULL)")
    assert str(f.ast) == "((a = 'x''y') AND (NOT ((b IN ('1', '2')) OR (c IS NOT NULL))))"
    with pytest.raises(AttributeError):
        f.ast.operands = ()  # type: ignore[misc,union-attr]
    # the printed form parses back to the same tree
    assert compile_sql92(str(f.ast)).ast == f.ast


# --- compile-time type checks ----------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        "a > 'x'", "'x' < a", "a >= 'x'", "a <= 'x'", "'a' > 'b'",
        "a > TRUE", "FALSE < 1", "(a = 'x') > 1", "a > NULL", "NULL < 1",
        "a BETWEEN 'a' AND 'z'", "a BETWEEN 1 AND 'z'", "a NOT BETWEEN 'a' AND 5",
    ],
)
def test_ordering_strings_booleans_null_is_rejected(expression: str) -> None:
    assert "cannot be compared" in str(rejects(expression))


@pytest.mark.parametrize(
    "expression",
    [
        "a = NULL", "NULL = a", "a <> NULL", "NULL = NULL",
        "TRUE = 'x'", "'x' = TRUE", "(a = 'x') = 1", "1 = FALSE",
        "'x' IN ('x')", "5 IN ('5')", "(a = 'x') IN ('x')",
        "5 CONTAINS '5'", "TRUE STARTSWITH 'T'",
        "'x'", "5", "a = 'x' AND 'y'", "NOT 5", "1.5 OR a = 'x'",
        "a BETWEEN 5 AND 1",
    ],
)
def test_ill_typed_expressions_are_rejected(expression: str) -> None:
    rejects(expression)


def test_reversed_not_between_is_allowed_like_rocketmq() -> None:
    f = compile_sql92("a NOT BETWEEN 5 AND 1")
    assert f.matches({"a": "3"})  # 3 < 5 OR 3 > 1


# --- limits ----------------------------------------------------------------------------


def test_expression_length_limit() -> None:
    assert DEFAULT_MAX_EXPRESSION_LENGTH == 4096
    ok = "a = '" + "x" * (4096 - 6) + "'"
    assert len(ok) == 4096
    compile_sql92(ok)
    err = rejects(ok + " ")
    assert "4096" in str(err)
    small = FilterLimits(max_expression_length=10)
    compile_sql92("a = 'x'", small)
    rejects("a = 'xxxxxxx'", small)


def test_parenthesis_depth_limit() -> None:
    assert DEFAULT_MAX_NESTING_DEPTH == 64
    compile_sql92("(" * 64 + "a = 'x'" + ")" * 64)
    assert "nested" in str(rejects("(" * 65 + "a = 'x'" + ")" * 65))
    rejects("(" * 100_000)  # never a RecursionError
    limits = FilterLimits(max_nesting_depth=3)
    compile_sql92("(((a = 'x')))", limits)
    rejects("((((a = 'x'))))", limits)


def test_unary_depth_limit() -> None:
    compile_sql92("NOT " * 60 + "a")
    rejects("NOT " * 65 + "a")
    rejects("- " * 65 + "5 = a")
    rejects("+ " * 1000 + "a")


def test_tree_height_limit_catches_left_deep_chains() -> None:
    # No parentheses, but each `= TRUE` adds a level to the tree.
    rejects("a = 'x'" + " = TRUE" * 70)
    compile_sql92("a = 'x'" + " = TRUE" * 20)


def test_long_and_or_chains_are_flat_not_deep() -> None:
    limits = FilterLimits(max_expression_length=200_000)
    terms = [f"a = '{i}'" for i in range(5000)]
    f = compile_sql92(" OR ".join(terms), limits)
    assert f.matches({"a": "4999"})
    assert not f.matches({"a": "5000"})
    g = compile_sql92(" AND ".join(f"p{i} IS NULL" for i in range(5000)), limits)
    assert g.matches({})
    assert not g.matches({"p4321": "x"})


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError):
        FilterLimits(max_expression_length=0)
    with pytest.raises(ValueError):
        FilterLimits(max_nesting_depth=0)
    with pytest.raises(ValueError):
        FilterLimits(max_nesting_depth=10_000)


def test_compiled_filters_are_cached_and_shared() -> None:
    f = compile_sql92("a = 'cache-me'")
    assert compile_sql92("a = 'cache-me'") is f
    assert isinstance(f, SqlFilter)
    assert repr(f) == "SqlFilter(\"a = 'cache-me'\")"
