"""Tag subscription expressions and the Java tag hash (docs/protocol.md §5.2, §7.10)."""

from __future__ import annotations

import pytest

from core.broker.filter import SUB_ALL, TagSubscription, java_string_hash, parse_tag_expression


@pytest.mark.parametrize(
    ("tag", "code"),
    [
        ("TagA", 2598919),
        ("TagB", 2598920),
        ("*", 42),
        ("中文", 646394),
        ("aaaaaaaaaa", -799347552),
        ("", 0),
        # U+1F600 is two UTF-16 units D83D DE00: 31 * 0xD83D + 0xDE00.
        ("\U0001f600", 31 * 0xD83D + 0xDE00),
        # Known Java collision.
        ("Aa", 2112),
        ("BB", 2112),
    ],
)
def test_java_string_hash_vectors(tag: str, code: int) -> None:
    assert java_string_hash(tag) == code


def test_java_string_hash_is_signed_32_bit() -> None:
    for text in ["x" * 50, "\uffff" * 20, "polygenelubricants"]:
        h = java_string_hash(text)
        assert -(2**31) <= h < 2**31
    assert java_string_hash("polygenelubricants") == -(2**31)  # Java: Integer.MIN_VALUE


@pytest.mark.parametrize("expression", [None, "", "*"])
def test_match_all_forms(expression: str | None) -> None:
    sub = parse_tag_expression(expression)
    assert sub.match_all
    assert sub.sub_string == SUB_ALL
    assert sub.tags == frozenset() and sub.codes == frozenset()
    assert sub.matches_code(12345) and sub.matches_code(0)
    assert sub.matches_tag(None) and sub.matches_tag("anything")


def test_single_and_multiple_tags() -> None:
    sub = parse_tag_expression("TagA")
    assert not sub.match_all
    assert sub.tags == {"TagA"} and sub.codes == {2598919}
    assert sub.sub_string == "TagA"

    sub = parse_tag_expression("TagA || TagB")
    assert sub.tags == {"TagA", "TagB"}
    assert sub.codes == {2598919, 2598920}
    assert sub.sub_string == "TagA || TagB"


def test_trimming_and_empty_pieces() -> None:
    sub = parse_tag_expression("  TagA ||TagB||  || ")
    assert sub.tags == {"TagA", "TagB"}
    # Java's String.trim strips every char <= U+0020, control characters included ...
    assert parse_tag_expression("\tTagA\x00\x1f").tags == {"TagA"}
    # ... but not other Unicode spaces.
    assert parse_tag_expression("\u3000TagA").tags == {"\u3000TagA"}


def test_triple_pipe_keeps_a_pipe_like_java_split() -> None:
    assert parse_tag_expression("TagA|||TagB").tags == {"TagA", "|TagB"}
    assert parse_tag_expression("TagA|TagB").tags == {"TagA|TagB"}


def test_expression_without_tags_matches_nothing() -> None:
    # Java: not empty and not "*", so split; every piece is empty -> empty code set.
    for expression in ["||", " ", " || "]:
        sub = parse_tag_expression(expression)
        assert not sub.match_all
        assert sub.tags == frozenset()
        assert not sub.matches_code(0)
        assert not sub.matches_tag("TagA")


def test_padded_star_is_a_tag_not_match_all() -> None:
    sub = parse_tag_expression(" * ")
    assert not sub.match_all
    assert sub.tags == {"*"} and sub.codes == {42}
    assert parse_tag_expression("TagA || *").tags == {"TagA", "*"}


def test_matches_code_and_tag() -> None:
    sub = parse_tag_expression("TagA || 中文")
    assert sub.matches_code(2598919)
    assert sub.matches_code(646394)
    assert not sub.matches_code(2598920)
    assert not sub.matches_code(0)  # a message without a tag
    assert sub.matches_tag("TagA")
    assert not sub.matches_tag("taga")
    assert not sub.matches_tag(None)


def test_matches_code_uses_low_32_bits_like_java_int_value() -> None:
    sub = parse_tag_expression("aaaaaaaaaa")
    code = -799347552
    assert sub.matches_code(code)  # sign-extended int64 as stored in the consume queue
    assert sub.matches_code((5 << 32) | (code & 0xFFFFFFFF))
    assert sub.matches_code(code & 0xFFFFFFFF)  # same low 32 bits
    assert not sub.matches_code((5 << 32) | ((code + 1) & 0xFFFFFFFF))


def test_parse_is_cached_and_immutable() -> None:
    a = parse_tag_expression("TagA || TagB")
    assert parse_tag_expression("TagA || TagB") is a
    assert isinstance(a, TagSubscription)
    with pytest.raises(AttributeError):
        a.match_all = True  # type: ignore[misc]
