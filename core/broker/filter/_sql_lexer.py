"""Tokenizer of RocketMQ's SQL92 message selector language.

Token rules follow RocketMQ's ``SelectorParser.jj`` (itself ActiveMQ's JMS selector
grammar, trimmed): keywords are case-insensitive, strings are single-quoted with ``''``
as the only escape, integers are ``0 | [1-9][0-9]*[lL]?`` (no octal, no hex), floats are
``1.5``, ``1.``, ``.5``, ``1e3``, ``1.5E-3``; ``--`` line and ``/* */`` block comments are
skipped. Where two number forms could match, the longest wins, as in JavaCC, so ``007``
lexes as three tokens and fails in the parser exactly as it does in RocketMQ.

Deliberate differences: identifiers may contain ``.`` (``[A-Za-z_$][A-Za-z0-9_.$]*``, so
header names such as ``x.y`` are usable; RocketMQ has no dot), and a ``--`` comment may end
at the end of input (JavaCC requires a newline).
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from core.broker.filter.errors import FilterParseError

# RocketMQ 4.x keywords plus STARTSWITH/ENDSWITH/CONTAINS (added in RocketMQ 5.1.3).
KEYWORDS = frozenset(
    {
        "NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS",
        "CONTAINS", "STARTSWITH", "ENDSWITH",
    }
)

# Token kinds.
KW = "keyword"
ID = "identifier"
STR = "string"
INT = "integer"
FLOAT = "float"
OP = "operator"
EOF = "end of input"

_WHITESPACE = frozenset(" \t\n\r\f")
_IDENT = re.compile(r"[A-Za-z_$][A-Za-z0-9_.$]*")
_DECIMAL = re.compile(r"0|[1-9][0-9]*[lL]?")
_FLOATING = re.compile(
    r"(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+"
)
_TWO_CHAR_OPS = frozenset({"<>", "<=", ">="})
_ONE_CHAR_OPS = frozenset("=<>(),+-")
_LONG_MAX = (1 << 63) - 1


class Token(NamedTuple):
    """One lexeme: ``kind`` (a module constant), ``value`` (decoded), ``pos`` (0-based)."""

    kind: str
    value: str | int | float
    pos: int

    def describe(self) -> str:
        if self.kind == EOF:
            return EOF
        if self.kind == STR:
            return "string literal"
        return f"{self.kind} {self.value!r}"


def tokenize(source: str) -> list[Token]:
    """Split ``source`` into tokens ending with an EOF token; raise FilterParseError."""
    tokens: list[Token] = []
    append = tokens.append
    i = 0
    n = len(source)
    while i < n:
        c = source[i]
        if c in _WHITESPACE:
            i += 1
        elif c == "-" and source.startswith("--", i):
            end = _line_end(source, i)
            i = end
        elif c == "/" and source.startswith("/*", i):
            end = source.find("*/", i + 2)
            if end < 0:
                raise FilterParseError("unterminated /* comment", i)
            i = end + 2
        elif c == "'":
            value, i_next = _string(source, i)
            append(Token(STR, value, i))
            i = i_next
        elif "0" <= c <= "9" or (c == "." and i + 1 < n and "0" <= source[i + 1] <= "9"):
            tok, i = _number(source, i)
            append(tok)
        elif c.isascii() and (c.isalpha() or c in "_$"):
            m = _IDENT.match(source, i)
            assert m is not None  # the first char already qualifies
            word = m.group()
            upper = word.upper()
            if upper in KEYWORDS:
                append(Token(KW, upper, i))
            else:
                append(Token(ID, word, i))
            i = m.end()
        elif source.startswith("!=", i):
            # RocketMQ's grammar has only `<>`; accepting `!=` would let a subscription
            # work here and fail on a Java broker.
            raise FilterParseError("'!=' is not SQL92, use '<>'", i)
        elif source[i : i + 2] in _TWO_CHAR_OPS:
            append(Token(OP, source[i : i + 2], i))
            i += 2
        elif c in _ONE_CHAR_OPS:
            append(Token(OP, c, i))
            i += 1
        else:
            raise FilterParseError(f"unexpected character {c!r}", i)
    append(Token(EOF, "", n))
    return tokens


def _line_end(source: str, i: int) -> int:
    for j in range(i + 2, len(source)):
        if source[j] in "\r\n":
            return j + 1
    return len(source)


def _string(source: str, start: int) -> tuple[str, int]:
    """Decode the quoted string at ``start``; return (value, index after closing quote)."""
    parts: list[str] = []
    j = start + 1
    while True:
        k = source.find("'", j)
        if k < 0:
            raise FilterParseError("unterminated string literal", start)
        if source.startswith("''", k):
            parts.append(source[j : k + 1])  # keep one quote of the pair
            j = k + 2
            continue
        parts.append(source[j:k])
        return "".join(parts), k + 1


def _number(source: str, start: int) -> tuple[Token, int]:
    dec = _DECIMAL.match(source, start)
    flt = _FLOATING.match(source, start)
    dec_end = dec.end() if dec else start
    flt_end = flt.end() if flt else start
    if flt_end > dec_end:
        text = source[start:flt_end]
        value = float(text)
        if math.isinf(value):
            raise FilterParseError(f"floating point literal {text} is out of range", start)
        return Token(FLOAT, value, start), flt_end
    if dec is None:  # a digit always starts a decimal; ".5" always matches _FLOATING
        raise FilterParseError("bad number", start)
    text = source[start:dec_end].rstrip("lL")
    # The length test comes first: int() refuses strings of more than 4300 digits.
    if len(text) > 19 or int(text) > _LONG_MAX:
        # Java parses the literal as a long before any unary minus, so even
        # -9223372036854775808 is rejected there; we do the same.
        raise FilterParseError(f"integer literal {text} is out of range", start)
    return Token(INT, int(text), start), dec_end
