"""SQL92 selector evaluation: three-valued logic, numbers vs strings, NULL, IN, BETWEEN."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from core.broker.filter import compile_sql92


def ev(expression: str, **props: str) -> bool | None:
    return compile_sql92(expression).evaluate(props)


# --- three-valued logic ----------------------------------------------------------------

# Conditions that are TRUE, FALSE and UNKNOWN for PROPS.
PROPS = {"t": "1"}
COND = {True: "t = '1'", False: "t = '2'", None: "u = '1'"}


def kleene_and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def kleene_or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    if a is None or b is None:
        return None
    return False


VALUES = [True, False, None]


@pytest.mark.parametrize("a", VALUES)
@pytest.mark.parametrize("b", VALUES)
def test_and_or_truth_tables(a: bool | None, b: bool | None) -> None:
    and_f = compile_sql92(f"{COND[a]} AND {COND[b]}")
    or_f = compile_sql92(f"{COND[a]} OR {COND[b]}")
    assert and_f.evaluate(PROPS) is kleene_and(a, b)
    assert or_f.evaluate(PROPS) is kleene_or(a, b)
    assert and_f.matches(PROPS) is (kleene_and(a, b) is True)
    assert or_f.matches(PROPS) is (kleene_or(a, b) is True)


@pytest.mark.parametrize("a", VALUES)
@pytest.mark.parametrize("b", VALUES)
@pytest.mark.parametrize("c", VALUES)
def test_three_way_chains(a: bool | None, b: bool | None, c: bool | None) -> None:
    and_f = compile_sql92(f"{COND[a]} AND {COND[b]} AND {COND[c]}")
    or_f = compile_sql92(f"{COND[a]} OR {COND[b]} OR {COND[c]}")
    assert and_f.evaluate(PROPS) is kleene_and(kleene_and(a, b), c)
    assert or_f.evaluate(PROPS) is kleene_or(kleene_or(a, b), c)


@pytest.mark.parametrize("a", VALUES)
@pytest.mark.parametrize("literal", ["TRUE", "FALSE", "NULL"])
def test_constant_folding_agrees_with_dynamic_evaluation(a: bool | None, literal: str) -> None:
    const = {"TRUE": True, "FALSE": False, "NULL": None}[literal]
    for template, fn in [("{x} AND {y}", kleene_and), ("{x} OR {y}", kleene_or)]:
        for x, y, xv, yv in [(COND[a], literal, a, const), (literal, COND[a], const, a)]:
            f = compile_sql92(template.format(x=x, y=y))
            assert f.evaluate(PROPS) is fn(xv, yv), template.format(x=x, y=y)


@pytest.mark.parametrize(("a", "expected"), [(True, False), (False, True), (None, None)])
def test_not(a: bool | None, expected: bool | None) -> None:
    assert compile_sql92(f"NOT ({COND[a]})").evaluate(PROPS) is expected
    assert compile_sql92(f"NOT NOT ({COND[a]})").evaluate(PROPS) is a


def test_constant_expressions() -> None:
    assert ev("TRUE") is True
    assert ev("FALSE") is False
    assert ev("NULL") is None
    assert ev("NULL OR TRUE") is True
    assert ev("NULL AND FALSE") is False
    assert ev("NOT NULL") is None
    assert ev("1 = 1.0") is True
    assert ev("2 > 1") is True
    assert ev("'a' = 'a'") is True
    assert ev("'a' <> 'a'") is False
    assert ev("TRUE = FALSE") is False
    assert ev("NULL IS NULL") is True
    assert ev("'x' IS NOT NULL") is True
    assert ev("(NULL AND TRUE) IS NULL") is True


def test_bare_property_as_condition_follows_rocketmq() -> None:
    # Properties are strings, so RocketMQ's boolean cast gives FALSE (present) or NULL.
    assert ev("flag", flag="true") is False
    assert ev("flag") is None
    assert ev("NOT flag", flag="x") is True
    assert ev("flag OR TRUE") is True
    # How to test a flag: compare it with a boolean (Java Boolean.valueOf).
    assert ev("flag = TRUE", flag="true") is True
    assert ev("flag = TRUE", flag="TrUe") is True
    assert ev("flag = TRUE", flag="yes") is False
    assert ev("TRUE = flag", flag="true") is True
    assert ev("flag = FALSE", flag="no") is True
    assert ev("flag = TRUE") is None
    assert ev("flag <> TRUE", flag="false") is True


# --- strings ---------------------------------------------------------------------------


def test_string_equality() -> None:
    assert ev("a = 'x'", a="x") is True
    assert ev("a = 'x'", a="X") is False
    assert ev("a = 'x'", a="x ") is False
    assert ev("a = 'x'") is None
    assert ev("a <> 'x'", a="y") is True
    assert ev("a <> 'x'", a="x") is False
    assert ev("a <> 'x'") is None
    assert ev("'x' = a", a="x") is True
    assert ev("'x' = a") is None  # symmetric (Java answers FALSE here, NULL the other way)
    assert ev("a = ''", a="") is True


def test_property_against_property() -> None:
    assert ev("a = b", a="x", b="x") is True
    assert ev("a = b", a="x", b="y") is False
    assert ev("a = b", a="x") is None
    assert ev("a <> b", a="1", b="01") is True  # string comparison for `=`
    # Ordering converts both sides with Double.valueOf.
    assert ev("a > b", a="10", b="9") is True
    assert ev("a < b", a="1e1", b="9.5") is False
    assert ev("a > b", a="x", b="1") is None
    assert ev("a >= b", a="1") is None


@pytest.mark.parametrize(
    ("expression", "value", "expected"),
    [
        ("s CONTAINS 'ell'", "hello", True),
        ("s CONTAINS 'xyz'", "hello", False),
        ("s NOT CONTAINS 'xyz'", "hello", True),
        ("s NOT CONTAINS 'ell'", "hello", False),
        ("s STARTSWITH 'he'", "hello", True),
        ("s STARTSWITH 'lo'", "hello", False),
        ("s NOT STARTSWITH 'lo'", "hello", True),
        ("s ENDSWITH 'lo'", "hello", True),
        ("s ENDSWITH 'he'", "hello", False),
        ("s NOT ENDSWITH 'he'", "hello", True),
        ("s CONTAINS '中'", "中文", True),
        ("s CONTAINS 'it''s'", "so it's", True),
    ],
)
def test_string_match_operators(expression: str, value: str, expected: bool) -> None:
    assert ev(expression, s=value) is expected


def test_string_match_operators_are_two_valued_like_rocketmq() -> None:
    for op in ("CONTAINS", "STARTSWITH", "ENDSWITH"):
        assert ev(f"s {op} 'x'") is False
        assert ev(f"s NOT {op} 'x'") is False  # missing: FALSE for the NOT form too
        assert ev(f"NOT (s {op} 'x')") is True
        assert ev(f"s {op} ''", s="abc") is False  # empty pattern: FALSE
        assert ev(f"s NOT {op} ''", s="abc") is False
    assert ev("'hello' CONTAINS 'ell'") is True


# --- numbers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value", "expected"),
    [
        ("a > 5", "6", True),
        ("a > 5", "5", False),
        ("a >= 5", "5", True),
        ("a < 5", "-10", True),
        ("a <= 5", "5", True),
        ("a = 5", "5", True),
        ("a = 5", "+5", True),
        ("a = 5", "05", True),  # Long.valueOf("05") == 5
        ("a = 5", "٥", True),  # Java accepts Unicode decimal digits too
        ("a <> 5", "6", True),
        ("5 < a", "6", True),  # literal on the left
        ("5 >= a", "6", False),
        ("a > 5", "9223372036854775807", True),
        # An integer literal converts the property with Long.valueOf: decimals fail.
        ("a > 5", "5.5", None),
        ("a = 5", "5.0", None),
        ("a > 5", " 6", None),
        ("a > 5", "1_0", None),
        ("a > 5", "abc", None),
        ("a > 5", "", None),
        ("a > 5", "9223372036854775808", None),
        ("a <> 5", "abc", None),
        # A decimal literal converts with Double.valueOf.
        ("a > 5.0", "5.5", True),
        ("a = 5.0", "5", True),
        ("a > 5.0", " 6 ", True),  # Double.valueOf trims
        ("a = 1.5", "1.5f", True),
        ("a = 1.5", "1.5D", True),
        ("a > 1.0", "1e3", True),
        ("a > 1.0", "Infinity", True),
        ("a < 1.0", "-Infinity", True),
        ("a > 1.0", "NaN", None),
        ("a > 1.0", "0x10", None),
        ("a > 1.0", "abc", None),
        ("a BETWEEN 1 AND 5", "1", True),
        ("a BETWEEN 1 AND 5", "5", True),
        ("a BETWEEN 1 AND 5", "6", False),
        ("a BETWEEN 1 AND 5", "x", None),
        ("a BETWEEN -5 AND -1", "-3", True),
        ("a BETWEEN 1.5 AND 2.5", "2", True),
        ("a NOT BETWEEN 1 AND 5", "0", True),
        ("a NOT BETWEEN 1 AND 5", "3", False),
        ("a NOT BETWEEN 1 AND 5", "x", None),
        ("a BETWEEN 3 AND 3", "3", True),
    ],
)
def test_numeric_comparisons(expression: str, value: str, expected: bool | None) -> None:
    assert ev(expression, a=value) is expected


def test_numeric_comparison_with_missing_property_is_unknown() -> None:
    for expression in ["a > 5", "a = 5", "a <> 5", "a BETWEEN 1 AND 2", "a NOT BETWEEN 1 AND 2",
                       "5 < a", "a > 1.5"]:
        assert ev(expression) is None, expression
        assert ev(f"NOT ({expression})") is None, expression


def test_failed_conversion_is_unknown_not_false() -> None:
    # RocketMQ throws (the message is not matched); unknown keeps NOT from flipping it.
    assert ev("NOT (a > 5)", a="abc") is None
    assert ev("a > 5 OR b = 'x'", a="abc", b="x") is True
    assert ev("a > 5 AND b = 'x'", a="abc", b="y") is False


def test_string_literal_against_number() -> None:
    assert ev("'5' = 5") is True
    assert ev("'x' = 5") is None
    assert ev("5 = '5.0'") is None
    assert ev("5.0 = '5'") is True


# --- NULL, IN --------------------------------------------------------------------------


def test_is_null_is_never_unknown() -> None:
    assert ev("a IS NULL") is True
    assert ev("a IS NULL", a="x") is False
    assert ev("a IS NOT NULL") is False
    assert ev("a IS NOT NULL", a="") is True
    assert ev("(a > 1) IS NULL") is True
    assert ev("(a > 1) IS NULL", a="2") is False
    assert ev("(a > 1) IS NOT NULL", a="x") is False  # conversion failed: unknown


def test_in_and_not_in() -> None:
    assert ev("a IN ('x', 'y')", a="y") is True
    assert ev("a IN ('x', 'y')", a="z") is False
    assert ev("a IN ('x')") is None
    assert ev("a NOT IN ('x', 'y')", a="z") is True
    assert ev("a NOT IN ('x', 'y')", a="x") is False
    assert ev("a NOT IN ('x')") is None
    assert ev("a IN ('1')", a="01") is False  # strings, no conversion
    many = ", ".join(f"'{i}'" for i in range(300))
    assert ev(f"a IN ({many})", a="299") is True
    assert ev("a IN ('x', 'x', 'it''s')", a="it's") is True


# --- realistic subscriptions -----------------------------------------------------------


def test_typical_rocketmq_subscription() -> None:
    f = compile_sql92(
        "(TAGS is not null and TAGS in ('TagA', 'TagB')) and (a is not null and a between 0 and 3)"
    )
    assert f.matches({"TAGS": "TagA", "a": "2"})
    assert not f.matches({"TAGS": "TagC", "a": "2"})
    assert not f.matches({"TAGS": "TagA", "a": "4"})
    assert not f.matches({"TAGS": "TagA"})
    assert not f.matches({})


def test_accepts_any_mapping_and_is_reusable() -> None:
    f = compile_sql92("region = 'eu' AND price > 10.5")
    assert f.matches(MappingProxyType({"region": "eu", "price": "11"}))
    results = [f.matches({"region": "eu", "price": str(p)}) for p in range(20)]
    assert results == [p > 10.5 for p in range(20)]
    assert f.property_names == {"region", "price"}
