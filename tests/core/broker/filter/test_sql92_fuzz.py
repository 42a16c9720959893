"""Property-based tests: arbitrary input only ever raises FilterParseError, and compiled
closures agree with a naive reference evaluator written independently here."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.broker.filter import FilterParseError, build_message_filter, compile_sql92
from tests.core.broker.filter.test_message_filter import make_record

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

PROP_VALUES = ["1", "2", "10", "-3", "1.5", "x", "abc", "", "true", "٣", " 7 ", "1e2", "NaN"]
PROPS = st.dictionaries(
    st.sampled_from(["a", "b", "c", "TAGS"]),
    st.one_of(st.sampled_from(PROP_VALUES), st.text(max_size=60)),
)


def compiles_or_parse_error(text: str, props_list: list[dict[str, str]]) -> None:
    try:
        f = compile_sql92(text)
    except FilterParseError:
        return
    for props in props_list:
        assert f.evaluate(props) in (True, False, None)
        assert f.matches(props) in (True, False)


@FUZZ
@given(st.text(max_size=300), st.lists(PROPS, max_size=6))
def test_random_text_only_raises_parse_error(text: str, props_list) -> None:
    compiles_or_parse_error(text, props_list)


VOCAB = [
    "a", "b", "c", "TAGS", "x.y", "$v", "AND", "OR", "NOT", "IN", "BETWEEN", "IS", "NULL",
    "TRUE", "FALSE", "CONTAINS", "STARTSWITH", "ENDSWITH", "and", "not", "(", ")", ",",
    "=", "<>", "<", "<=", ">", ">=", "+", "-", "!=", "'x'", "'it''s'", "''", "'1'", "0", "1",
    "10L", "1.5", ".5", "1e3", "9223372036854775807", "--", "/*", "*/", "\n", "'", "007",
]


@FUZZ
@given(st.lists(st.sampled_from(VOCAB), max_size=80), st.lists(PROPS, max_size=6))
def test_token_soup_only_raises_parse_error(tokens: list[str], props_list) -> None:
    compiles_or_parse_error(" ".join(tokens), props_list)


@FUZZ
@given(st.text(max_size=100), st.sampled_from([None, "", "TAG", "SQL92", "XPATH"]))
def test_build_message_filter_only_raises_parse_error(expression: str, expression_type) -> None:
    try:
        f = build_message_filter(expression_type, expression)
    except FilterParseError:
        return
    if f is not None:
        assert f.is_matched_by_consume_queue(42) in (True, False)
        assert f.is_matched_by_commit_log(b"\x00" * 10) in (True, False)


# --- differential test against a reference evaluator -----------------------------------
# Each generated expression is a pair (sql_text, reference_function(props) -> bool|None).
# The reference is deliberately naive: it interprets the same semantics directly, with no
# constant folding, no n-ary flattening and no specialised closures.


# Java's Long.valueOf / Double.valueOf of every property value the generator uses, written
# out by hand (None: the conversion throws). Not derived from the implementation's code.
LONG_OF = {"0": 0, "1": 1, "2": 2, "10": 10, "-3": -3, "07": 7, "+2": 2, "-0": 0}
DOUBLE_OF = {
    "0": 0.0, "1": 1.0, "2": 2.0, "10": 10.0, "-3": -3.0, "1.5": 1.5, "07": 7.0, "+2": 2.0,
    "-0": 0.0, "1e1": 10.0, " 2 ": 2.0, "2.0f": 2.0, "-0.5": -0.5, "Infinity": float("inf"),
    "1.": 1.0, ".5": 0.5, "2D": 2.0, "-Infinity": float("-inf"),
}
NOT_NUMBERS = ["x", "abc", "", "true", "NaN", "1e", "1.5.0", "0x1", "1_0", "+-1", "Inf"]


def _long(s: str) -> int | None:
    return LONG_OF.get(s)


def _double(s: str) -> float | None:
    return DOUBLE_OF.get(s)


def _quote(text: str) -> str:
    """An SQL92 string literal: single quotes, a quote inside written twice."""
    return "'" + text.replace("'", "''") + "'"


def _num_cmp(op: str, prop: str, literal: str):
    conv = _double if "." in literal else _long
    lit = float(literal) if "." in literal else int(literal)
    ops = {"=": lambda x, y: x == y, "<>": lambda x, y: x != y, ">": lambda x, y: x > y,
           ">=": lambda x, y: x >= y, "<": lambda x, y: x < y, "<=": lambda x, y: x <= y}

    def ref(p):
        v = p.get(prop)
        if v is None:
            return None
        x = conv(v)
        return None if x is None else ops[op](x, lit)

    return f"{prop} {op} {literal}", ref


def _str_eq(op: str, prop: str, s: str):
    def ref(p):
        v = p.get(prop)
        if v is None:
            return None
        return (v == s) if op == "=" else (v != s)

    return f"{prop} {op} {_quote(s)}", ref


def _in(prop: str, values: list[str], negated: bool):
    def ref(p):
        v = p.get(prop)
        if v is None:
            return None
        return (v in values) != negated

    listed = ", ".join(_quote(v) for v in values)
    return f"{prop} {'NOT IN' if negated else 'IN'} ({listed})", ref


def _is_null(prop: str, negated: bool):
    return (f"{prop} IS {'NOT ' if negated else ''}NULL",
            lambda p: (p.get(prop) is None) != negated)


def _between(prop: str, lo: int, hi: int, negated: bool):
    lo, hi = min(lo, hi), max(lo, hi)

    def ref(p):
        v = p.get(prop)
        if v is None:
            return None
        x = _long(v)
        if x is None:
            return None
        inside = lo <= x <= hi
        return not inside if negated else inside

    return f"{prop} {'NOT BETWEEN' if negated else 'BETWEEN'} {lo} AND {hi}", ref


def _contains(prop: str, s: str, negated: bool):
    def ref(p):
        v = p.get(prop)
        if v is None or not s:
            return False
        return (s in v) != negated

    return f"{prop} {'NOT CONTAINS' if negated else 'CONTAINS'} {_quote(s)}", ref


def _lit(value: bool | None):
    return {True: "TRUE", False: "FALSE", None: "NULL"}[value], lambda p: value


props_names = st.sampled_from(["a", "b", "c"])
numbers = st.sampled_from(["0", "1", "2", "10", "-3", "1.5", "-0.5", "2.0"])
# Free text without digits (so that no value is a number the tables above leave out).
free_text = st.text(alphabet="abxyz' \u00e9\u4e2d\n\t%_", max_size=12)
strings = st.one_of(st.sampled_from(["x", "abc", "1", "", "true", "it's"]), free_text)

atoms = st.one_of(
    st.builds(_num_cmp, st.sampled_from(["=", "<>", ">", ">=", "<", "<="]), props_names, numbers),
    st.builds(_str_eq, st.sampled_from(["=", "<>"]), props_names, strings),
    st.builds(_in, props_names, st.lists(strings, min_size=1, max_size=4), st.booleans()),
    st.builds(_is_null, props_names, st.booleans()),
    st.builds(_between, props_names, st.integers(-5, 12), st.integers(-5, 12), st.booleans()),
    st.builds(_contains, props_names, strings, st.booleans()),
    st.builds(_lit, st.sampled_from([True, False, None])),
)


def _not(e):
    text, ref = e

    def r(p):
        v = ref(p)
        return None if v is None else not v

    return f"NOT ({text})", r


def _and(items):
    def r(p):
        vals = [ref(p) for _, ref in items]
        if False in vals:
            return False
        return None if None in vals else True

    return "(" + " AND ".join(t for t, _ in items) + ")", r


def _or(items):
    def r(p):
        vals = [ref(p) for _, ref in items]
        if True in vals:
            return True
        return None if None in vals else False

    return "(" + " OR ".join(t for t, _ in items) + ")", r


expressions = st.recursive(
    atoms,
    lambda inner: st.one_of(
        inner.map(_not),
        st.lists(inner, min_size=2, max_size=4).map(_and),
        st.lists(inner, min_size=2, max_size=4).map(_or),
    ),
    max_leaves=12,
)

DIFF_PROPS = st.dictionaries(
    st.sampled_from(["a", "b", "c"]),
    st.one_of(st.sampled_from(sorted(set(LONG_OF) | set(DOUBLE_OF)) + NOT_NUMBERS), free_text),
)


@settings(max_examples=500, deadline=None)
@given(expressions, st.lists(DIFF_PROPS, min_size=1, max_size=4))
def test_compiled_closures_agree_with_reference(expr, props_list) -> None:
    text, ref = expr
    f = compile_sql92(text)
    for props in props_list:
        assert f.evaluate(props) is ref(props), (text, props)


# --- damaged records -------------------------------------------------------------------


@FUZZ
@given(
    st.dictionaries(st.text(min_size=1, max_size=8), st.text(min_size=1, max_size=8), max_size=5),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
    st.integers(0, 10_000),
)
def test_damaged_records_never_raise(props, flips, cut) -> None:
    clean = {k.replace("\x01", "").replace("\x02", "") or "k": v for k, v in props.items()}
    record = bytearray(make_record(clean))
    for pos, value in flips:
        record[pos % len(record)] = value
    data = bytes(record[: max(cut, 0)]) if cut < len(record) else bytes(record)
    filters = [
        build_message_filter("SQL92", "k IS NULL OR k IS NOT NULL"),
        build_message_filter("TAG", "TagA", exact_tags=True),
    ]
    for f in filters:
        assert f.is_matched_by_commit_log(data) in (True, False)
        assert f.is_matched_by_commit_log(memoryview(data)) in (True, False)
