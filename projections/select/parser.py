"""A small hand-written Pratt parser for `select[]` (docs/contract.md, "The `select[]` language").

Precedence, loosest first: `or ||` < `and &&` < `not !` < comparisons and
`has`/`has_any`/`has_all` (not chainable) < `+ -` < `* /` < unary `-`.
`!` binds like `not`, so `!a == b` parses as `!(a == b)` — but LSF (like C)
binds `!` tightest, reading `(!a) == b`; the typechecker rejects that
ambiguous form unless both readings agree (see `typecheck`).

The input may be a whole LSF requirement string: `requirement.split` finds
its select section and the parser reads only that span (offsets stay those
of the whole string, so carets point into what the operator wrote).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Final, NoReturn

from crr.projections.select.ast import (
    Arith,
    ArithOp,
    Bool,
    Call,
    Compare,
    CompareOp,
    FuncName,
    Has,
    HasOp,
    Logic,
    Name,
    Neg,
    Node,
    Not,
    Num,
    Str,
)
from crr.projections.select.lexer import Token, bare_word_end, fail, next_token
from crr.projections.select.requirement import Requirement, split
from crr.schemas.errors import ExpressionError

_OR: Final = 10
_AND: Final = 20
_NOT: Final = 30
_CMP: Final = 40
_SUM: Final = 50
_PRODUCT: Final = 60
_UNARY: Final = 70

_COMPARE: Final[dict[str, CompareOp]] = {
    "==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">=",
}
_ARITH: Final[dict[str, ArithOp]] = {"+": "+", "-": "-", "*": "*", "/": "/"}
_HAS: Final[dict[str, HasOp]] = {"has": "has", "has_any": "has_any", "has_all": "has_all"}
_FUNCS: Final[dict[str, FuncName]] = {"defined": "defined", "count": "count"}
_PLAIN_NAME: Final = re.compile(r"[A-Za-z0-9_]+")
KEYWORDS: Final = frozenset({"and", "or", "not", "has", "has_any", "has_all", "true", "false"})


def _infix_power(tok: Token) -> int:
    text = tok.text
    if tok.kind == "ident":
        return {"or": _OR, "and": _AND}.get(text, _CMP if text in _HAS else 0)
    if tok.kind != "op":
        return 0
    if text == "||":
        return _OR
    if text == "&&":
        return _AND
    if text in _COMPARE:
        return _CMP
    if text in ("+", "-"):
        return _SUM
    if text in ("*", "/"):
        return _PRODUCT
    return 0


class Parser:
    """Parses the select expression of one requirement string; use `parse`.

    Tokens are read on demand (one token of look-ahead), so that where a
    string is expected — on the right of a comparison whose left is a
    string resource named in `strings` — the parser can take an LSF bare
    word (`RHEL4.6`, `1.3.29`, `XeonE5-2650`) as one string literal
    instead of tokens (`XeonE5 - 2650` would be arithmetic elsewhere).
    """

    def __init__(self, expression: str, strings: frozenset[str] = frozenset(),
                 span: tuple[int, int] | None = None) -> None:
        self.expression = expression
        self.strings = strings
        self.start, self.stop = (0, len(expression)) if span is None else span
        self.pos = self.start
        self._next: Token | None = None

    def fail(self, message: str, column: int) -> NoReturn:
        """Raise an ExpressionError at `column`."""
        fail(message, self.expression, column)

    def peek(self) -> Token:
        """The next token, not consumed."""
        if self._next is None:
            self._next = next_token(self.expression, self.pos, self.stop)
        return self._next

    def advance(self) -> Token:
        """Consume and return the next token."""
        tok = self.peek()
        self.pos = tok.end
        self._next = None
        return tok

    def bare_word(self) -> Str | None:
        """An LSF bare word that is not a plain name, as a string literal (None: not one).

        Plain names stay names (the typechecker makes a non-resource one a
        string); keywords, quotes, operators and parentheses are not words.
        """
        i = self.pos
        while i < self.stop and self.expression[i].isspace():
            i += 1
        end = bare_word_end(self.expression, i, self.stop)
        word = self.expression[i:end]
        if not word or (_PLAIN_NAME.fullmatch(word) and not word[0].isdigit()):
            return None
        self.pos, self._next = end, None
        return Str(value=word, start=i, end=end, pos=i)

    def parse(self) -> Node:
        """The whole expression; trailing tokens are an error."""
        first = self.peek()
        if first.kind == "eof":
            self.fail("empty expression", first.start)
        node = self.expr(0)
        tok = self.peek()
        if tok.kind != "eof":
            if tok.text == ")":
                self.fail("unmatched ')'", tok.start)
            self.fail(f"unexpected {tok.describe()} after a complete expression"
                      f"{self.glued_hint(tok)}", tok.start)
        return node

    def glued_hint(self, tok: Token) -> str:
        """For `RHEL4.6 == os`: a hint that a bare word with dots is a string only on the right."""
        text = self.expression
        if tok.start == 0 or not tok.text.startswith(".") or not _PLAIN_NAME.fullmatch(
                text[tok.start - 1]):
            return ""
        start = tok.start
        while start > self.start and _PLAIN_NAME.fullmatch(text[start - 1]):
            start -= 1
        word = text[start:bare_word_end(text, start, self.stop)]
        return (f"; a bare word like {word} is a string only on the right of a comparison "
                f"with a string resource: quote it ('{word}')")

    def expr(self, rbp: int) -> Node:
        """Pratt loop: an operand, then infix operators that bind tighter than `rbp`."""
        left = self.nud(self.advance())
        while True:
            tok = self.peek()
            lbp = _infix_power(tok)
            if lbp <= rbp:
                return left
            self.advance()
            left = self.led(tok, left, lbp)

    def operand(self, rbp: int, after: Token) -> Node:
        """The right-hand operand of `after`."""
        if self.peek().kind == "eof":
            self.fail(f"'{after.text}' has no right-hand operand", after.start)
        return self.expr(rbp)

    def nud(self, tok: Token) -> Node:
        """An operand (or a prefix operator applied to one)."""
        if tok.kind == "num":
            assert isinstance(tok.value, float)
            return Num(value=tok.value, start=tok.start, end=tok.end, pos=tok.start)
        if tok.kind == "str":
            assert isinstance(tok.value, str)
            return Str(value=tok.value, start=tok.start, end=tok.end, pos=tok.start)
        if tok.kind == "eof":
            self.fail("expected an operand", tok.start)
        text = tok.text
        if tok.kind == "ident":
            if text in ("true", "false"):
                return Bool(value=text == "true", start=tok.start, end=tok.end, pos=tok.start)
            if text == "not":
                return self.negation(tok)
            if text in KEYWORDS:
                raise ExpressionError(f"expected an operand but found '{text}'",
                              expression=self.expression, column=tok.start)
            if self.peek().text == "(":
                return self.call(tok)
            return Name(name=text, start=tok.start, end=tok.end, pos=tok.start)
        if text == "!":
            return self.negation(tok)
        if text == "-":
            operand = self.operand(_UNARY, tok)
            return Neg(operand=operand, start=tok.start, end=operand.end, pos=tok.start)
        if text == "(":
            if self.peek().kind == "eof":
                self.fail("unclosed '('", tok.start)
            inner = self.expr(0)
            close = self.advance()
            if close.text != ")":
                if close.kind == "eof":
                    self.fail("unclosed '('", tok.start)
                self.fail(f"expected ')' but found {close.describe()}", close.start)
            # The parentheses belong to the operand's span (for explain and enclosing nodes).
            return dataclasses.replace(inner, start=tok.start, end=close.end)
        if text == "[":
            self.fail("a list is only allowed after has_any or has_all", tok.start)
        if text == ")":
            self.fail("expected an operand but found ')'", tok.start)
        raise ExpressionError(f"expected an operand but found '{text}'",
                              expression=self.expression, column=tok.start)

    def negation(self, tok: Token) -> Node:
        """`!x` / `not x`."""
        operand = self.operand(_NOT, tok)
        return Not(operand=operand, start=tok.start, end=operand.end, pos=tok.start)

    def call(self, name: Token) -> Node:
        """`defined(r)` / `count(s)`."""
        func = _FUNCS.get(name.text)
        if func is None:
            self.fail(f"unknown function '{name.text}' (known: count, defined)", name.start)
        paren = self.advance()
        arg = self.advance()
        if arg.kind == "eof":
            self.fail("unclosed '('", paren.start)
        if arg.kind != "ident" or arg.text in KEYWORDS:
            self.fail(f"{func}() takes a resource name, not {arg.describe()}", arg.start)
        close = self.advance()
        if close.text != ")":
            if close.kind == "eof":
                self.fail("unclosed '('", paren.start)
            self.fail(f"{func}() takes one resource name; expected ')' but found "
                      f"{close.describe()}", close.start)
        node = Name(name=arg.text, start=arg.start, end=arg.end, pos=arg.start)
        return Call(func=func, arg=node, start=name.start, end=close.end, pos=name.start)

    def led(self, tok: Token, left: Node, lbp: int) -> Node:
        """An infix operator `tok` with its left operand."""
        text = tok.text
        if text in ("||", "or", "&&", "and"):
            right = self.operand(lbp, tok)
            return Logic(op="or" if text in ("||", "or") else "and", left=left, right=right,
                         start=left.start, end=right.end, pos=tok.start)
        if text in _HAS:
            node: Node = self.has(tok, left)
        elif text in _COMPARE:
            word = (self.bare_word() if isinstance(left, Name) and left.name in self.strings
                    else None)
            right = word or self.operand(lbp, tok)
            node = Compare(op=_COMPARE[text], left=left, right=right, start=left.start,
                           end=right.end, pos=tok.start)
        else:
            right = self.operand(lbp, tok)
            return Arith(op=_ARITH[text], left=left, right=right, start=left.start,
                         end=right.end, pos=tok.start)
        nxt = self.peek()
        if _infix_power(nxt) == _CMP:
            self.fail(f"comparisons cannot be chained; join them with && "
                      f"(found {nxt.describe()})", nxt.start)
        return node

    def has(self, tok: Token, left: Node) -> Node:
        """`has "x"` / `has_any [...]` / `has_all [...]` after the set operand."""
        op = _HAS[tok.text]
        if op == "has":
            arg = self.advance()
            if arg.kind == "str":
                assert isinstance(arg.value, str)
                return Has(op=op, subject=left, members=(arg.value,), start=left.start,
                           end=arg.end, pos=tok.start)
            if arg.kind == "eof":
                self.fail("'has' has no right-hand operand", tok.start)
            if arg.text == "[":
                self.fail("'has' takes one string; use has_any or has_all with a list",
                          arg.start)
            self.fail(f"expected a quoted string after 'has' but found {arg.describe()}",
                      arg.start)
        bracket = self.advance()
        if bracket.text != "[":
            if bracket.kind == "eof":
                self.fail(f"'{op}' has no right-hand operand", tok.start)
            self.fail(f"expected a list [\"a\", \"b\"] after '{op}' but found "
                      f"{bracket.describe()}", bracket.start)
        members: list[str] = []
        while True:
            item = self.advance()
            if item.kind == "eof":
                self.fail("unclosed '['", bracket.start)
            if item.text == "]" and not members:
                break
            if item.kind != "str":
                after = "after ','" if members else "in the list"
                self.fail(f"expected a quoted string {after} but found {item.describe()}",
                          item.start)
            assert isinstance(item.value, str)
            members.append(item.value)
            sep = self.advance()
            if sep.text == "]":
                item = sep
                break
            if sep.kind == "eof":
                self.fail("unclosed '['", bracket.start)
            if sep.text != ",":
                self.fail(f"expected ',' or ']' in the list but found {sep.describe()}",
                          sep.start)
        return Has(op=op, subject=left, members=tuple(members), start=left.start,
                   end=item.end, pos=tok.start)


def parse_requirement(expression: str, strings: frozenset[str] = frozenset(),
                      ) -> tuple[Node, Requirement]:
    """The untyped tree of a requirement string's select section, and the split string.

    `expression` is bare (`scratch_free > 100`), wrapped (`select[...]`) or a
    whole LSF requirement string (see `requirement`).  A string with other
    sections but no select section is `true` (every host), as in LSF.
    `strings` names the string resources (bare words on their right are
    string literals).
    """
    req = split(expression)
    if req.select is None:
        at = req.ignored[0].column
        return Bool(value=True, start=at, end=at, pos=at), req
    return Parser(expression, strings, req.select).parse(), req


def parse(expression: str, strings: frozenset[str] = frozenset()) -> Node:
    """The untyped syntax tree of `expression` (see `parse_requirement`)."""
    return parse_requirement(expression, strings)[0]
