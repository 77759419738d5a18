"""The numpy evaluator of typed `select[]` trees over a `HostTable`'s columns.

Every sub-expression is evaluated once for all rows.  A condition is a pair
of masks `(t, f)`: rows where it is TRUE and rows where it is FALSE; rows in
neither are *unknown* (Kleene: `and` is `(t1 & t2, f1 | f2)`, `or` is
`(t1 | t2, f1 & f2)`, `not` swaps).  Only the masks an ancestor needs are
computed (the root needs only `t`).  A number is `(values, known)`, a
string is pool codes (or one literal) with `known`, a string set is its
column.  Literals and cluster-scope values stay Python scalars and
broadcast; mask operations with a scalar operand are skipped.  Strings
compare by pool code for `==`/`!=`; ordering evaluates the operator once
per pooled string and gathers by code.  When no value has expired at `now`
the table hands out its maintained fresh/stale masks, so a typical
evaluation is a handful of vector operations.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from crr.projections.host_table import BoolArray, ClusterValue, Column, HostTable
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
from crr.schemas.catalog import Kind

Mask = BoolArray | bool
"""A per-row bool array, or one bool for every row."""

_OPS: Final[dict[str, Callable[[Any, Any], Any]]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt,
    "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
}


def _bool(m: Any) -> Mask:
    """Python bool for scalars (numpy scalar bools included), arrays unchanged."""
    return m if isinstance(m, np.ndarray) else bool(m)


def _neg(m: Mask) -> Mask:
    return (not m) if isinstance(m, bool) else ~m


def _and(a: Mask, b: Mask) -> Mask:
    if isinstance(a, bool):
        return b if a else False
    if isinstance(b, bool):
        return a if b else False
    return a & b


def _or(a: Mask, b: Mask) -> Mask:
    if isinstance(a, bool):
        return True if a else b
    if isinstance(b, bool):
        return True if b else a
    return a | b


@dataclass(slots=True)
class _Tri:
    t: Mask | None
    f: Mask | None


@dataclass(slots=True)
class _Num:
    v: npt.NDArray[np.float64] | float
    k: Mask
    finite: bool
    """False if the values may hold ±inf (after arithmetic that may overflow)."""


@dataclass(slots=True)
class _Str:
    codes: npt.NDArray[np.int32] | None
    lit: str | None
    k: Mask


@dataclass(slots=True)
class _Set:
    column: Column | None
    scalar: frozenset[str] | None
    k: Mask


class Evaluator:
    """Evaluates trees over one table at one `now`, caching each resource's known mask."""

    def __init__(self, table: HostTable, now: float) -> None:
        self.table = table
        self.now = now
        self._known: dict[str, Mask] = {}

    def _source(self, name: str, kind: Kind) -> Column | ClusterValue | None:
        spec = self.table.spec_for(name, kind)
        if spec is None:
            return None
        if spec.scope == "cluster":
            return self.table.cluster_value(name)
        return self.table.column(name)

    def known(self, name: str, kind: Kind) -> Mask:
        """Rows where `name` is fresh."""
        hit = self._known.get(name)
        if hit is None:
            src = self._source(name, kind)
            hit = False if src is None else src.known(self.now)
            self._known[name] = hit
        return hit

    def excluded(self, tree: Node) -> Mask:
        """Rows with a stale value of an `on_stale: exclude` resource named in `tree`."""
        out: Mask = False
        seen: set[str] = set()
        for ref in refs(tree):
            if ref.name in seen:
                continue
            seen.add(ref.name)
            assert ref.ty is not None
            spec = self.table.spec_for(ref.name, ref.ty)
            if spec is None or spec.on_stale != "exclude":
                continue
            src = self._source(ref.name, ref.ty)
            if src is not None:
                out = _or(out, src.stale(self.now))
        return out

    def truth(self, tree: Node) -> Mask:
        """Rows where `tree` is TRUE and no resource excludes the host (maybe a scalar)."""
        t = self.cond(tree, need_t=True, need_f=False).t
        assert t is not None
        return _and(t, _neg(self.excluded(tree)))

    # -- conditions -----------------------------------------------------------------------

    def cond(self, node: Node, *, need_t: bool, need_f: bool) -> _Tri:
        """The TRUE and FALSE masks of a condition (only those asked for)."""
        match node:
            case Bool(value=b):
                return _Tri(b, not b)
            case Ref(name=name, ty=kind):
                assert kind is not None
                return self.bool_ref(name, kind)
            case Logic(op=op, left=a, right=b):
                x = self.cond(a, need_t=need_t, need_f=need_f)
                y = self.cond(b, need_t=need_t, need_f=need_f)
                if op == "and":
                    return _Tri(_and(x.t, y.t) if need_t else None,  # type: ignore[arg-type]
                                _or(x.f, y.f) if need_f else None)  # type: ignore[arg-type]
                return _Tri(_or(x.t, y.t) if need_t else None,  # type: ignore[arg-type]
                            _and(x.f, y.f) if need_f else None)  # type: ignore[arg-type]
            case Not(operand=operand):
                inner = self.cond(operand, need_t=need_f, need_f=need_t)
                return _Tri(inner.f, inner.t)
            case Compare(op=op, left=a, right=b):
                k, r = self.compare(op, a, b)
                return self.split(k, r, need_t=need_t, need_f=need_f)
            case Has(op=op, subject=s, members=members):
                sv = self.value(s)
                assert isinstance(sv, _Set)
                return self.split(sv.k, self.has(op, sv, members), need_t=need_t, need_f=need_f)
            case Call(func="defined", arg=arg):
                assert isinstance(arg, Ref)
                assert arg.ty is not None
                k = self.known(arg.name, arg.ty)
                return _Tri(k, _neg(k) if need_f else None)
            case _:
                raise AssertionError(f"not a condition: {node!r}")

    @staticmethod
    def split(k: Mask, r: Mask, *, need_t: bool, need_f: bool) -> _Tri:
        """TRUE/FALSE masks from known rows `k` and a result `r` valid where known."""
        return _Tri(_and(k, r) if need_t else None, _and(k, _neg(r)) if need_f else None)

    def bool_ref(self, name: str, kind: Kind) -> _Tri:
        """A boolean resource as a condition (`r` means `r == true`)."""
        src = self._source(name, kind)
        if isinstance(src, Column):
            k = self.known(name, kind)
            if k is src.fresh:  # nothing expired: the maintained masks are exact
                return _Tri(src.t_arr, src.f_arr)
            return _Tri(_and(k, src.t_arr), _and(k, src.f_arr))
        if isinstance(src, ClusterValue) and src.known(self.now):
            return _Tri(src.value is True, src.value is False)
        return _Tri(False, False)

    # -- values ---------------------------------------------------------------------------

    def value(self, node: Node) -> _Num | _Str | _Set:
        """A number, string or string set on every row."""
        match node:
            case Num(value=num):
                return _Num(num, True, True)
            case Str(value=s):
                return _Str(None, s, True)
            case Ref():
                return self.ref(node)
            case Neg(operand=operand):
                n = self.value(operand)
                assert isinstance(n, _Num)
                return _Num(-n.v, n.k, n.finite)
            case Arith(op=op, left=a, right=b):
                na, nb = self.value(a), self.value(b)
                assert isinstance(na, _Num)
                assert isinstance(nb, _Num)
                return self.arith(op, na, nb)
            case Call(func="count", arg=arg):
                sv = self.value(arg)
                assert isinstance(sv, _Set)
                if sv.column is not None:
                    return _Num(sv.column.values, sv.k, True)
                return _Num(float(len(sv.scalar or ())), sv.k, True)
            case _:
                raise AssertionError(f"not a value: {node!r}")

    def ref(self, node: Ref) -> _Num | _Str | _Set:
        """A non-boolean resource's values and known mask."""
        kind = node.ty
        assert kind is not None
        src = self._source(node.name, kind)
        k = self.known(node.name, kind)
        if isinstance(src, Column):
            if kind == "numeric":
                return _Num(src.values, k, True)
            if kind == "string":
                return _Str(src.values, None, k)
            return _Set(src, None, k)
        value = src.value if isinstance(src, ClusterValue) and k else None
        if kind == "numeric":
            return _Num(value if value is not None else 0.0, k, True)
        if kind == "string":
            return _Str(None, value if value is not None else "", k)
        return _Set(None, value if value is not None else frozenset(), k)

    def arith(self, op: str, x: _Num, y: _Num) -> _Num:
        """`x op y`; division by zero and NaN results (inf - inf, inf * 0) are unknown."""
        k = _and(x.k, y.k)
        divisor = y.v
        if op == "/":
            nonzero = _bool(y.v != 0)
            k = _and(k, nonzero)
            if isinstance(nonzero, bool):
                if not nonzero:
                    return _Num(0.0, False, True)
            elif not y.finite or not x.finite:
                divisor = np.where(nonzero, y.v, 1.0)
        with np.errstate(all="ignore"):
            r = _OPS[op](x.v, divisor)
        if isinstance(r, np.ndarray):
            if not (x.finite and y.finite):
                k = _and(k, ~np.isnan(r))
            return _Num(r, k, False)
        r = float(r)
        return _Num(r, _and(k, r == r), False)  # noqa: PLR0124  (r == r is false for NaN)

    def compare(self, op: str, a: Node, b: Node) -> tuple[Mask, Mask]:
        """(known, result-where-known) of `a op b` on numbers, strings or booleans."""
        if a.ty == "boolean":
            # == and != only (typecheck).  t and f are only set where known.
            x = self.cond(a, need_t=True, need_f=True)
            y = self.cond(b, need_t=True, need_f=True)
            assert x.t is not None
            assert x.f is not None
            assert y.t is not None
            assert y.f is not None
            k = _and(_or(x.t, x.f), _or(y.t, y.f))
            eq = _or(_and(x.t, y.t), _and(x.f, y.f))
            return k, eq if op == "==" else _neg(eq)
        va, vb = self.value(a), self.value(b)
        if isinstance(va, _Num) and isinstance(vb, _Num):
            return _and(va.k, vb.k), _bool(_OPS[op](va.v, vb.v))
        assert isinstance(va, _Str)
        assert isinstance(vb, _Str)
        return _and(va.k, vb.k), self.compare_strings(op, va, vb)

    def compare_strings(self, op: str, x: _Str, y: _Str) -> Mask:
        """`x op y` on strings, valid where both are known."""
        fn = _OPS[op]
        if x.codes is None and y.codes is None:
            return bool(fn(x.lit, y.lit))
        if op in ("==", "!="):
            cx: Any = x.codes if x.codes is not None else self.table.code_of(x.lit or "")
            cy: Any = y.codes if y.codes is not None else self.table.code_of(y.lit or "")
            return _bool(fn(cx, cy))
        strings = self.table.strings()
        if not strings:
            return False  # no stored string: every row is unknown anyway
        if x.codes is not None and y.codes is not None:
            ranks = self.table.ranks()
            return _bool(fn(ranks[x.codes], ranks[y.codes]))
        if x.codes is not None:
            lit, codes = y.lit, x.codes
            per = np.fromiter((fn(s, lit) for s in strings), dtype=np.bool_, count=len(strings))
        else:
            assert y.codes is not None
            lit, codes = x.lit, y.codes
            per = np.fromiter((fn(lit, s) for s in strings), dtype=np.bool_, count=len(strings))
        return per[codes]

    @staticmethod
    def has(op: str, s: _Set, members: tuple[str, ...]) -> Mask:
        """`has`, `has_any`, `has_all`, valid where the set is known."""
        if s.column is None:
            items = s.scalar or frozenset()
            if op == "has_any":
                return any(m in items for m in members)
            return all(m in items for m in members)
        if not members:
            return op != "has_any"
        r: Mask = s.column.member(members[0])
        for m in members[1:]:
            c = s.column.member(m)
            r = _or(r, c) if op == "has_any" else _and(r, c)
        return r


def truth(tree: Node, table: HostTable, now: float) -> BoolArray:
    """Per-row (capacity-long) mask of rows selected by the typed `tree`.

    The result may be one of the table's own arrays: do not modify it.
    """
    t = Evaluator(table, now).truth(tree)
    if isinstance(t, bool):
        return np.full(table.capacity, t, dtype=np.bool_)
    return t


def select(tree: Node, table: HostTable, now: float) -> list[str]:
    """Sorted names of the hosts selected by the typed `tree` at `now`."""
    mask = truth(tree, table, now)
    rows = table.sorted_rows()
    return table.sorted_names()[mask[rows]].tolist()  # type: ignore[no-any-return]
