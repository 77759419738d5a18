"""Applying a report: the typed fast path, and value by value (DESIGN §5).

A report from a reporter the catalog knows is first decoded by that
reporter's typed decoder (`projections.plan.ReporterPlan.decoder`); if every
value it owns is there and valid, the decode *was* the validation and the
report is stored as decoded (`fast_report`, the hot path).  Otherwise the
report, decoded generically, is checked value by value (`apply_report`:
rejected values are counted on the reporter with their reasons, the rest is
stored).  Either way the accepted values land as a `Batch` (`_store`) and
their deadlines go on the heap.
"""

from __future__ import annotations

import heapq
from typing import Any, Final

import msgspec
from msgspec.structs import astuple

from projections.changes import Acc
from projections.deadlines import new_reporter
from projections.envelope import Envelope
from projections.plan import ReporterPlan
from projections.state import MAX_REJECTIONS, Batch, Deadline, ProjectionState, Record
from projections.validation import Rejected, short, validate_value
from schemas.catalog import Catalog
from schemas.events import Report
from schemas.subjects import EventAddress


def impostor(reporter: str, host: str | None, addr: EventAddress) -> str:
    """The dead-letter reason of a payload whose identity is not its subject's."""
    return (f"payload names reporter {short(reporter)!r} host {_show_host(host)} but the "
            f"subject says reporter {short(addr.reporter)!r} host {_show_host(addr.host)}")


def _show_host(host: str | None) -> str:
    return "(cluster)" if host is None else repr(short(host))


def _why_refused(catalog: Catalog, name: str, reporter: str, scope: str) -> str:
    spec = catalog.resources.get(name)
    if spec is None:
        return f"{short(name)}: not a resource in the catalog"
    if spec.reporter != reporter:
        return f"{short(name)}: belongs to reporter {spec.reporter!r}, not {short(reporter)!r}"
    return (f"{short(name)}: a {spec.scope}-scope resource cannot be reported on a "
            f"{scope} subject")


def _all_wrong_scope(catalog: Catalog, values: dict[str, Any], scope: str) -> bool:
    return bool(values) and all(
        (spec := catalog.resources.get(n)) is not None and spec.scope != scope for n in values
    )


_NO_REASONS: Final[list[str]] = []  # shared, never mutated (records replace, not append)


