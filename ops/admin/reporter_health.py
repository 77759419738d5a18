"""Reporter health per host, from the snapshot: what `crr health` and `GET /v1/reporters` show.

One row per (reporter, host) — `host` null for cluster-scope reporters —
taken from the `reporters` map of each HostSnapshot and the ClusterSnapshot.
A reporter is *failing* when its state is one of `FAILING_STATES`: the
agent's findings (failed, timeout, bad_output, crashed, quarantined) and
the projector's (silent, rejecting) — or when it misses declared resources
(`missing`: not reported within their interval + grace, whatever its state
says).  Failing rows sort first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final, Literal

import msgspec

from crr.projector.deadletters import DeadLetterCount
from crr.schemas.snapshot import ClusterSnapshot, HostSnapshot, ReporterState, ReporterStatus

HealthRowState = ReporterState | Literal["deadlettered"]
"""A row's state: the snapshot's, or `deadlettered` for a reporter known only from
dead letters (every event it sent recently was refused, so it has no status)."""

FAILING_STATES: Final = frozenset({
    "failed", "timeout", "bad_output", "crashed", "quarantined", "silent", "rejecting",
    "deadlettered", "held",
})


class ReporterHealth(msgspec.Struct, frozen=True, kw_only=True):
    """A reporter on one host (or the cluster): its state, since when, and why."""

    reporter: str
    host: str | None
    """Null for a cluster-scope reporter."""
    state: HealthRowState
    failing: bool
    since: str | None = None
    detail: str | None = None
    """The last error (the agent's Health detail: exit status and stderr, backoff, …)."""
    exit_code: int | None = None
    rejected: int = 0
    """Values rejected in its latest report."""
    rejections: list[str] = msgspec.field(default_factory=list)
    last_report_at: str | None = None
    health: str | None = None
    """The last lifecycle state the agent published, whatever `state` says."""
    rejected_total: int = 0
    """Values rejected since its first event on that host (survives projector restarts)."""
    missing: list[str] = msgspec.field(default_factory=list)
    """Declared resources it has not reported within their interval + grace."""
    deadletters: int = 0
    """Its events dead-lettered recently (`crr health --deadletters-since`, default 1h)."""
    last_deadletter: str | None = None
    """Why the newest of those was dead-lettered."""


def is_failing(st: ReporterStatus) -> bool:
    """The one rule (module doc): a failing state, or declared resources missing."""
    return st.state in FAILING_STATES or bool(st.missing)


def _row(reporter: str, host: str | None, st: ReporterStatus) -> ReporterHealth:
    return ReporterHealth(
        reporter=reporter, host=host, state=st.state, failing=is_failing(st),
        since=st.since, detail=st.detail, exit_code=st.exit_code, rejected=st.rejected,
        rejections=list(st.rejections), last_report_at=st.last_report_at, health=st.health,
        rejected_total=st.rejected_total, missing=list(st.missing))


def reporter_rows(
    hosts: Iterable[HostSnapshot], cluster: ClusterSnapshot | None,
) -> list[ReporterHealth]:
    """Every (reporter, host) row: failing first, then by reporter and host (cluster first)."""
    rows = [_row(name, h.host, st) for h in hosts for name, st in h.reporters.items()]
    if cluster is not None:
        rows.extend(_row(name, None, st) for name, st in cluster.reporters.items())
    rows.sort(key=lambda r: (not r.failing, r.reporter, r.host is not None, r.host or ""))
    return rows


def with_deadletters(
    rows: list[ReporterHealth], letters: Mapping[tuple[str, str | None], DeadLetterCount],
) -> list[ReporterHealth]:
    """`rows` with each (reporter, host)'s recent dead letters; a pair known only from
    dead letters becomes a `deadlettered` (failing) row.  Same order as `reporter_rows`."""
    out = []
    for r in rows:
        c = letters.get((r.reporter, r.host))
        out.append(r if c is None else msgspec.structs.replace(
            r, deadletters=c.count, last_deadletter=c.last_reason))
    known = {(r.reporter, r.host) for r in rows}
    out.extend(ReporterHealth(reporter=rep, host=host, state="deadlettered", failing=True,
                              since=c.first_at, detail=c.last_reason, deadletters=c.count,
                              last_deadletter=c.last_reason)
               for (rep, host), c in letters.items() if (rep, host) not in known)
    out.sort(key=lambda r: (not r.failing, r.reporter, r.host is not None, r.host or ""))
    return out
