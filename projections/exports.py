"""What a scheduler bridge should show for a node: the planning core of `crr bridge …`.

`compile_exports` turns a catalog's `exports:` (crr.schemas.catalog.Exports) into
compiled `select[]` expressions; `plan_host` / `plan_in_table` evaluate them
for one node at `now` into a `NodeWant` — the features that hold, the drain
reason, the raw values, and when that answer can next change by time alone
(so a bridge re-evaluates at expiry instead of polling).

The semantics are `select[]`'s, by construction: a feature holds on a host iff
`crr select <expr>` selects it (the reference evaluator, `on_stale` included);
nothing here re-implements evaluation.  Pure: no IO, `now` is an argument.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from crr.projections.host_table import HostTable
from crr.projections.record.codes import Freshness, entry_expiry
from crr.projections.select import CompiledSelect, compile_select
from crr.projections.select.reference import Env, holds
from crr.schemas.catalog import Catalog, Kind
from crr.schemas.errors import CatalogError, ExpressionError
from crr.schemas.snapshot import ClusterSnapshot, HostSnapshot


@dataclass(frozen=True, slots=True)
class ValueOut:
    """One exported raw value on a node: `value` is None unless `state` is fresh."""

    name: str
    kind: Kind
    value: Any
    state: Freshness
    """`fresh`, `stale`, `unknown` (the reporter said null) or `never_reported`."""
    expires_at: float | None
    """When a fresh (or null) value turns stale (None: it will not change by time)."""


@dataclass(frozen=True)
class NodeWant:
    """What a target should show for one node, as crr sees it at one `now`."""

    features: frozenset[str]
    """crr-owned features that hold now."""
    drain: str | None
    """The reason of the first drain rule that holds, else None."""
    values: Mapping[str, ValueOut] = field(default_factory=dict)
    """The exported raw values, in `exports.values` order."""
    expires_at: float | None = None
    """The earliest moment this answer may change by time alone (None: never)."""

    def same_as(self, other: NodeWant | None) -> bool:
        """Whether a target showing `other` already shows this (times aside)."""
        if other is None:
            return False
        return (self.features == other.features and self.drain == other.drain
                and {k: (v.value, v.state) for k, v in self.values.items()}
                == {k: (v.value, v.state) for k, v in other.values.items()})


@dataclass(frozen=True, slots=True)
class DrainPlan:
    """One compiled drain rule."""

    when: CompiledSelect
    reason: str


@dataclass(frozen=True, slots=True)
class CompiledExports:
    """A catalog's exports, compiled against it; `plan_host` evaluates them."""

    catalog: Catalog
    features: Mapping[str, CompiledSelect]
    drain: tuple[DrainPlan, ...]
    values: tuple[str, ...]

    @property
    def resources(self) -> frozenset[str]:
        """Every resource an export reads (their expiry bounds `NodeWant.expires_at`)."""
        out: set[str] = set(self.values)
        for c in self.features.values():
            out |= c.resources
        for d in self.drain:
            out |= d.when.resources
        return frozenset(out)


def _where(path: str, exc: ExpressionError) -> str:
    """One catalog problem line for a bad export expression, pointing at the token."""
    expr = exc.expression
    col = min(max(exc.column, 0), len(expr))
    return (f"{path}: {exc.message} (at column {col + 1}: "
            f"{expr[:col]}\u2192{expr[col:]!s})")


def export_problems(catalog: Catalog) -> list[str]:
    """Every problem of `catalog`'s export expressions, path-qualified (`ExportsCheck`)."""
    try:
        compile_exports(catalog)
    except CatalogError as exc:
        return exc.problems
    return []


