"""The fold's deadline heap: when each value, inventory and reporter of a record comes due.

`expire` (`crr.projections.expiry`) pops the entries that came due.  Every entry goes
on the heap through `push`: as events arrive (`crr.projections.reports.store`,
`new_reporter` for a reporter's declared resources never reported), when expiry
finds an entry whose batch was refreshed since, and from the records when a
catalog change moves deadlines (`rebuild_heap`) or a restore puts a record in
place (`push_record`).
"""

from __future__ import annotations

import heapq
from typing import Any

from crr.projections.state import Batch, Deadline, ProjectionState, Record, ReporterRecord


def reporter_of(state: ProjectionState, rec: Record, reporter: str, host: str | None,
                t: float) -> ReporterRecord:
    """`reporter`'s row in `rec`, made (first seen at `t`) if it has none."""
    rs = rec.reporters.get(reporter)
    if rs is None:
        rs = rec.reporters[reporter] = new_reporter(state, reporter, host, t)
    return rs


def new_reporter(state: ProjectionState, reporter: str, host: str | None,
                 t: float, held: Any = ()) -> ReporterRecord:
    """A reporter first seen at `t`; its declared resources are due by `t` + their lifetime
    (`missing` names those still never reported then; `held`: those its first report sets)."""
    rs = ReporterRecord(first_seen=t)
    for d in overdue_deadlines(state, rs, reporter, host, held):
        push(state, d, host, reporter, None)
    return rs


def overdue_deadlines(state: ProjectionState, rs: ReporterRecord, reporter: str,
                      host: str | None, also: Any = ()) -> list[float]:
    """When declared resources not yet reported (nor overdue, nor in `also`) become
    overdue, sorted."""
    declared = state.plan.declared(reporter, "cluster" if host is None else "host")
    if not declared:
        return []
    held: set[str] = set(also)
    for b in rs.batches:
        held.update(b.keyset)
    overdue = rs.overdue or ()
    lifetimes = state.plan.lifetimes
    return sorted({rs.first_seen + lifetimes[n] for n in declared
                   if n not in held and n not in overdue})


def push(state: ProjectionState, deadline: float, host: str | None, reporter: str,
         batch: Batch | None) -> None:
    """Put one deadline on the heap (`batch`: the report whose values then go stale)."""
    state.counter += 1
    heapq.heappush(state.heap, Deadline(deadline, state.counter, host, reporter, batch))


def rebuild_heap(state: ProjectionState) -> None:
    """Recreate the deadline heap from the records (after a catalog change moved deadlines)."""
    state.heap = []
    records: list[tuple[str | None, Record]] = [(h, r) for h, r in sorted(state.hosts.items())]
    records.append((None, state.cluster))
    for host, rec in records:
        push_record(state, host, rec)


def push_record(state: ProjectionState, host: str | None, rec: Record) -> None:
    """Push everything of one record still to come due (each batch's `due` set to match)."""
    plan = state.plan
    lifetimes = plan.lifetimes
    scope = "cluster" if host is None else "host"
    reporters = rec.reporters
    names = sorted(reporters) if not rec.inventory else sorted(set(rec.inventory) | set(reporters))
    for reporter in names:
        rs = rec.reporters.get(reporter)
        rp = plan.reporters.get((reporter, scope))
        uniform = rp.uniform_life if rp is not None else None
        for batch in rs.batches if rs is not None else []:
            stale = batch.stale or {}
            if uniform is not None and batch.keyset and not stale:
                batch.due = batch.received_at + uniform  # (its one entry)
                due = {batch.due}
            else:
                batch.due = 0.0
                due = {batch.received_at + lifetimes[n] for n in batch.keyset
                       if n not in stale}
            for d in sorted(due):
                push(state, d, host, reporter, batch)
        inv = rec.inventory.get(reporter)
        other: set[float] = set()
        if inv is not None and not inv.stale:
            other.add(inv.expires_at)
        if rs is not None and not rs.silent:
            other.add(rs.silence_start() + plan.reporter_lifetime(reporter))
        if rs is not None:
            other.update(overdue_deadlines(state, rs, reporter, host))
        for d in sorted(other):
            push(state, d, host, reporter, None)

