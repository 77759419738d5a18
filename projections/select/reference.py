"""A straightforward row-wise interpreter of typed `select[]` trees: the semantic oracle.

It reads one host's stored `HostSnapshot` (and the `ClusterSnapshot`)
directly, not the table's columns, and evaluates with Python values where
`None` is *unknown* (Kleene logic).  The columnar evaluator must agree with
it on every expression and host (tested with hypothesis); `matches` and
`explain` use it, since one host needs no columns.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from crr.projections.freshness import freshness_at
from crr.projections.host_table import HostTable
from crr.projections.record.codes import Freshness, entry_code
from crr.projections.select.ast import (
    Arith,
    Bool,
    Call,
    Compare,
    Has,
    Logic,
    Neg,
    Node,
    Not,
    Num,
    Ref,
    Str,
    refs,
)
from crr.schemas.catalog import Kind, OnStale, Scope
from crr.schemas.snapshot import ClusterSnapshot, HostSnapshot, ValueEntry

_COMPARE: Final[dict[str, Callable[[Any, Any], bool]]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt,
    "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}


@dataclass(frozen=True, slots=True)
class Lookup:
    """A resource's value on one host at `now`, and how fresh it is."""

    name: str
    kind: Kind
    scope: Scope
    on_stale: OnStale
    freshness: Freshness
    value: Any
    """The value `select[]` uses: None unless fresh."""
    entry: ValueEntry | None
    """The snapshot entry it came from (None: never reported)."""


class Env:
    """One host's values at one `now`, looked up from the stored snapshots."""

    def __init__(self, table: HostTable, host: str, now: float) -> None:
        self.table = table
        self.snapshot: HostSnapshot | None = table.get(host)
        self.cluster: ClusterSnapshot | None = table.cluster()
        self.now = now
        self._cache: dict[str, Lookup] = {}

    def lookup(self, name: str, kind: Kind) -> Lookup:
        """The value of resource `name` (compiled as `kind`) on this host."""
        hit = self._cache.get(name)
        if hit is not None:
            return hit
        spec = self.table.spec_for(name, kind)
        entry: ValueEntry | None = None
        scope: Scope = "host"
        on_stale: OnStale = "unknown"
        if spec is not None:
            scope, on_stale = spec.scope, spec.on_stale
            holder = self.cluster if scope == "cluster" else self.snapshot
            entry = holder.values.get(name) if holder is not None else None
        code, expires, value = entry_code(kind, entry)
        fresh = freshness_at(code, expires, self.now)
        found = Lookup(name, kind, scope, on_stale, fresh,
                       value if fresh == "fresh" else None, entry)
        self._cache[name] = found
        return found


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    if a is True and b is True:
        return True
    return None


def _or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    if a is False and b is False:
        return False
    return None


def evaluate(node: Node, env: Env, trace: dict[int, Any] | None = None) -> Any:
    """The value of `node` on `env`'s host: None is unknown.

    With `trace`, records every node's value under `id(node)` (for explain).
    """
    value = _evaluate(node, env, trace)
    if trace is not None:
        trace[id(node)] = value
    return value


def _evaluate(node: Node, env: Env, trace: dict[int, Any] | None) -> Any:
    match node:
        case Num(value=v) | Str(value=v) | Bool(value=v):
            return v
        case Ref(name=name, ty=kind):
            assert kind is not None
            return env.lookup(name, kind).value
        case Neg(operand=x):
            v = evaluate(x, env, trace)
            return None if v is None else -v
        case Arith(op=op, left=a, right=b):
            x, y = evaluate(a, env, trace), evaluate(b, env, trace)
            if x is None or y is None:
                return None
            if op == "+":
                r = x + y
            elif op == "-":
                r = x - y
            elif op == "*":
                r = x * y
            elif y == 0:
                return None  # division by zero is unknown
            else:
                r = x / y
            return None if math.isnan(r) else r
        case Compare(op=op, left=a, right=b):
            x, y = evaluate(a, env, trace), evaluate(b, env, trace)
            if x is None or y is None:
                return None
            return _COMPARE[op](x, y)
        case Logic(op=op, left=a, right=b):
            x, y = evaluate(a, env, trace), evaluate(b, env, trace)
            return _and(x, y) if op == "and" else _or(x, y)
        case Not(operand=x):
            v = evaluate(x, env, trace)
            return None if v is None else not v
        case Has(op=op, subject=s, members=members):
            items = evaluate(s, env, trace)
            if items is None:
                return None
            if op == "has_any":
                return any(m in items for m in members)
            return all(m in items for m in members)
        case Call(func=func, arg=arg):
            assert isinstance(arg, Ref)
            assert arg.ty is not None
            found = env.lookup(arg.name, arg.ty)
            if trace is not None:
                trace[id(arg)] = found.value
            if func == "defined":
                return found.freshness == "fresh"
            return None if found.value is None else float(len(found.value))
        case _:
            raise AssertionError(f"unexpected node {node!r}")


def excluded_by(tree: Node, env: Env) -> list[str]:
    """Resources named in `tree` that are stale with `on_stale: exclude`, sorted."""
    out = set()
    for ref in refs(tree):
        assert ref.ty is not None
        found = env.lookup(ref.name, ref.ty)
        if found.on_stale == "exclude" and found.freshness == "stale":
            out.add(ref.name)
    return sorted(out)


def holds(tree: Node, env: Env) -> bool:
    """Whether `env`'s host is selected by `tree`: not excluded and the tree is TRUE."""
    if excluded_by(tree, env):
        return False
    return evaluate(tree, env) is True


def matches(tree: Node, table: HostTable, host: str, now: float) -> bool:
    """Whether `host` is selected: in the table, not excluded, and the tree is TRUE."""
    if table.row_of(host) is None:
        return False
    return holds(tree, Env(table, host, now))
