"""Expiry: what of the state came due by `now` turns stale, overdue or silent.

The fold's `expire` and the expiry `apply` runs first both come here
(`expire_due`); it pops the deadline heap (`crr.projections.deadlines`) up to `now`
and settles each (host, reporter) an entry names.  Entries of overwritten
reports are skipped; the entry of a report refreshed in place since it was
pushed (`crr.projections.state.Batch.due`) goes back on the heap at its new time.
"""

from __future__ import annotations

import heapq

from crr.projections.changes import Acc
from crr.projections.deadlines import push
from crr.projections.state import Batch, ProjectionState, ReporterRecord


def expire_due(state: ProjectionState, now: float, acc: Acc) -> None:
    """Settle every deadline entry due by `now`, noting the records changed in `acc`."""
    heap = state.heap
    while heap and heap[0].due <= now:
        entry = heapq.heappop(heap)
        batch = entry.batch
        if batch is not None:
            if batch.dead:
                continue
            if batch.due > now:  # refreshed in place since the entry was pushed
                push(state, batch.due, entry.host, entry.reporter, batch)
                continue
            batch.due = 0.0  # settled: no entry of it is left
        _settle(state, entry.host, entry.reporter, acc, batch=batch, now=now)


def push_refreshed(state: ProjectionState) -> None:
    """Move the entries at the top of the heap whose batch was refreshed in place since
    (or died) to where they belong, so that the top is when expiry has work to do."""
    heap = state.heap
    while heap:
        top = heap[0]
        batch = top.batch
        if batch is None:
            return
        if batch.dead:
            heapq.heappop(heap)
        elif batch.due > top.due:
            heapq.heappop(heap)
            push(state, batch.due, top.host, top.reporter, batch)
        else:
            return


def _settle(state: ProjectionState, host: str | None, reporter: str, acc: Acc, *,
            batch: Batch | None, now: float) -> None:
    """Mark what of (host, reporter) is due at `now`, each stamped with its own deadline.

    Stamping with the deadline (never `now`) and taking the latest deadline
    for `as_of` makes the result independent of when, and how often,
    `expire` ran.
    """
    rec = state.hosts.get(host) if host is not None else state.cluster
    if rec is None:
        return
    rs = rec.reporters.get(reporter)
    latest: float | None = None
    if batch is not None and rs is not None:
        lifetimes = state.plan.lifetimes
        newer = rs.batches[rs.batches.index(batch) + 1:] if batch in rs.batches else []
        stale = batch.stale
        for name in batch.keyset:
            if (stale and name in stale) or any(name in b.keyset for b in newer):
                continue
            exp = batch.received_at + lifetimes[name]
            if exp <= now:
                if stale is None:
                    stale = batch.stale = {}
                stale[name] = exp
                if latest is None or exp > latest:
                    latest = exp
    inv = rec.inventory.get(reporter)
    if inv is not None and not inv.stale and inv.expires_at <= now:
        inv.stale = True
        if latest is None or inv.expires_at > latest:
            latest = inv.expires_at
    if rs is not None:
        due = _settle_overdue(state, rs, reporter, host, now)
        if due is not None and (latest is None or due > latest):
            latest = due
    if rs is not None and not rs.silent:
        silent_at = rs.silence_start() + state.plan.reporter_lifetime(reporter)
        if silent_at <= now:
            rs.silent = True
            # Under a lifecycle health state silence is invisible: not a change then.
            if rs.restate(silent_at) and (latest is None or silent_at > latest):
                latest = silent_at
    if latest is not None:
        rec.as_seq = state.seq
        rec.as_time = max(rec.as_time, latest)
        acc.touch(host)


def _settle_overdue(state: ProjectionState, rs: ReporterRecord, reporter: str,
                    host: str | None, now: float) -> float | None:
    """Mark declared resources never reported by `now` - first sight + lifetime as overdue;
    the latest such deadline (the change's time), None if nothing changed."""
    declared = state.plan.declared(reporter, "cluster" if host is None else "host")
    if not declared:
        return None
    batches = rs.batches
    if len(batches) == 1 and batches[0].keyset >= declared.keys():
        return None  # the steady state: everything reported
    held: set[str] = set()
    for b in batches:
        held.update(b.keyset)
    lifetimes = state.plan.lifetimes
    latest: float | None = None
    for n in declared:
        if n in held or (rs.overdue and n in rs.overdue):
            continue
        due = rs.first_seen + lifetimes[n]
        if due <= now:
            if rs.overdue is None:
                rs.overdue = set()
            rs.overdue.add(n)
            if latest is None or due > latest:
                latest = due
    return latest
