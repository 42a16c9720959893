"""Tag subscription expressions: ``*`` or ``TagA || TagB`` (docs/protocol.md §5.2, §7.10).

The broker filters a consume queue by the tag *hash codes* stored in its units; the client
re-filters by the exact tag strings, so hash collisions cost bandwidth, never correctness.
Parsing follows Java's ``FilterAPI.buildSubscriptionData``: only ``None``, ``""`` and
exactly ``"*"`` mean "everything"; anything else is split on ``||``, each piece trimmed
the way Java's ``String.trim`` does (every char <= U+0020) and empty pieces dropped. A
subscription whose pieces are all empty (``"||"``, ``" "``) therefore matches nothing,
as on a Java broker.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from core.common.taghash import java_string_hash

__all__ = ["SUB_ALL", "TagSubscription", "java_string_hash", "parse_tag_expression"]

SUB_ALL = "*"
TAG_SEPARATOR = "||"

# Java's String.trim() strips every char <= ' ', not just Unicode whitespace.
_JAVA_TRIM = "".join(map(chr, range(0x21)))


@dataclass(frozen=True, slots=True)
class TagSubscription:
    """A parsed tag expression.

    ``sub_string`` is the expression as the broker keeps it (``"*"`` when it matches all),
    ``tags`` the exact tag strings, ``codes`` their Java hash codes (the consume-queue
    filter), ``match_all`` true for ``*`` / empty / ``None``.
    """

    sub_string: str
    tags: frozenset[str]
    codes: frozenset[int]
    match_all: bool

    def matches_code(self, tags_code: int) -> bool:
        """Consume-queue check: is this unit's tag hash code subscribed?"""
        if self.match_all:
            return True
        if tags_code in self.codes:
            return True
        # Java compares `tagsCode.intValue()`: the low 32 bits of the stored int64.
        if -0x80000000 <= tags_code <= 0x7FFFFFFF:
            return False
        low = tags_code & 0xFFFFFFFF
        return (low - 0x100000000 if low & 0x80000000 else low) in self.codes

    def matches_tag(self, tag: str | None) -> bool:
        """Exact check by tag string (what clients do after a pull)."""
        if self.match_all:
            return True
        return tag is not None and tag in self.tags


MATCH_ALL = TagSubscription(SUB_ALL, frozenset(), frozenset(), True)


@lru_cache(maxsize=4096)
def parse_tag_expression(expression: str | None) -> TagSubscription:
    """Parse a tag subscription expression; never raises (any string is a valid one)."""
    if not expression or expression == SUB_ALL:
        return MATCH_ALL
    tags = frozenset(
        tag for tag in (piece.strip(_JAVA_TRIM) for piece in expression.split(TAG_SEPARATOR)) if tag
    )
    codes = frozenset(java_string_hash(tag) for tag in tags)
    return TagSubscription(expression, tags, codes, False)
