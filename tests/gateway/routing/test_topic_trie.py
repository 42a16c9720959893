"""TopicTrie: MQTT matching semantics, reference counting, and a brute-force oracle."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.routing import topic_trie
from gateway.routing.topic_trie import TopicTrie

# (filter, topic, matches): MQTT 5.0 §4.7 examples plus empty levels and `$` names.
SEMANTICS = [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("#", "sport/tennis", True),
    ("#", "/", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("+", "", True),
    ("+/tennis/#", "sport/tennis/x", True),
    ("#", "$SYS/monitor/Clients", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("+", "$SYS", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/#", "$SYS", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("a/$x/#", "a/$x/y", True),
    ("+/$x", "a/$x", True),  # `$` only matters in the first level of the name
    ("a//b", "a//b", True),
    ("a//b", "a/b", False),
    ("a/+/b", "a//b", True),
    ("/a", "/a", True),
    ("/a", "a", False),
    ("a/", "a/", True),
    ("a/", "a", False),
    ("a/#", "a/", True),
    ("a/+", "a/", True),
    ("a/b", "a/b/c", False),
    ("Sport", "sport", False),
]


@pytest.mark.parametrize("topic_filter, topic, matches", SEMANTICS)
def test_semantics(topic_filter: str, topic: str, matches: bool) -> None:
    trie: TopicTrie[str] = TopicTrie()
    trie.add(topic_filter, "s")
    assert trie.match(topic) == ({"s"} if matches else set())
    assert [f for f, _ in trie.match_filters(topic)] == ([topic_filter] if matches else [])


def test_all_filters_together() -> None:
    trie: TopicTrie[str] = TopicTrie()
    for topic_filter, _, _ in SEMANTICS:
        trie.add(topic_filter, topic_filter)
    for topic in {t for _, t, _ in SEMANTICS}:
        expected = {f for f, _, _ in SEMANTICS if _oracle(f, topic)}
        assert trie.match(topic) == expected, topic
        found = [f for f, _ in trie.match_filters(topic)]
        assert sorted(found) == sorted(expected)  # each filter once


def test_reference_counting() -> None:
    trie: TopicTrie[str] = TopicTrie()
    assert trie.add("a/+", "s1") is True  # filter appears
    assert trie.add("a/+", "s1") is False
    assert trie.add("a/+", "s2") is False
    assert len(trie) == 1 and "a/+" in trie
    assert trie.refcount("a/+", "s1") == 2
    assert set(trie.values("a/+")) == {"s1", "s2"}
    assert trie.remove("a/+", "s1") is False
    assert trie.match("a/b") == {"s1", "s2"}
    assert trie.remove("a/+", "s1") is False
    assert trie.match("a/b") == {"s2"}
    assert trie.remove("a/+", "s2") is True  # last reference: filter gone
    assert len(trie) == 0 and "a/+" not in trie
    assert trie.match("a/b") == set()
    with pytest.raises(KeyError):
        trie.remove("a/+", "s2")
    with pytest.raises(KeyError):
        trie.remove("x/y/z", "s2")


def test_remove_prunes_nodes_but_keeps_shared_prefixes() -> None:
    trie: TopicTrie[int] = TopicTrie()
    filters = ["a/b/c", "a/b", "a/+/c", "a/#", "#", "+", "/", "a//"]
    for i, f in enumerate(filters):
        trie.add(f, i)
    for i, f in enumerate(filters):
        assert trie.remove(f, i)
        remaining = filters[i + 1 :]
        assert sorted(trie.filters()) == sorted(remaining)
        for topic in ["a/b/c", "a/b", "a", "/", "a//", "x"]:
            assert trie.match(topic) == {
                j for j, g in enumerate(filters) if g in remaining and _oracle(g, topic)
            }
    root = trie._root
    assert root.is_empty()


@pytest.mark.parametrize("bad", ["a/#/b", "a+", "#a", "a/b#", "++"])
def test_add_rejects_misplaced_wildcards(bad: str) -> None:
    with pytest.raises(ValueError):
        TopicTrie().add(bad, 1)


def _oracle(topic_filter: str, topic: str) -> bool:
    """Brute force through a regex, independent of both the trie and topics.topic_matches."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    parts = []
    for level in topic_filter.split("/"):
        if level == "+":
            parts.append("[^/]*")
        elif level == "#":
            parts.append("#")
        else:
            parts.append(re.escape(level))
    pattern = "/".join(parts)
    if pattern == "#":
        pattern = ".*"
    elif pattern.endswith("/#"):
        pattern = pattern[:-2] + "(/.*)?"
    return re.fullmatch(pattern, topic, re.DOTALL) is not None


