"""A small hand-written Pratt parser for `select[]` (DESIGN §6).

Precedence, loosest first (LSF's order): `or ||` < `and &&` < `not !` <
comparisons and `has`/`has_any`/`has_all` (not chainable) < `+ -` < `* /` <
unary `-`.  `!` binds like `not`, so `!a == b` is `!(a == b)`.
"""

from __future__ import annotations

import dataclasses
from typing import Final, NoReturn

from projections.select.ast import (
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
from projections.select.lexer import Token, fail, tokenize
from schemas.errors import ExpressionError

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


def strip_wrapper(expression: str) -> tuple[int, int]:
    """The span of the expression proper: inside `select[...]` if it is wrapped."""
    start = len(expression) - len(expression.lstrip())
    end = max(start, len(expression.rstrip()))
    if expression.startswith("select[", start):
        inner = start + len("select[")
        close = expression.rfind("]", inner, end)
        if close != end - 1:
            if close < 0:
                fail("'select[' is not closed by ']'", expression, start + len("select"))
            rest = expression[close + 1:]
            fail("unexpected text after 'select[...]'", expression,
                 close + 1 + len(rest) - len(rest.lstrip()))
        return inner, close
    return start, end


class Parser:
    """Parses one expression; use `parse`."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        start, end = strip_wrapper(expression)
        self.tokens = tokenize(expression, start, end)
        self.i = 0

    def fail(self, message: str, column: int) -> NoReturn:
        """Raise an ExpressionError at `column`."""
        fail(message, self.expression, column)

    def peek(self) -> Token:
        """The next token, not consumed."""
        return self.tokens[self.i]

    def advance(self) -> Token:
        """Consume and return the next token."""
        tok = self.tokens[self.i]
        if tok.kind != "eof":
            self.i += 1
        return tok

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
            self.fail(f"unexpected {tok.describe()} after a complete expression", tok.start)
        return node

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
            right = self.operand(lbp, tok)
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


def parse(expression: str) -> Node:
    """The untyped syntax tree of `expression` (bare or `select[...]`-wrapped)."""
    return Parser(expression).parse()
