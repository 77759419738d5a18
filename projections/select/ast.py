"""Syntax tree of a `select[]` expression.

Every node keeps its span (`start`, `end`: offsets into the expression) so
errors and `explain` can quote it, and `pos`, the column an error about the
node itself points at (its operator, or its first token).  The parser leaves
`ty` unset and bare words as `Name`; `typecheck` resolves names to `Ref`
(or, on the right of a string comparison, to `Str`) and fills `ty`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from crr.schemas.catalog import Kind

CompareOp = Literal["==", "!=", "<", "<=", ">", ">="]
ArithOp = Literal["+", "-", "*", "/"]
LogicOp = Literal["and", "or"]
HasOp = Literal["has", "has_any", "has_all"]
FuncName = Literal["defined", "count"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """Common span and type of every node."""

    start: int
    end: int
    pos: int
    ty: Kind | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Num(Node):
    """A number literal."""

    value: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Str(Node):
    """A string literal (quoted, or a bare word on the right of a string comparison)."""

    value: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Bool(Node):
    """`true` or `false`."""

    value: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Name(Node):
    """A bare word, before name resolution."""

    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Ref(Node):
    """A resource of the catalog."""

    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Neg(Node):
    """Unary minus."""

    operand: Node


@dataclass(frozen=True, slots=True, kw_only=True)
class Arith(Node):
    """`+ - * /` on numbers."""

    op: ArithOp
    left: Node
    right: Node


@dataclass(frozen=True, slots=True, kw_only=True)
class Compare(Node):
    """`== != < <= > >=`."""

    op: CompareOp
    left: Node
    right: Node


@dataclass(frozen=True, slots=True, kw_only=True)
class Logic(Node):
    """`&&`/`and`, `||`/`or` (Kleene)."""

    op: LogicOp
    left: Node
    right: Node


@dataclass(frozen=True, slots=True, kw_only=True)
class Not(Node):
    """`!`/`not` (Kleene)."""

    operand: Node


@dataclass(frozen=True, slots=True, kw_only=True)
class Has(Node):
    """`s has "x"`, `s has_any [...]`, `s has_all [...]`."""

    op: HasOp
    subject: Node
    members: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Call(Node):
    """`defined(r)` or `count(s)`."""

    func: FuncName
    arg: Node


def children(node: Node) -> tuple[Node, ...]:
    """The direct sub-expressions of `node`."""
    match node:
        case Neg(operand=x) | Not(operand=x):
            return (x,)
        case Arith(left=a, right=b) | Compare(left=a, right=b) | Logic(left=a, right=b):
            return (a, b)
        case Has(subject=s):
            return (s,)
        case Call(arg=a):
            return (a,)
        case _:
            return ()


def refs(node: Node) -> list[Ref]:
    """Every resource reference in `node`, in source order."""
    if isinstance(node, Ref):
        return [node]
    out: list[Ref] = []
    for child in children(node):
        out.extend(refs(child))
    return out