LEVELS = st.sampled_from(["a", "b", "", "$x", "$SYS", "é"])
names = st.lists(LEVELS, min_size=1, max_size=5).map("/".join)


@st.composite
def filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(st.one_of(LEVELS, st.just("+")), min_size=1, max_size=5))
    if draw(st.booleans()):
        if draw(st.booleans()):
            levels.append("#")
        else:
            levels[-1] = "#"
    return "/".join(levels)


@given(
    ops=st.lists(st.tuples(st.booleans(), filters(), st.integers(0, 3)), max_size=40),
    topics=st.lists(names, min_size=1, max_size=10),
)
@settings(max_examples=300, deadline=None)
def test_against_brute_force(ops: list[tuple[bool, str, int]], topics: list[str]) -> None:
    trie: TopicTrie[int] = TopicTrie()
    refs: dict[tuple[str, int], int] = {}
    for is_add, topic_filter, value in ops:
        key = (topic_filter, value)
        if is_add or not refs.get(key):
            was_live = any(f == topic_filter for f, _ in refs)
            assert trie.add(topic_filter, value) is (not was_live)
            refs[key] = refs.get(key, 0) + 1
        else:
            refs[key] -= 1
            if not refs[key]:
                del refs[key]
            still_live = any(f == topic_filter for f, _ in refs)
            assert trie.remove(topic_filter, value) is (not still_live)
    live = {f for f, _ in refs}
    assert len(trie) == len(live)
    assert sorted(trie.filters()) == sorted(live)
    for topic in topics:
        expected = {v for (f, v) in refs if _oracle(f, topic)}
        assert trie.match(topic) == expected
        assert sorted(f for f, _ in trie.match_filters(topic)) == sorted(
            f for f in live if _oracle(f, topic)
        )


def test_match_sorted_is_remembered_until_the_filters_change(monkeypatch):
    trie: TopicTrie[str] = TopicTrie()
    trie.add("a/+", "%LMQ%2")
    trie.add("a/#", "%LMQ%1")
    first = trie.match_sorted("a/b")
    assert first == ("%LMQ%1", "%LMQ%2")
    assert trie.match_sorted("a/b") is first  # remembered
    trie.add("a/b", "%LMQ%0")  # a new filter: the memo is dropped
    assert trie.match_sorted("a/b") == ("%LMQ%0", "%LMQ%1", "%LMQ%2")
    trie.add("a/b", "%LMQ%3")  # a new value on an existing filter too
    assert trie.match_sorted("a/b") == ("%LMQ%0", "%LMQ%1", "%LMQ%2", "%LMQ%3")
    trie.remove("a/+", "%LMQ%2")
    assert trie.match_sorted("a/b") == ("%LMQ%0", "%LMQ%1", "%LMQ%3")
    assert trie.match_sorted("x") == ()
    # bounded: past the limit the memo starts over, answers stay right
    monkeypatch.setattr(topic_trie, "MATCH_CACHE_TOPICS", 4)
    for i in range(10):
        assert trie.match_sorted(f"a/{i}") == ("%LMQ%1",)
    assert len(trie._matched) <= 4