def fast_report(state: ProjectionState, env: Envelope, addr: EventAddress) -> bool | str:
    """Apply a report that sets every resource of its reporter with a valid value, validated
    by the one typed decode of its reporter's plan; no per-value work.

    True: applied.  False: no plan, or the typed decode failed (something is missing
    or invalid): the state is untouched and the general path decodes the report once
    more, generically, to sort out value by value what is wrong.  A string: the
    dead-letter reason of a report from someone its subject does not name.
    """
    _, reporter, host = addr
    plan = state.plan.reporters.get((reporter, "cluster" if host is None else "host"))
    if plan is None:  # none before the first catalog
        return False
    try:
        report = plan.decoder.decode(env.data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return _partial_report(state, env, addr, plan)
    if report.reporter != reporter or report.host != host:
        return impostor(report.reporter, report.host, addr)
    vals = report.values
    for attr in plan.set_fields:
        v = getattr(vals, attr)
        if v is not None:
            setattr(vals, attr, sorted(set(v)))
    t = env.received_at
    batch = Batch(None, report.observed_at, t, plan.keyset, vals, plan.names)
    rec = state.hosts.get(host) if host is not None else state.cluster
    rs = rec.reporters.get(reporter) if rec is not None else None
    uniform = plan.uniform_life
    if (rec is None or rs is None or uniform is None or rs.state != "ok" or rs.silent
            or rs.rejected or len(rs.batches) != 1):
        _store(state, state.record(host), reporter, host, batch, at=(env.seq, t), rejected=0,
               reasons=_NO_REASONS)
        return True
    # Steady state: the reporter re-set everything it owns, and all is well.
    batches = rs.batches
    batches[0].kill()
    batches[0] = batch
    deadline = t + uniform
    silent_at = t + plan.silent_life
    counter = state.counter + 1
    heapq.heappush(state.heap, Deadline(deadline, counter, host, reporter, batch))
    if silent_at != deadline:
        counter += 1
        heapq.heappush(state.heap, Deadline(silent_at, counter, host, reporter, None))
    state.counter = counter
    rs.last_report_at = t
    if rs.overdue:
        rs.overdue = None  # it just set every resource it owns
    rec.as_seq = env.seq
    rec.as_time = t
    return True


def _store(
    state: ProjectionState, rec: Record, reporter: str, host: str | None, batch: Batch, *,
    at: tuple[int, float], rejected: int, reasons: list[str],
) -> None:
    """Record an applied report: its accepted values (`batch`), the reporter's status, deadlines."""
    received_at = batch.received_at
    rs = rec.reporters.get(reporter)
    if rs is None:
        rs = rec.reporters[reporter] = new_reporter(state, reporter, host, received_at,
                                                    batch.keyset)
    plan = state.plan
    silent_at = received_at + plan.reporter_lifetime(reporter)
    heap = state.heap
    names = batch.keyset
    if names:
        batches = rs.batches
        if not batches:
            batches.append(batch)
        elif len(batches) == 1 and batches[0].keyset <= names:
            batches[0].kill()  # every value it set was just re-set
            batches[0] = batch
        else:
            _drop_shadowed(batches, names)
            batches.append(batch)
        rp = plan.reporters.get((reporter, "cluster" if host is None else "host"))
        uniform = rp.uniform_life if rp is not None else None
        deadlines: tuple[float, ...]
        if uniform is not None:
            deadlines = (received_at + uniform,)
        else:
            lifetimes = plan.lifetimes
            deadlines = tuple(sorted({received_at + lifetimes[n] for n in names}))
        counter = state.counter
        for d in deadlines:
            counter += 1
            heapq.heappush(heap, Deadline(d, counter, host, reporter, batch))
        if silent_at not in deadlines:
            # Silence is not tied to the batch (whose entries stop once its values are gone).
            counter += 1
            heapq.heappush(heap, Deadline(silent_at, counter, host, reporter, None))
        state.counter = counter
    else:
        state.counter += 1
        heapq.heappush(heap, Deadline(silent_at, state.counter, host, reporter, None))
    rs.last_report_at = received_at
    rs.rejected = rejected
    rs.rejections = reasons
    if rejected:
        rs.rejected_total += rejected
    if rs.overdue and names:
        rs.overdue.difference_update(names)
    if rs.silent or rs.since is None or rejected or rs.state != "ok":
        rs.silent = False
        rs.restate(received_at)
    rec.as_seq, rec.as_time = at


def _drop_shadowed(batches: list[Batch], names: Any) -> None:
    """Drop the batches whose every name `names` re-sets (they no longer hold a current value)."""
    keep = []
    for b in batches:
        if b.keyset <= names:
            b.kill()
        else:
            keep.append(b)
    if len(keep) > 8:  # many partial reports: drop what newer batches fully shadow
        seen: set[str] = set(names)
        compact: list[Batch] = []
        for b in reversed(keep):
            if b.keyset <= seen:
                b.kill()
            else:
                compact.append(b)
                seen.update(b.keyset)
        keep = compact[::-1]
    batches[:] = keep


def _partial_report(state: ProjectionState, env: Envelope, addr: EventAddress,
                    plan: ReporterPlan) -> bool | str:
    """`fast_report` for a report that sets some of its reporter's resources, each validly
    (`ReporterPlan.partial`): what `apply_report` does with such a report, without its
    per-value checks.  False when it does not decode so (the general path says why)."""
    _, reporter, host = addr
    try:
        report = plan.partial.decode(env.data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    if report.reporter != reporter or report.host != host:
        return impostor(report.reporter, report.host, addr)
    unset = msgspec.UNSET
    accepted = {n: v for n, v in zip(plan.names, astuple(report.values), strict=True)
                if v is not unset}
    for name in plan.set_names:
        v = accepted.get(name)
        if v is not None:
            accepted[name] = sorted(set(v))
    t = env.received_at
    _store(state, state.record(host), reporter, host,
           Batch(accepted, report.observed_at, t, accepted.keys()), at=(env.seq, t),
           rejected=0, reasons=_NO_REASONS)
    return True


def apply_report(
    state: ProjectionState, report: Report, host: str | None, received_at: float, acc: Acc,
    *, strict_scope: bool,
) -> str | None:
    """Apply a Report value by value (DESIGN §5); returns a dead-letter reason or None."""
    reporter = report.reporter  # == the subject's (checked)
    catalog = state.catalog
    assert catalog is not None
    scope = "cluster" if host is None else "host"
    values = report.values
    table = state.plan.declared(reporter, scope)
    if strict_scope and values:
        first = next(iter(values))
        if first not in table and _all_wrong_scope(catalog, values, scope):
            return (f"every value is of a resource whose scope does not match this {scope} "
                    f"subject ({', '.join(short(n) for n in list(values)[:5])})")
    accepted: dict[str, Any] = {}
    rejected = 0
    reasons: list[str] = []
    for name, v in values.items():
        rule = table.get(name)
        if rule is None:
            rejected += 1
            if len(reasons) < MAX_REJECTIONS:
                reasons.append(_why_refused(catalog, name, reporter, scope))
            continue
        checked = validate_value(name, rule, v)
        if isinstance(checked, Rejected):
            rejected += 1
            if len(reasons) < MAX_REJECTIONS:
                reasons.append(checked.reason)
            continue
        accepted[name] = checked
    batch = Batch(accepted, report.observed_at, received_at, accepted.keys())
    _store(state, state.record(host), reporter, host, batch, at=(acc.at_seq, acc.at_time),
           rejected=rejected, reasons=reasons)
    acc.touch(host)
    return None
