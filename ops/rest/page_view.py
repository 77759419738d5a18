"""`GET /v1/page`: everything one paint of the status page shows, judged at one moment.

The header, the summary cards, the host table, the cluster values and the reporter
failures come from this one answer, so they cannot disagree (issue 40: "connecting…"
beside "projector live", "Reporter failures: none" beside "1 failing", a row's
"1 ok" beside a failures table listing that reporter).  Every surface uses the same
rules: a reporter is failing by `crr.admin.reporter_health.is_failing` (the rows
`crr health` lists), a host's STATUS by `crr.admin.host_status` (as `crr hosts` shows it:
there a reporter counts as failing by its state alone, so a `stopped` reporter whose
values went stale makes a host `stale`, while `crr health` lists the reporter).

Beside each row on the page, what the scheduler bridges apply to that host: the
features of the catalog's `exports:` that hold and the drain rule that holds, if any
(`crr.projections.exports`, the bridges' own planning core).  And the page's defaults
from the active catalog: an example expression for the select box and the explain
view, and each numeric resource's display precision (`precision:`, default 1).
"""

from __future__ import annotations

from typing import Final

import msgspec

from crr.admin.reporter_health import (
    FAILING_STATES,
    ReporterHealth,
    is_failing,
    reporter_rows,
)
from crr.projections.exports import CompiledExports, compile_exports, plan_in_table
from crr.projections.freshness import Judgement, cluster_at
from crr.projections.host_table import HostTable
from crr.projections.select import compile_select
from crr.rest.host_query import HostFacts, HostPage, Summary
from crr.schemas.catalog import Catalog
from crr.schemas.errors import CatalogError, ExpressionError
from crr.schemas.snapshot import ClusterSnapshot, HostSnapshot, ProjectorStatus

DEFAULT_PRECISION: Final = 1
"""Decimals shown of a numeric resource whose catalog entry sets no `precision`."""
MAX_FAILURES: Final = 500
"""Failing (reporter, host) rows sent at most (`failures_total` counts them all)."""


class ReporterMark(msgspec.Struct, frozen=True, kw_only=True):
    """One reporter of a host as the page's reporters column shows it."""

    reporter: str
    state: str
    failing: bool
    """By the rule `crr health` uses (a failing state, or declared resources missing)."""
    missing: list[str] = msgspec.field(default_factory=list)


class BridgeApply(msgspec.Struct, frozen=True, kw_only=True):
    """What the scheduler bridges apply to a host now (the catalog's `exports:`)."""

    features: list[str]
    """The exported features that hold, sorted."""
    drain: str | None = None
    """The reason of the first drain rule that holds, else null."""


class HostMarks(msgspec.Struct, frozen=True, kw_only=True):
    """The page's judgements of one row's host."""

    reporters: list[ReporterMark]
    """Failing first, then by name."""
    bridges: BridgeApply | None = None
    """Null when the catalog has no (valid) `exports:`."""


class Display(msgspec.Struct, frozen=True, kw_only=True):
    """The page's defaults, from the active catalog."""

    example: str | None
    """A valid `select[]` expression over the catalog's own resources (null: none fits)."""
    precision: dict[str, int]
    """Decimals shown per numeric resource; a smaller change is not a change."""
    exports: bool
    """Whether the catalog has `exports:` (else no bridge applies anything)."""
    exports_error: str | None = None
    failing_states: list[str] = msgspec.field(
        default_factory=lambda: sorted(FAILING_STATES))
    """Reporter states that are failing (a reporter with `missing` resources is too)."""


