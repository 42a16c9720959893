"""A trie of MQTT topic filters: which live filters match a published topic name?

The gateway stores a publish once and indexes it into the LMQ of every live
subscription filter that matches (docs/architecture.md §4), so this lookup runs per message.

Shape: one node per filter level. A node keeps its literal children in a dict (keys
interned: the same level names repeat across millions of filters) and the `+` and `#`
children in their own slots, so matching a name of L levels costs one dict lookup per
level and per live `+` branch, never a scan of siblings.

Memory: nodes use __slots__; a node with a single literal child holds a (level, node)
tuple instead of a dict, and a filter held once by a single value holds that value
itself instead of a {value: count} dict. Both are the common case (device-specific
filters such as `devices/<id>/cmd/#`), and a one-entry dict costs 224 bytes on CPython.

Each filter holds a reference count per value (a session id, an LMQ name, ...): the
filter stays while any value holds a reference, and `add` / `remove` report when a filter
appears or disappears so the caller can start or stop dispatching to its LMQ.

MQTT semantics (5.0 §4.7): `+` matches exactly one level, including an empty one; `#`
matches any number of levels including none, so `a/#` matches `a`; empty levels are real
levels (`a//b`, `/a`, `a/`); a filter starting with a wildcard does not match a name
starting with `$` (MQTT-4.7.2-1). Shared subscriptions are the caller's business: add the
filter part of `$share/<group>/<filter>`.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["TopicTrie"]

V = TypeVar("V")


class _Node:
    __slots__ = ("children", "plus", "hash", "refs", "filter")

    def __init__(self) -> None:
        # None | (level, node) for a single child | {level: node}
        self.children: Any = None
        self.plus: _Node | None = None
        self.hash: _Node | None = None
        # While a filter ends here (filter is not None): the single value held once, or
        # a {value: count} dict once there are several values or references.
        self.refs: Any = None
        self.filter: str | None = None

    def is_empty(self) -> bool:
        return (
            self.filter is None
            and self.children is None
            and self.plus is None
            and self.hash is None
        )

    def child(self, level: str) -> _Node | None:
        children = self.children
        if children is None:
            return None
        if type(children) is tuple:
            return children[1] if children[0] == level else None  # type: ignore[no-any-return]
        return children.get(level)  # type: ignore[no-any-return]

    def step(self, level: str) -> _Node | None:
        if level == "+":
            return self.plus
        if level == "#":
            return self.hash
        return self.child(level)

    def child_nodes(self) -> list[_Node]:
        children = self.children
        if children is None:
            return []
        if type(children) is tuple:
            return [children[1]]
        return list(children.values())


def _levels(topic_filter: str) -> list[str]:
    levels = topic_filter.split("/")
    if "+" in topic_filter or "#" in topic_filter:
        last = len(levels) - 1
        for i, level in enumerate(levels):
            if ("+" in level or "#" in level) and (len(level) != 1 or (level == "#" and i != last)):
                raise ValueError(f"invalid topic filter {topic_filter!r}")
    return levels


def _values(node: _Node) -> Collection[Any]:
    refs = node.refs
    return refs.keys() if type(refs) is dict else (refs,)


#: Topic names whose match_sorted() answer is remembered (a named limit; past it the
#: memo starts over).
MATCH_CACHE_TOPICS = 65536


class TopicTrie(Generic[V]):
    """Topic filters -> values, matched against topic names with MQTT semantics.

    Values must be hashable. Not thread-safe (one event loop owns it).
    """

    __slots__ = ("_root", "_filters", "_matched")

    def __init__(self) -> None:
        self._root = _Node()
        self._filters = 0
        # topic name -> match_sorted() answer; emptied by every add/remove (bounded).
        self._matched: dict[str, tuple] = {}

    def __len__(self) -> int:
        """Number of distinct live filters."""
        return self._filters

    def _find(self, topic_filter: str) -> _Node | None:
        node: _Node | None = self._root
        for level in topic_filter.split("/"):
            node = node.step(level)  # type: ignore[union-attr]
            if node is None:
                return None
        return node if node.filter is not None else None  # type: ignore[union-attr]

    def __contains__(self, topic_filter: object) -> bool:
        return isinstance(topic_filter, str) and self._find(topic_filter) is not None

    def values(self, topic_filter: str) -> Collection[V]:
        """The distinct values holding `topic_filter` (empty if it is not live)."""
        node = self._find(topic_filter)
        return _values(node) if node is not None else ()

    def refcount(self, topic_filter: str, value: V) -> int:
        """How many references `value` holds on `topic_filter`."""
        node = self._find(topic_filter)
        if node is None:
            return 0
        refs = node.refs
        if type(refs) is dict:
            return refs.get(value, 0)  # type: ignore[no-any-return]
        return 1 if refs == value else 0

    def add(self, topic_filter: str, value: V) -> bool:
        """Take one reference of `value` on `topic_filter`; True if the filter is new.

        Raises ValueError for a filter whose wildcards are misplaced.
        """
        if self._matched:
            self._matched.clear()
        node = self._root
        for level in _levels(topic_filter):
            if level == "+":
                nxt = node.plus
                if nxt is None:
                    nxt = node.plus = _Node()
            elif level == "#":
                nxt = node.hash
                if nxt is None:
                    nxt = node.hash = _Node()
            else:
                children = node.children
                if children is None:
                    nxt = _Node()
                    node.children = (sys.intern(level), nxt)
                elif type(children) is tuple:
                    if children[0] == level:
                        nxt = children[1]
                    else:
                        nxt = _Node()
                        node.children = {children[0]: children[1], sys.intern(level): nxt}
                else:
                    nxt = children.get(level)
                    if nxt is None:
                        nxt = children[sys.intern(level)] = _Node()
            node = nxt
        if node.filter is None:
            node.filter = topic_filter
            node.refs = value
            self._filters += 1
            return True
        refs = node.refs
        if type(refs) is dict:
            refs[value] = refs.get(value, 0) + 1
        elif refs == value:
            node.refs = {refs: 2}
        else:
            node.refs = {refs: 1, value: 1}
        return False

    def remove(self, topic_filter: str, value: V) -> bool:
        """Drop one reference of `value`; True if the filter is gone (no reference left).

        Raises KeyError if `value` holds no reference on `topic_filter`.
        """
        if self._matched:
            self._matched.clear()
        path: list[tuple[_Node, str]] = []
        node: _Node | None = self._root
        for level in topic_filter.split("/"):
            path.append((node, level))  # type: ignore[arg-type]
            node = node.step(level)  # type: ignore[union-attr]
            if node is None:
                raise KeyError((topic_filter, value))
        if node.filter is None:  # type: ignore[union-attr]
            raise KeyError((topic_filter, value))
        refs = node.refs  # type: ignore[union-attr]
        if type(refs) is dict:
            count = refs.get(value, 0)
            if not count:
                raise KeyError((topic_filter, value))
            if count > 1:
                refs[value] = count - 1
            else:
                del refs[value]
            if len(refs) == 1:
                ((only, left),) = refs.items()
                if left == 1:
                    node.refs = only  # type: ignore[union-attr]
            return False  # a dict always holds two references or more
        if refs != value:
            raise KeyError((topic_filter, value))
        node.refs = None  # type: ignore[union-attr]
        node.filter = None  # type: ignore[union-attr]
        self._filters -= 1
        # Prune the now useless tail of the path, bottom-up.
        for parent, level in reversed(path):
            if not node.is_empty():  # type: ignore[union-attr]
                break
            if level == "+":
                parent.plus = None
            elif level == "#":
                parent.hash = None
            else:
                children = parent.children
                if type(children) is tuple:
                    parent.children = None
                else:
                    del children[level]
                    if len(children) == 1:
                        parent.children = next(iter(children.items()))
            node = parent
        return True

    def match_sorted(self, topic: str) -> tuple[V, ...]:
        """match() as a sorted tuple, remembered per topic name until the next add or
        remove (a publisher sends to the same topics over and over). Values must be
        orderable."""
        hit = self._matched.get(topic)
        if hit is None:
            if len(self._matched) >= MATCH_CACHE_TOPICS:
                self._matched.clear()
            hit = self._matched[topic] = tuple(sorted(self.match(topic)))
        return hit

    def match(self, topic: str) -> set[V]:
        """Union of the values of every filter matching the topic name `topic`."""
        result: set[V] = set()
        levels = topic.split("/")
        n = len(levels)
        root = self._root
        if topic[:1] == "$":
            # MQTT-4.7.2-1: only a literal first level may match a `$` name.
            child = root.child(levels[0])
            if child is None:
                return result
            stack = [(child, 1)]
        else:
            stack = [(root, 0)]
        pop = stack.pop
        push = stack.append
        add = result.add
        while stack:
            node, i = pop()
            hash_node = node.hash
            if hash_node is not None:
                refs = hash_node.refs
                if type(refs) is dict:
                    result.update(refs)
                else:
                    add(refs)
            if i == n:
                if node.filter is not None:
                    refs = node.refs
                    if type(refs) is dict:
                        result.update(refs)
                    else:
                        add(refs)
                continue
            children = node.children
            if children is not None:
                if type(children) is tuple:
                    if children[0] == levels[i]:
                        push((children[1], i + 1))
                else:
                    child = children.get(levels[i])
                    if child is not None:
                        push((child, i + 1))
            if node.plus is not None:
                push((node.plus, i + 1))
        return result

    def match_filters(self, topic: str) -> Iterator[tuple[str, Collection[V]]]:
        """Yield (filter, values) for every filter matching `topic`, each filter once.

        The values collection may be live: do not add or remove while iterating.
        """
        levels = topic.split("/")
        n = len(levels)
        root = self._root
        if topic[:1] == "$":
            child = root.child(levels[0])
            stack = [(child, 1)] if child is not None else []
        else:
            stack = [(root, 0)]
        while stack:
            node, i = stack.pop()
            if node.hash is not None:
                yield node.hash.filter, _values(node.hash)  # type: ignore[misc]
            if i == n:
                if node.filter is not None:
                    yield node.filter, _values(node)
                continue
            child = node.child(levels[i])
            if child is not None:
                stack.append((child, i + 1))
            if node.plus is not None:
                stack.append((node.plus, i + 1))

    def filters(self) -> Iterator[str]:
        """Every live filter (depth-first, no particular order)."""
        stack = [self._root]
        while stack:
            node = stack.pop()
            if node.filter is not None:
                yield node.filter
            stack.extend(node.child_nodes())
            if node.plus is not None:
                stack.append(node.plus)
            if node.hash is not None:
                stack.append(node.hash)
