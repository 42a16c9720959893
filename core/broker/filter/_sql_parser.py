"""AST and recursive-descent parser of the SQL92 selector language.

The precedence levels are RocketMQ's (``SelectorParser.jj``), lowest first::

    or:          and (OR and)*
    and:         equality (AND equality)*
    equality:    comparison ('=' comparison | '<>' comparison | IS [NOT] NULL)*
    comparison:  unary ('>' unary | '>=' unary | '<' unary | '<=' unary
                        | [NOT] BETWEEN unary AND unary | [NOT] IN '(' string (',' string)* ')'
                        | [NOT] (CONTAINS | STARTSWITH | ENDSWITH) string)*
    unary:       '+' unary | '-' unary | NOT unary | primary
    primary:     literal | identifier | '(' or ')'

Note that NOT is a *unary* operator binding tighter than every comparison, as in
RocketMQ: ``NOT a = 'x'`` means ``(NOT a) = 'x'``. Write ``NOT (a = 'x')``. (The compiler
rejects the ill-typed forms this produces, so the surprise is an error, not a silent
mismatch.)

Nodes are small frozen dataclasses; AND/OR chains are flattened into n-ary nodes so that
a long ``a=1 OR a=2 OR ...`` list is one level deep instead of thousands.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.broker.filter._sql_lexer import EOF, FLOAT, ID, INT, KW, OP, STR, Token, tokenize
from core.broker.filter.errors import FilterParseError

_STRING_OPS = frozenset({"CONTAINS", "STARTSWITH", "ENDSWITH"})
_AFTER_NOT = _STRING_OPS | {"BETWEEN", "IN"}
_ORDERING_OPS = frozenset({">", ">=", "<", "<="})


def _quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


# --- AST -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Prop:
    """A message property, by name."""

    name: str

    def children(self) -> tuple[Node, ...]:
        return ()

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class StrLit:
    value: str

    def children(self) -> tuple[Node, ...]:
        return ()

    def __str__(self) -> str:
        return _quote(self.value)


@dataclass(frozen=True, slots=True)
class NumLit:
    """An integer (Python int, Java long) or decimal (Python float, Java double)."""

    value: int | float

    def children(self) -> tuple[Node, ...]:
        return ()

    def __str__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True, slots=True)
class BoolLit:
    value: bool

    def children(self) -> tuple[Node, ...]:
        return ()

    def __str__(self) -> str:
        return "TRUE" if self.value else "FALSE"


@dataclass(frozen=True, slots=True)
class NullLit:
    def children(self) -> tuple[Node, ...]:
        return ()

    def __str__(self) -> str:
        return "NULL"


@dataclass(frozen=True, slots=True)
class Not:
    operand: Node

    def children(self) -> tuple[Node, ...]:
        return (self.operand,)

    def __str__(self) -> str:
        return f"(NOT {self.operand})"


@dataclass(frozen=True, slots=True)
class And:
    operands: tuple[Node, ...]

    def children(self) -> tuple[Node, ...]:
        return self.operands

    def __str__(self) -> str:
        return "(" + " AND ".join(map(str, self.operands)) + ")"


@dataclass(frozen=True, slots=True)
class Or:
    operands: tuple[Node, ...]

    def children(self) -> tuple[Node, ...]:
        return self.operands

    def __str__(self) -> str:
        return "(" + " OR ".join(map(str, self.operands)) + ")"


@dataclass(frozen=True, slots=True)
class Compare:
    """``left op right`` with op one of ``= <> > >= < <=``."""

    op: str
    left: Node
    right: Node

    def children(self) -> tuple[Node, ...]:
        return (self.left, self.right)

    def __str__(self) -> str:
        return f"({self.left} {self.op} {self.right})"


@dataclass(frozen=True, slots=True)
class IsNull:
    operand: Node
    negated: bool

    def children(self) -> tuple[Node, ...]:
        return (self.operand,)

    def __str__(self) -> str:
        return f"({self.operand} IS {'NOT ' if self.negated else ''}NULL)"


@dataclass(frozen=True, slots=True)
class Between:
    operand: Node
    low: Node
    high: Node
    negated: bool

    def children(self) -> tuple[Node, ...]:
        return (self.operand, self.low, self.high)

    def __str__(self) -> str:
        word = "NOT BETWEEN" if self.negated else "BETWEEN"
        return f"({self.operand} {word} {self.low} AND {self.high})"


@dataclass(frozen=True, slots=True)
class In:
    operand: Node
    values: tuple[str, ...]
    negated: bool

    def children(self) -> tuple[Node, ...]:
        return (self.operand,)

    def __str__(self) -> str:
        word = "NOT IN" if self.negated else "IN"
        return f"({self.operand} {word} ({', '.join(map(_quote, self.values))}))"


@dataclass(frozen=True, slots=True)
class StrMatch:
    """``operand [NOT] CONTAINS|STARTSWITH|ENDSWITH 'pattern'``."""

    op: str
    operand: Node
    pattern: str
    negated: bool

    def children(self) -> tuple[Node, ...]:
        return (self.operand,)

    def __str__(self) -> str:
        word = f"NOT {self.op}" if self.negated else self.op
        return f"({self.operand} {word} {_quote(self.pattern)})"


Node = (
    Prop | StrLit | NumLit | BoolLit | NullLit
    | Not | And | Or | Compare | IsNull | Between | In | StrMatch
)


def ast_depth(node: Node) -> int:
    """Height of the tree (a leaf is 1), computed without recursion."""
    best = 0
    stack = [(node, 1)]
    while stack:
        current, depth = stack.pop()
        if depth > best:
            best = depth
        stack.extend((child, depth + 1) for child in current.children())
    return best


def property_names(node: Node) -> frozenset[str]:
    """Every property the expression reads."""
    names = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, Prop):
            names.add(current.name)
        stack.extend(current.children())
    return frozenset(names)


# --- parser ----------------------------------------------------------------------------


def parse(source: str, max_depth: int) -> Node:
    """Parse ``source`` into an AST; raise FilterParseError.

    ``max_depth`` bounds both the parser's recursion (parentheses, unary operators) and the
    height of the resulting tree, so neither parsing nor evaluation can exhaust the stack.
    """
    node = _Parser(tokenize(source), max_depth).parse()
    depth = ast_depth(node)
    if depth > max_depth:
        raise FilterParseError(f"expression nests {depth} levels deep, the limit is {max_depth}")
    return node


class _Parser:
    __slots__ = ("_tokens", "_i", "_max_depth", "_nesting")

    def __init__(self, tokens: list[Token], max_depth: int) -> None:
        self._tokens = tokens
        self._i = 0
        self._max_depth = max_depth
        self._nesting = 0

    # token helpers

    def _peek(self, ahead: int = 0) -> Token:
        return self._tokens[min(self._i + ahead, len(self._tokens) - 1)]

    def _next(self) -> Token:
        tok = self._tokens[self._i]
        if tok.kind != EOF:
            self._i += 1
        return tok

    def _at_kw(self, word: str, ahead: int = 0) -> bool:
        tok = self._peek(ahead)
        return tok.kind == KW and tok.value == word

    def _at_op(self, op: str) -> bool:
        tok = self._peek()
        return tok.kind == OP and tok.value == op

    def _fail(self, tok: Token, expected: str) -> FilterParseError:
        return FilterParseError(f"unexpected {tok.describe()}, expected {expected}", tok.pos)

    def _expect_op(self, op: str) -> None:
        if not self._at_op(op):
            raise self._fail(self._peek(), f"'{op}'")
        self._next()

    def _expect_kw(self, word: str) -> None:
        if not self._at_kw(word):
            raise self._fail(self._peek(), word)
        self._next()

    def _expect_string(self, context: str) -> str:
        tok = self._peek()
        if tok.kind != STR:
            raise self._fail(tok, f"a string literal after {context}")
        self._next()
        return tok.value  # type: ignore[return-value]

    def _enter(self, tok: Token) -> None:
        self._nesting += 1
        if self._nesting > self._max_depth:
            raise FilterParseError(f"expression nested deeper than {self._max_depth}", tok.pos)

    # grammar

    def parse(self) -> Node:
        node = self._or()
        tok = self._peek()
        if tok.kind != EOF:
            raise self._fail(tok, "an operator or the end of the expression")
        return node

    def _or(self) -> Node:
        first = self._and()
        if not self._at_kw("OR"):
            return first
        items = list(first.operands) if isinstance(first, Or) else [first]
        while self._at_kw("OR"):
            self._next()
            node = self._and()
            items.extend(node.operands if isinstance(node, Or) else (node,))
        return Or(tuple(items))

    def _and(self) -> Node:
        first = self._equality()
        if not self._at_kw("AND"):
            return first
        items = list(first.operands) if isinstance(first, And) else [first]
        while self._at_kw("AND"):
            self._next()
            node = self._equality()
            items.extend(node.operands if isinstance(node, And) else (node,))
        return And(tuple(items))

    def _equality(self) -> Node:
        left = self._comparison()
        while True:
            tok = self._peek()
            if tok.kind == OP and tok.value in ("=", "<>"):
                self._next()
                left = Compare(tok.value, left, self._comparison())  # type: ignore[arg-type]
            elif self._at_kw("IS"):
                self._next()
                negated = self._at_kw("NOT")
                if negated:
                    self._next()
                self._expect_kw("NULL")
                left = IsNull(left, negated)
            else:
                return left

    def _comparison(self) -> Node:
        left = self._unary()
        while True:
            tok = self._peek()
            if tok.kind == OP and tok.value in _ORDERING_OPS:
                self._next()
                left = Compare(tok.value, left, self._unary())  # type: ignore[arg-type]
                continue
            negated = False
            after = self._peek(1)
            if tok.kind == KW and tok.value == "NOT" and after.kind == KW \
                    and after.value in _AFTER_NOT:
                negated = True
                self._next()
                tok = self._peek()
            if tok.kind != KW:
                return left
            word = tok.value
            if word in _STRING_OPS:
                self._next()
                pattern = self._expect_string(word)  # type: ignore[arg-type]
                left = StrMatch(word, left, pattern, negated)  # type: ignore[arg-type]
            elif word == "BETWEEN":
                self._next()
                low = self._unary()
                self._expect_kw("AND")
                left = Between(left, low, self._unary(), negated)
            elif word == "IN":
                self._next()
                left = In(left, self._string_list(), negated)
            else:
                return left

    def _string_list(self) -> tuple[str, ...]:
        self._expect_op("(")
        values = [self._expect_string("IN (")]
        while self._at_op(","):
            self._next()
            values.append(self._expect_string("','"))
        self._expect_op(")")
        return tuple(values)

    def _unary(self) -> Node:
        tok = self._peek()
        if tok.kind == OP and tok.value in ("+", "-"):
            self._next()
            self._enter(tok)
            operand = self._unary()
            self._nesting -= 1
            if tok.value == "+":
                return operand
            if not isinstance(operand, NumLit):
                # RocketMQ accepts `-prop` but it always evaluates to NULL (properties are
                # strings), so it can never match: reject it instead.
                raise FilterParseError("unary minus applies to numeric literals only", tok.pos)
            return NumLit(-operand.value)
        if tok.kind == KW and tok.value == "NOT":
            self._next()
            self._enter(tok)
            operand = self._unary()
            self._nesting -= 1
            return Not(operand)
        return self._primary()

    def _primary(self) -> Node:
        tok = self._next()
        kind = tok.kind
        if kind == ID:
            return Prop(tok.value)  # type: ignore[arg-type]
        if kind == STR:
            return StrLit(tok.value)  # type: ignore[arg-type]
        if kind in (INT, FLOAT):
            return NumLit(tok.value)  # type: ignore[arg-type]
        if kind == KW:
            if tok.value == "TRUE":
                return BoolLit(True)
            if tok.value == "FALSE":
                return BoolLit(False)
            if tok.value == "NULL":
                return NullLit()
        elif kind == OP and tok.value == "(":
            self._enter(tok)
            node = self._or()
            self._expect_op(")")
            self._nesting -= 1
            return node
        raise self._fail(tok, "a property, a literal or '('")
