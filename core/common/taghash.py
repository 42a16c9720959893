"""Tag hash codes: Java `String.hashCode()` of the TAGS value (docs/protocol.md §7.10).

The ConsumeQueue stores this code so a pull can filter by tag without reading the
CommitLog; clients re-check the exact tag string, so collisions are harmless.
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=65536)
def java_string_hash(text: str) -> int:
    """Java's `String.hashCode()`: h = 31*h + c over UTF-16 code units, signed 32-bit."""
    h = 0
    if text.isascii():
        for c in text.encode("ascii"):
            h = (31 * h + c) & 0xFFFFFFFF
    else:
        data = text.encode("utf-16-be", "surrogatepass")
        for i in range(0, len(data), 2):
            h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def tag_hash(tags: str | None) -> int:
    """The consume-queue tag code of a message: 0 when it has no tag."""
    if not tags:
        return 0
    return java_string_hash(tags)
