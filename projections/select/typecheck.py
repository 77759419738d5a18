"""Name resolution and kind checking of a parsed `select[]` expression.

Resolves bare words against the catalog (a bare word on the right of a
comparison with a string that is not a resource name is a string literal, as
in LSF), gives every node its kind (`numeric`, `boolean`, `string`,
`string_set`) and rejects ill-kinded expressions with an ExpressionError
pointing at the offending token.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import NoReturn

from crr.projections.select.ast import (
    Arith,
    Bool,
    Call,
    Compare,
    Has,
    Logic,
    Name,
    Neg,
    Node,
    Not,
    Num,
    Ref,
    Str,
)
from crr.projections.select.lexer import fail
from crr.schemas.catalog import Catalog, Kind


class Checker:
    """Typechecks one tree against a catalog; use `check`."""

    def __init__(self, expression: str, catalog: Catalog) -> None:
        self.expression = expression
        self.catalog = catalog

    def fail(self, message: str, column: int) -> NoReturn:
        """Raise an ExpressionError at `column`."""
        fail(message, self.expression, column)

    def text(self, node: Node) -> str:
        """The source text of `node`."""
        return self.expression[node.start:node.end]

    def check_root(self, node: Node) -> Node:
        """The whole expression, which must be a condition."""
        typed = self.check(node)
        if typed.ty != "boolean":
            self.fail(f"the expression must be a condition, but {self.text(typed)} is "
                      f"{typed.ty}{self.hint(typed)}", typed.start)
        return typed

    def hint(self, node: Node) -> str:
        """A suggestion for a non-boolean used as a condition."""
        if node.ty == "numeric":
            return f" (compare it, e.g. {self.text(node)} > 0)"
        if node.ty == "string_set" and isinstance(node, Ref):
            return f' (e.g. {node.name} has "x")'
        if node.ty == "string":
            return f' (e.g. {self.text(node)} == "x")'
        return ""

    def resolve(self, node: Name) -> Ref:
        """The resource a bare word names."""
        spec = self.catalog.resources.get(node.name)
        if spec is None:
            close = difflib.get_close_matches(node.name, list(self.catalog.resources), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            self.fail(f"unknown resource '{node.name}'{hint}", node.start)
        return Ref(name=node.name, start=node.start, end=node.end, pos=node.pos, ty=spec.kind)

    def need(self, node: Node, kinds: tuple[Kind, ...], what: str) -> None:
        """Fail at `node` unless its kind is one of `kinds`."""
        if node.ty not in kinds:
            self.fail(f"{what}, but {self.text(node)} is {node.ty}", node.start)

    def check(self, node: Node) -> Node:
        """`node` with names resolved and kinds filled in."""
        match node:
            case Num():
                return dataclasses.replace(node, ty="numeric")
            case Str():
                return dataclasses.replace(node, ty="string")
            case Bool():
                return dataclasses.replace(node, ty="boolean")
            case Name():
                return self.resolve(node)
            case Neg(operand=x):
                tx = self.check(x)
                self.need(tx, ("numeric",), "unary '-' needs a number")
                return dataclasses.replace(node, operand=tx, ty="numeric")
            case Arith(op=op, left=a, right=b):
                ta, tb = self.check(a), self.check(b)
                self.need(ta, ("numeric",), f"'{op}' needs numbers")
                self.need(tb, ("numeric",), f"'{op}' needs numbers")
                return dataclasses.replace(node, left=ta, right=tb, ty="numeric")
            case Compare():
                return self.compare(node)
            case Logic(op=op, left=a, right=b):
                ta, tb = self.check(a), self.check(b)
                word = "&&" if op == "and" else "||"
                for t in (ta, tb):
                    if t.ty != "boolean":
                        self.fail(f"'{word}' needs conditions on both sides, but "
                                  f"{self.text(t)} is {t.ty}{self.hint(t)}", t.start)
                return dataclasses.replace(node, left=ta, right=tb, ty="boolean")
            case Not(operand=x):
                tx = self.check(x)
                if isinstance(tx, Compare):
                    self.ambiguous_not(node, tx)
                if tx.ty != "boolean":
                    self.fail(f"'!'/'not' needs a condition, but {self.text(tx)} is "
                              f"{tx.ty}{self.hint(tx)}", tx.start)
                return dataclasses.replace(node, operand=tx, ty="boolean")
            case Has(op=op, subject=s):
                ts = self.check(s)
                if ts.ty != "string_set":
                    self.fail(f"'{op}' needs a string_set resource on its left, but "
                              f"{self.text(ts)} is {ts.ty}", ts.start)
                return dataclasses.replace(node, subject=ts, ty="boolean")
            case Call(func=func, arg=arg):
                assert isinstance(arg, Name)
                ref = self.resolve(arg)
                if func == "count":
                    if ref.ty != "string_set":
                        self.fail(f"count() needs a string_set resource, but {ref.name} is "
                                  f"{ref.ty}", ref.start)
                    return dataclasses.replace(node, arg=ref, ty="numeric")
                return dataclasses.replace(node, arg=ref, ty="boolean")
            case _:
                raise AssertionError(f"unexpected node {node!r}")

    def ambiguous_not(self, node: Not, operand: Compare) -> None:
        """Reject `!a == b` (an unparenthesised comparison right after `!`/`not`).

        crr reads it `!(a == b)`; LSF, like C, binds `!` tightest: `(!a) == b`.
        The two agree only for `==`/`!=` with a boolean on the left (negating
        one side of a boolean equality negates the equality, Kleene too), so
        that form (`!r == s`) is accepted; every other one is an error showing
        both parenthesisations, with the caret on the `!`.
        """
        if operand.end != operand.right.end:
            return  # `!(a == b)`: the parentheses belong to the operand's span
        if operand.op in ("==", "!=") and operand.left.ty == "boolean":
            return
        word = "not " if self.expression.startswith("not", node.pos) else "!"
        first: Node = operand
        while isinstance(first, Compare | Arith):
            first = first.left
        ours = f"{word}({self.text(operand)})"
        lsf = f"({word}{self.text(first)}){self.expression[first.end:operand.end]}"
        self.fail(f"ambiguous '{word.strip()}' before a comparison: write {ours} to negate "
                  f"the comparison, or {lsf} for LSF's reading ('{word.strip()}' binds "
                  "tightest)", node.pos)

    def compare(self, node: Compare) -> Node:
        """A comparison: same kinds on both sides; ordering only on numbers and strings."""
        op = node.op
        ta = self.check(node.left)
        right = node.right
        if (ta.ty == "string" and isinstance(right, Name)
                and right.name not in self.catalog.resources):
            tb: Node = Str(value=right.name, start=right.start, end=right.end, pos=right.pos,
                           ty="string")
        else:
            tb = self.check(right)
        ordering = op not in ("==", "!=")
        for t in (ta, tb):
            if t.ty == "string_set":
                self.fail(f"'{op}' cannot compare the string_set {self.text(t)}; use has, "
                          f"has_any, has_all or count({self.text(t)})", t.start)
            if ordering and t.ty == "boolean":
                self.fail(f"'{op}' needs numbers or strings, but {self.text(t)} is boolean",
                          t.start)
        if ta.ty != tb.ty:
            hint = " (quote it to make it a string)" if ta.ty == "string" else ""
            self.fail(f"cannot compare {ta.ty} {self.text(ta)} with {tb.ty} "
                      f"{self.text(tb)}{hint}", tb.start)
        return dataclasses.replace(node, left=ta, right=tb, ty="boolean")


def check(tree: Node, expression: str, catalog: Catalog) -> Node:
    """The typed tree of a parsed expression; raises ExpressionError if ill-kinded."""
    return Checker(expression, catalog).check_root(tree)
