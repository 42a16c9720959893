"""`shown`: what of a peer-controlled string (topic, client id, user name) goes in a log.

A peer chooses these strings; logging them whole lets one client write 64 KB lines (or
fill the disk) with refused packets. Every log line in gateway/mqtt that carries such a
value passes it through `shown`: a short prefix and, when cut, the full length.
"""

from __future__ import annotations

__all__ = ["shown", "LOG_TEXT_MAX"]

#: Characters of a peer-controlled string kept in a log line.
LOG_TEXT_MAX = 64


def shown(value: object, limit: int = LOG_TEXT_MAX) -> str:
    """`repr` of at most `limit` characters of `value`, with its length when cut."""
    if value is None:
        return "None"
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} chars)"
