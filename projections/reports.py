"""Applying a report: the typed fast path, and value by value (docs/contract.md,
"`resources.yaml`").

A report from a reporter the catalog knows is first decoded by that
reporter's typed decoder (`crr.projections.plan.ReporterPlan.decoder`); if every
value it sets is one the reporter owns, valid, the decode *was* the
validation: a report that sets them all is stored as decoded, one that sets
some as the dict of those (`fast_report`, the hot path).  Otherwise the
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

from crr.projections.changes import Acc
from crr.projections.deadlines import new_reporter
from crr.projections.envelope import Envelope
from crr.projections.plan import ReporterPlan
from crr.projections.state import MAX_REJECTIONS, Batch, Deadline, ProjectionState, Record
from crr.projections.validation import Rejected, short, validate_value
from crr.schemas.catalog import Catalog
from crr.schemas.events import Report
from crr.schemas.subjects import EventAddress


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
    """Apply a report whose every value is one its reporter owns, valid, validated by the
    one typed decode of its reporter's plan; no per-value work.

    True: applied.  False: no plan, or the typed decode failed (a value unknown or
    invalid): the state is untouched and the general path decodes the report once
    more, generically, to sort out value by value what is wrong.  A string: the
    dead-letter reason of a report from someone its subject does not name.
    """
    _, reporter, host = addr
    plan = state.plan.reporters.get((reporter, "cluster" if host is None else "host"))
    if plan is None:  # none before the first catalog
        return False
    try:
        # One decode for full and partial reports alike: a full one leaves nothing
        # `UNSET` (the typed decoder that requires every value would fail on a partial
        # report only after parsing it, and raising costs more than the decode).
        report = plan.decoder.decode(env.data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    if report.reporter != reporter or report.host != host:
        return impostor(report.reporter, report.host, addr)
    vals = report.values
    decoded = astuple(vals)
    if msgspec.UNSET in decoded:
        return _partial_report(state, env, host, reporter, plan,
                               observed_at=report.observed_at, values=vals)
    for attr in plan.set_fields:
        v = getattr(vals, attr)
        if v is not None:
            setattr(vals, attr, sorted(set(v)))
    t = env.received_at
    rec = state.hosts.get(host) if host is not None else state.cluster
    rs = rec.reporters.get(reporter) if rec is not None else None
    uniform = plan.uniform_life
    if (rec is None or rs is None or uniform is None or rs.state != "ok" or rs.silent
            or rs.rejected or not rs.batches):
        _store(state, state.record(host), reporter, host,
               Batch(None, report.observed_at, t, plan.keyset, vals, plan.names),
               at=(env.seq, t), rejected=0, reasons=_NO_REASONS)
        return True
    # Steady state: the reporter re-set everything it owns, and all is well.
    batches = rs.batches
    if len(batches) > 1:  # (partial reports since its last full one: all overwritten now)
        for b in batches[1:]:
            b.kill()
        del batches[1:]
    deadline = t + uniform
    old = batches[0]
    if _refreshable(old, deadline):
        old.values, old.full, old.keyset, old.order = None, vals, plan.keyset, plan.names
        old.observed_at, old.received_at, old.due = report.observed_at, t, deadline
    else:
        old.kill()
        batch = batches[0] = Batch(None, report.observed_at, t, plan.keyset, vals, plan.names,
                                   due=deadline)
        state.counter += 1
        heapq.heappush(state.heap, Deadline(deadline, state.counter, host, reporter, batch))
    silent_at = t + plan.silent_life
    if silent_at != deadline:
        state.counter += 1
        heapq.heappush(state.heap, Deadline(silent_at, state.counter, host, reporter, None))
    rs.last_report_at = t
    if rs.overdue:
        rs.overdue = None  # it just set every resource it owns
    rec.as_seq = env.seq
    rec.as_time = t
    return True


def _refreshable(batch: Batch, due: float) -> bool:
    """Whether a report that re-sets exactly `batch`'s values, due at `due`, may refresh it
    in place: its one heap entry is still pending (`Batch.due`: none of it settled), and
    comes due no later than `due` (it is pushed again then; receive times that went
    backwards get an entry of their own)."""
    return 0.0 < batch.due <= due


def _shadows(names: Any, batches: list[Batch]) -> bool:
    """Whether `names` re-sets every value of a batch before the last one."""
    for i in range(len(batches) - 1):  # noqa: SIM110 - no generator: once per partial report
        if batches[i].keyset <= names:
            return True
    return False


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
            batch.due = received_at + uniform
            deadlines = (batch.due,)
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


def _partial_report(state: ProjectionState, env: Envelope, host: str | None, reporter: str,
                    plan: ReporterPlan, *, observed_at: str, values: Any) -> bool:
    """`fast_report` for a report that sets some of its reporter's resources, each validly
    (`values`: its typed decode, `UNSET` where it sets none): what `apply_report` does
    with such a report, without its per-value checks."""
    # The values it sets, by resource name, in the order of `plan.names`: the typed
    # struct's fields are renamed to the names and `to_builtins` leaves out what is
    # UNSET (its value types, int/float/bool/str/list[str]/None, come back as they are).
    accepted: dict[str, Any] = msgspec.to_builtins(values)
    for name in plan.set_names:
        v = accepted.get(name)
        if v is not None:
            accepted[name] = sorted(set(v))
    t = env.received_at
    rec = state.hosts.get(host) if host is not None else state.cluster
    if rec is None:
        rec = state.record(host)
    rs = rec.reporters.get(reporter)
    uniform = plan.uniform_life
    if (rs is not None and uniform is not None and rs.state == "ok" and not rs.silent
            and not rs.rejected and rs.since is not None and rs.batches):
        # Steady state: the reporter re-set exactly what its last report set.
        batches = rs.batches
        last = batches[-1]
        deadline = t + uniform
        names = accepted.keys()
        in_place = (_refreshable(last, deadline) and last.keyset == names
                    and (len(batches) == 1 or not _shadows(names, batches)))
        if in_place:
            last.values, last.full, last.keyset = accepted, None, names
            last.observed_at, last.received_at, last.due = observed_at, t, deadline
        elif names:
            # Other values than its last report set (a partial report after a full one):
            # what `_store` does in this state, without its general case.
            batch = Batch(accepted, observed_at, t, names, due=deadline)
            if len(batches) > 1 or batches[0].keyset <= names:
                _drop_shadowed(batches, names)
            batches.append(batch)
            state.counter += 1
            heapq.heappush(state.heap, Deadline(deadline, state.counter, host, reporter, batch))
        if in_place or names:  # (a report of no values: `_store` pushes its silence alone)
            silent_at = t + plan.silent_life
            if silent_at != deadline:
                state.counter += 1
                heapq.heappush(state.heap, Deadline(silent_at, state.counter, host, reporter,
                                                    None))
            rs.last_report_at = t
            rs.rejections = _NO_REASONS
            if rs.overdue:
                rs.overdue.difference_update(names)
            rec.as_seq, rec.as_time = env.seq, t
            return True
    _store(state, rec, reporter, host, Batch(accepted, observed_at, t, accepted.keys()),
           at=(env.seq, t), rejected=0, reasons=_NO_REASONS)
    return True


def apply_report(
    state: ProjectionState, report: Report, host: str | None, received_at: float, acc: Acc,
    *, strict_scope: bool,
) -> str | None:
    """Apply a Report value by value (docs/contract.md, "`resources.yaml`"); returns a dead-letter
    reason or None."""
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