class PageView(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /v1/page`: one paint of the status page, every part judged at `at`."""

    at: float
    summary: Summary
    table: HostPage
    marks: dict[str, HostMarks]
    """Per host of `table.rows`."""
    failures: list[ReporterHealth]
    """The failing (reporter, host) rows, failing by `ReporterMark.failing`'s rule."""
    failures_total: int
    cluster: ClusterSnapshot | None
    display: Display
    projectors: list[ProjectorStatus] = msgspec.field(default_factory=list)
    """The status records of the current layout's projectors (one per partition)."""
    judgement: Judgement | None = None
    """`at` is its `judged_at` (the projector's watermark, at most `outage_hold` back);
    whether the view is holding (the page's banner)."""


def example_expression(catalog: Catalog | None) -> str | None:
    """A short expression over the catalog's own host-scope resources that compiles: its
    first numeric one, `&&` its first other one."""
    if catalog is None:
        return None
    host = [(n, s.kind) for n, s in sorted(catalog.resources.items()) if s.scope == "host"]
    number = next((f"{n} > 0" for n, k in host if k == "numeric"), None)
    other = next(({"boolean": n, "string": f"defined({n})",
                   "string_set": f"count({n}) > 0"}[k] for n, k in host if k != "numeric"),
                 None)
    expr = " && ".join(t for t in (number, other) if t is not None)
    if not expr:
        return None
    try:
        compile_select(expr, catalog)
    except ExpressionError:
        return None
    return expr


def precisions(catalog: Catalog | None) -> dict[str, int]:
    """Decimals shown per numeric resource (`precision:` or `DEFAULT_PRECISION`)."""
    if catalog is None:
        return {}
    return {n: s.precision if isinstance(s.precision, int) else DEFAULT_PRECISION
            for n, s in sorted(catalog.resources.items()) if s.kind == "numeric"}


class PageJudge:
    """Builds the page's parts; caches the compiled exports per catalog."""

    def __init__(self) -> None:
        self._exports: tuple[Catalog, CompiledExports | None, str | None] | None = None

    def exports(self, catalog: Catalog | None) -> tuple[CompiledExports | None, str | None]:
        """The catalog's compiled exports (None without any), and why not if they fail."""
        if catalog is None:
            return None, None
        cached = self._exports
        if cached is None or cached[0] is not catalog:
            compiled: CompiledExports | None = None
            error: str | None = None
            declared = catalog.exports_or_empty()
            if declared.features or declared.drain or declared.values:
                try:
                    compiled = compile_exports(catalog)
                except CatalogError as exc:
                    error = "; ".join(exc.problems)
            cached = self._exports = (catalog, compiled, error)
        return cached[1], cached[2]

    def marks(self, table: HostTable, page: HostPage, catalog: Catalog | None,
              now: float) -> dict[str, HostMarks]:
        """The reporters and bridge marks of each row of `page`."""
        exports, _ = self.exports(catalog)
        out = {}
        for row in page.rows:
            reps = sorted(
                (ReporterMark(reporter=n, state=st.state, failing=is_failing(st),
                              missing=list(st.missing))
                 for n, st in row.snapshot.reporters.items()),
                key=lambda m: (not m.failing, m.reporter))
            bridges = None
            if exports is not None:
                want = plan_in_table(exports, table, row.host, now)
                bridges = BridgeApply(features=sorted(want.features), drain=want.drain)
            out[row.host] = HostMarks(reporters=reps, bridges=bridges)
        return out

    def display(self, catalog: Catalog | None) -> Display:
        """The page's defaults from `catalog`."""
        exports, error = self.exports(catalog)
        return Display(example=example_expression(catalog), precision=precisions(catalog),
                       exports=exports is not None, exports_error=error)


def failures(table: HostTable, facts: HostFacts, cluster: ClusterSnapshot | None,
             now: float) -> tuple[list[ReporterHealth], int]:
    """(the first `MAX_FAILURES` failing rows, how many there are): only the records whose
    facts count a failing reporter are decoded."""
    snaps: list[HostSnapshot] = []
    for host in table.hosts():
        f = facts.of(table, host, now)
        if f is not None and f.failing:
            snap = table.get(host)
            if snap is not None:
                snaps.append(snap)
    rows = [r for r in reporter_rows(snaps, cluster) if r.failing]
    return rows[:MAX_FAILURES], len(rows)


def cluster_now(cluster: ClusterSnapshot | None, now: float) -> ClusterSnapshot | None:
    """The cluster record as it is at `now`."""
    return cluster_at(cluster, now) if cluster is not None else None