def compile_exports(catalog: Catalog) -> CompiledExports:
    """Compile every export expression; CatalogError lists all the bad ones at once."""
    exports = catalog.exports_or_empty()
    problems: list[str] = []
    features: dict[str, CompiledSelect] = {}
    for name, expr in exports.features.items():
        try:
            features[name] = _condition(expr, catalog)
        except ExpressionError as exc:
            problems.append(_where(f"exports.features.{name}", exc))
    drain: list[DrainPlan] = []
    for i, rule in enumerate(exports.drain):
        try:
            drain.append(DrainPlan(_condition(rule.when, catalog), rule.reason))
        except ExpressionError as exc:
            problems.append(_where(f"exports.drain[{i}].when", exc))
    for i, name in enumerate(exports.values):
        if name not in catalog.resources:
            problems.append(f"exports.values[{i}]: no resource named {name!r}")
    if problems:
        raise CatalogError(problems)
    return CompiledExports(catalog=catalog, features=features, drain=tuple(drain),
                           values=tuple(exports.values))


def _condition(expr: str, catalog: Catalog) -> CompiledSelect:
    """A bare `select[]` condition: an export is a tag, not a whole LSF requirement."""
    compiled = compile_select(expr, catalog)
    if compiled.ignored_sections or not compiled.has_select:
        raise ExpressionError("an export is a select[] condition, not a whole requirement "
                              "string (rusage[]/order[]/… are the scheduler's)",
                              expression=expr, column=0)
    return compiled


def plan_in_table(exports: CompiledExports, table: HostTable, host: str,
                  now: float) -> NodeWant:
    """The want of `host` in `table` (a whole-cluster view) at `now`.

    A host not in the table has no features, no drain and unknown values.
    """
    if table.row_of(host) is None:
        return NodeWant(features=frozenset(), drain=None,
                        values={n: ValueOut(n, exports.catalog.resources[n].kind, None,
                                            "never_reported", None)
                                for n in exports.values})
    env = Env(table, host, now)
    features = frozenset(n for n, c in exports.features.items() if holds(c.tree, env))
    drain = next((d.reason for d in exports.drain if holds(d.when.tree, env)), None)
    values: dict[str, ValueOut] = {}
    for name in exports.values:
        found = env.lookup(name, exports.catalog.resources[name].kind)
        values[name] = ValueOut(name, found.kind, found.value, found.freshness,
                                _future(found.entry, now))
    return NodeWant(features=features, drain=drain, values=values,
                    expires_at=_next_change(exports, env, now))


def _future(entry: Any, now: float) -> float | None:
    if entry is None:
        return None
    expires = entry_expiry(entry)
    return expires if now < expires < math.inf and entry.state != "stale" else None


def _next_change(exports: CompiledExports, env: Env, now: float) -> float | None:
    """The earliest expiry after `now` of a value any export reads."""
    soonest: float | None = None
    for name in sorted(exports.resources):
        spec = exports.catalog.resources.get(name)
        if spec is None:
            continue
        at = _future(env.lookup(name, spec.kind).entry, now)
        if at is not None and (soonest is None or at < soonest):
            soonest = at
    return soonest


def single_host_table(catalog: Catalog, host: HostSnapshot | None,
                      cluster: ClusterSnapshot | None) -> HostTable:
    """A table of one host's record and the cluster record (a per-host door's view)."""
    table = HostTable(catalog)
    if host is not None:
        table.load([host])
    if cluster is not None:
        table.set_cluster(cluster)
    return table


def plan_host(exports: CompiledExports, host: HostSnapshot | None,
              cluster: ClusterSnapshot | None, now: float, *, name: str | None = None,
              ) -> NodeWant:
    """The want of one host from its own record (+ the cluster record) at `now`.

    `host` None (never reported, or forgotten): no features, no drain.  `name`
    is the host's name when `host` is None (only for symmetry; unused by the plan).
    """
    del name
    table = single_host_table(exports.catalog, host, cluster)
    if host is None:
        return plan_in_table(exports, table, "", now)
    return plan_in_table(exports, table, host.host, now)


def plan_table(exports: CompiledExports, table: HostTable, now: float) -> dict[str, NodeWant]:
    """The want of every host in `table` at `now` (whole-cluster doors)."""
    return {h: plan_in_table(exports, table, h, now) for h in table.hosts()}


def earliest(wants: Mapping[str, NodeWant]) -> float | None:
    """The earliest `expires_at` of `wants` (None: none will change by time)."""
    times = [w.expires_at for w in wants.values() if w.expires_at is not None]
    return min(times) if times else None
