"""Reversible, collision-safe names of LMQ topics for MQTT filters and AMQP queues.

RocketMQ topic names allow only `[%|a-zA-Z0-9_-]` and at most 127 characters
(TopicValidator); LMQ topics start with `%LMQ%` (RIP-28). MQTT filters and AMQP queue
names are arbitrary UTF-8, so they are mapped as follows.

Escaped form, used whenever it fits:  `%LMQ%` + namespace + `_` + escape(name)

  escape() keeps `[a-zA-Z0-9_-]` as they are and writes every other character as
  `|` + a code:
    * a short code for characters that are common in filters and queue names:
      `/`->`|s`  `.`->`|o`  `+`->`|p`  `#`->`|h`  `$`->`|m`  `:`->`|k`  ` `->`|w`
      `*`->`|t`;
    * otherwise each byte of its UTF-8 encoding as `|` + two lowercase hex digits
      (`é` -> `|c3|a9`, `|` itself -> `|7c`).
  Short codes are letters outside [0-9a-f], so after a `|` the next character says
  which kind follows; a literal is never `|`. The code is prefix-free, hence decoding
  is unique, and every character has exactly one encoding, hence escape() is
  injective. `decode` accepts only this canonical form (no uppercase hex, no hex
  escape of a literal or short-coded character).

Hashed form, when the escaped form exceeds the limit:
  `%LMQ%` + namespace + `-` + hex(blake2b-160(namespace + NUL + UTF-8 name))

  Not reversible: the caller MUST record hash -> name in its name table (the function
  says so with `LmqName.hashed`). 160 bits keep accidental collisions out of reach.

Namespaces are 1..8 characters of `[a-z0-9]` (`m` for MQTT filters, `a` for AMQP
queues). The namespace ends at the first `_` or `-`, which it cannot contain, so two
namespaces, or the two forms, never produce the same topic.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

__all__ = [
    "AMQP",
    "LMQ_PREFIX",
    "MAX_TOPIC_LENGTH",
    "MQTT",
    "LmqName",
    "decode",
    "encode",
    "escape",
    "hashed_topic",
    "is_hashed",
    "unescape",
]

LMQ_PREFIX = "%LMQ%"
#: RocketMQ's TopicValidator.TOPIC_MAX_LENGTH.
MAX_TOPIC_LENGTH = 127
MQTT = "m"
AMQP = "a"

_HASH_BYTES = 20
_NAMESPACE = re.compile(r"[a-z0-9]{1,8}")
_LITERAL = re.compile(r"[a-zA-Z0-9_-]*")
_SHORT = {"/": "s", ".": "o", "+": "p", "#": "h", "$": "m", ":": "k", " ": "w", "*": "t"}
_SHORT_REVERSE = {code: char for char, code in _SHORT.items()}
_HEX = frozenset("0123456789abcdef")
_LITERAL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
# One entry per ASCII character: its escaped text.
_ASCII = {
    chr(i): (chr(i) if chr(i) in _LITERAL_CHARS else "|" + _SHORT.get(chr(i), f"{i:02x}"))
    for i in range(128)
}


@dataclass(frozen=True, slots=True)
class LmqName:
    """An LMQ topic; `hashed` means the caller must store topic -> name itself."""

    topic: str
    hashed: bool


def escape(name: str) -> str:
    """The injective `[|a-zA-Z0-9_-]` escape of `name` (see the module doc)."""
    if _LITERAL.fullmatch(name):
        return name
    out = []
    for char in name:
        text = _ASCII.get(char)
        if text is None:
            try:
                data = char.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("name is not valid UTF-8 (lone surrogate)") from None
            text = "".join(f"|{b:02x}" for b in data)
        out.append(text)
    return "".join(out)


def unescape(text: str) -> str | None:
    """Inverse of `escape`; None unless `text` is a canonical escaped form."""
    raw = bytearray()
    i = 0
    n = len(text)
    while i < n:
        char = text[i]
        if char != "|":
            if char not in _LITERAL_CHARS:
                return None
            raw.append(ord(char))
            i += 1
            continue
        code = text[i + 1 : i + 2]
        if code in _SHORT_REVERSE:
            raw.extend(_SHORT_REVERSE[code].encode())
            i += 2
            continue
        digits = text[i + 1 : i + 3]
        if len(digits) != 2 or not _HEX.issuperset(digits):
            return None
        raw.append(int(digits, 16))
        i += 3
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return name if escape(name) == text else None


def _check_namespace(namespace: str) -> None:
    if not _NAMESPACE.fullmatch(namespace):
        raise ValueError(f"namespace must match [a-z0-9]{{1,8}}: {namespace!r}")


def hashed_topic(namespace: str, name: str) -> str:
    """The hashed-form topic of `name` (used when the escaped form is too long)."""
    _check_namespace(namespace)
    digest = hashlib.blake2b(
        namespace.encode() + b"\x00" + name.encode("utf-8"), digest_size=_HASH_BYTES
    ).hexdigest()
    return f"{LMQ_PREFIX}{namespace}-{digest}"


def encode(namespace: str, name: str, *, max_length: int = MAX_TOPIC_LENGTH) -> LmqName:
    """Map `name` of `namespace` to an LMQ topic of at most `max_length` characters.

    The escaped form when it fits (reversible with `decode`), else the hashed form with
    `hashed=True`: the caller must then keep topic -> name in its name table.
    """
    _check_namespace(namespace)
    topic = f"{LMQ_PREFIX}{namespace}_{escape(name)}"
    if len(topic) <= max_length:
        return LmqName(topic, False)
    topic = hashed_topic(namespace, name)
    if len(topic) > max_length:
        raise ValueError(f"max_length {max_length} too small for a hashed LMQ name")
    return LmqName(topic, True)


def _split(topic: str) -> tuple[str, str, str] | None:
    if not topic.startswith(LMQ_PREFIX):
        return None
    rest = topic[len(LMQ_PREFIX) :]
    match = re.match(r"([a-z0-9]{1,8})([_-])", rest)
    if match is None:
        return None
    return match.group(1), match.group(2), rest[match.end() :]


def decode(topic: str) -> tuple[str, str] | None:
    """(namespace, name) of an escaped-form topic; None for a hashed or foreign topic."""
    parts = _split(topic)
    if parts is None or parts[1] != "_":
        return None
    name = unescape(parts[2])
    return None if name is None else (parts[0], name)


def is_hashed(topic: str) -> bool:
    """True for a hashed-form topic (look its name up in the name table)."""
    parts = _split(topic)
    return (
        parts is not None
        and parts[1] == "-"
        and len(parts[2]) == 2 * _HASH_BYTES
        and _HEX.issuperset(parts[2])
    )
