"""Applying a report: a fast validation in front of one store (docs/contract.md, "Payloads").

A report is validated one of two ways, then stored by the one `store`:

- **the fast validation** (`apply_typed`): a report from a reporter the catalog
  knows is decoded by that reporter's typed decoder
  (`crr.projections.plan.ReporterPlan.decoder`); if every value it sets is one
  the reporter owns, valid, the decode *was* the validation;
- **the value-by-value check** (`apply_report`) for everything else, or for every
  report when `ProjectionState.typed_validation` is off: the report, decoded
  generically, is checked value by value; rejected values are counted on the
  reporter with their reasons.

Either way `store` records the accepted values: as one `Batch` (its names and
values two tuples in name order), the reporter's status, the deadlines (every deadline
through `crr.projections.deadlines.push`).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Any, Final

import msgspec
from msgspec import UNSET
from msgspec.structs import astuple

from crr.projections.changes import Acc
from crr.projections.deadlines import new_reporter, push
from crr.projections.envelope import Envelope
from crr.projections.plan import ReporterPlan
from crr.projections.state import MAX_REJECTIONS, Batch, ProjectionState
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


def apply_typed(state: ProjectionState, env: Envelope, addr: EventAddress) -> bool:
    """The fast validation, then `store`: whether the report was stored.

    A report is stored here when the one typed decode of its reporter's plan validates
    every value it sets (no per-value work).  False: no plan (before the first
    catalog), the typed decode failed (a value unknown or invalid), or the payload
    names someone its subject does not: the state is untouched, and the value-by-value
    check decodes the report once more, generically, to sort out what is wrong (or
    dead-letter it).
    """
    _, reporter, host = addr
    rp = state.plan.reporters.get((reporter, "cluster" if host is None else "host"))
    if rp is None:
        return False
    try:
        # One decode for full and partial reports alike: a full one leaves nothing `UNSET`.
        report = rp.decoder.decode(env.data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    if report.reporter != reporter or report.host != host:
        return False
    # The values it sets, in name order: the typed struct's fields are the names, sorted
    # (renamed); a full report leaves nothing `UNSET` and shares the plan's names.
    vals = report.values
    for attr in rp.set_fields:
        v = getattr(vals, attr)
        if v is not None and v is not UNSET:
            setattr(vals, attr, sorted(set(v)))
    decoded = astuple(vals)
    if UNSET in decoded:  # a partial report: `to_builtins` leaves out what is UNSET (its
        # value types, int/float/bool/str/list[str]/None, come back as they are)
        values: dict[str, Any] = msgspec.to_builtins(vals)
        names, decoded = tuple(values), tuple(values.values())
        keyset: AbstractSet[str] = frozenset(names)
    else:
        names, keyset = rp.names, rp.keyset
    t = env.received_at
    store(state, host, reporter, names, decoded, keyset, report.observed_at, t, (env.seq, t),
          0, _NO_REASONS, rp)
    return True


def store(  # noqa: PLR0917 - positional: the hot path calls it once per report
    state: ProjectionState, host: str | None, reporter: str, keys: tuple[str, ...],
    vals: tuple[Any, ...], names: AbstractSet[str], observed_at: str, t: float,
    at: tuple[int, float], rejected: int = 0, reasons: list[str] = _NO_REASONS,
    rp: ReporterPlan | None = None,
) -> None:
    """The one store: record a report's accepted values (`keys`, in name order, and their
    `vals`; `names`: a set of `keys`), observed at `observed_at`, received at `t`: the reporter's
    batches, its status, the deadlines.  `rejected` values were refused (`reasons`: the
    first few).  The record is stamped `at` (sequence, time).  `rp`: the reporter's plan
    for this scope, when the caller has it."""
    rec = state.hosts.get(host) if host is not None else state.cluster
    if rec is None:
        rec = state.record(host)
    rs = rec.reporters.get(reporter)
    if rp is None:
        rp = state.plan.reporters.get((reporter, "cluster" if host is None else "host"))
    uniform = rp.uniform_life if rp is not None else None
    if (rs is not None and uniform is not None and names and not rejected and rs.state == "ok"
            and not rs.silent and not rs.rejected and rs.since is not None and rs.batches):
        # The steady state (most reports): an ok reporter whose values share one lifetime,
        # a report without rejections.  One deadline for the batch; its status stays.
        batches = rs.batches
        deadline = t + uniform
        last = batches[-1]
        old = last if (len(batches) == 1 and (last.keyset is names or last.keyset == names)
                       and 0.0 < last.due <= deadline and state.refresh_in_place
                       ) else _refreshable(state, batches, names, deadline)
        if old is not None:
            old.names, old.vals, old.keyset = keys, vals, names
            old.observed_at, old.received_at, old.due = observed_at, t, deadline
        else:
            if len(batches) > 1 or batches[0].keyset <= names:
                _drop_shadowed(batches, names)
            batch = Batch(keys, vals, observed_at, t, names, due=deadline)
            batches.append(batch)
            push(state, deadline, host, reporter, batch)
        silent_at = t + rp.silent_life  # type: ignore[union-attr]  # (uniform: rp is set)
        if silent_at != deadline:
            push(state, silent_at, host, reporter, None)
        rs.last_report_at = t
        rs.rejections = reasons
        if rs.overdue:
            rs.overdue.difference_update(names)
        rec.as_seq, rec.as_time = at
        return
    if rs is None:
        rs = rec.reporters[reporter] = new_reporter(state, reporter, host, t, names)
    plan = state.plan
    silent_at = t + plan.reporter_lifetime(reporter)
    if names:
        batch = Batch(keys, vals, observed_at, t, names)
        batches = rs.batches
        if not batches:
            batches.append(batch)
        elif len(batches) == 1 and batches[0].keyset <= names:
            batches[0].kill()  # every value it set was just re-set
            batches[0] = batch
        else:
            _drop_shadowed(batches, names)
            batches.append(batch)
        deadlines: tuple[float, ...]
        if uniform is not None:
            batch.due = t + uniform
            deadlines = (batch.due,)
        else:
            lifetimes = plan.lifetimes
            deadlines = tuple(sorted({t + lifetimes[n] for n in names}))
        for d in deadlines:
            push(state, d, host, reporter, batch)
        if silent_at not in deadlines:
            # Silence is not tied to the batch (whose entries stop once its values are gone).
            push(state, silent_at, host, reporter, None)
    else:
        push(state, silent_at, host, reporter, None)
    rs.last_report_at = t
    rs.rejected = rejected
    rs.rejections = reasons
    if rejected:
        rs.rejected_total += rejected
    if rs.overdue and names:
        rs.overdue.difference_update(names)
    if rs.silent or rs.since is None or rejected or rs.state != "ok":
        rs.silent = False
        rs.restate(t)
    rec.as_seq, rec.as_time = at


def _refreshable(state: ProjectionState, batches: list[Batch], names: Any,
                 due: float) -> Batch | None:
    """The batch a report re-setting exactly its values (`names`), due at `due`, may refresh
    in place, if any (no new heap entry; see `crr.projections.state.Batch.due`): the
    newest batch when it holds just those names and no older one is shadowed, or the
    oldest when it does and every newer one is shadowed (those are dropped here).

    A batch qualifies only while its one heap entry is pending (`due` > 0: none of it
    settled) and comes due no later than `due` (it is pushed again then; receive times
    that went backwards get an entry of their own).  Never with
    `ProjectionState.refresh_in_place` off.
    """
    if not state.refresh_in_place:
        return None
    last = batches[-1]
    if last.keyset == names:
        if 0.0 < last.due <= due and (len(batches) == 1 or not _shadows(names, batches)):
            return last
        return None
    first = batches[0]
    if first.keyset == names and 0.0 < first.due <= due and all(
            b.keyset <= names for b in batches[1:]):
        for b in batches[1:]:
            b.kill()
        del batches[1:]
        return first
    return None


def _shadows(names: Any, batches: list[Batch]) -> bool:
    """Whether `names` re-sets every value of a batch before the last one."""
    for i in range(len(batches) - 1):  # noqa: SIM110 - no generator: once per partial report
        if batches[i].keyset <= names:
            return True
    return False


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


def apply_report(
    state: ProjectionState, report: Report, host: str | None, received_at: float, acc: Acc,
    *, strict_scope: bool,
) -> str | None:
    """The value-by-value check of a Report (docs/contract.md, "`resources.yaml`"), then
    `store`; returns a dead-letter reason or None."""
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
    keys = tuple(accepted)
    if list(keys) != sorted(keys):  # a batch's values are in name order
        accepted = dict(sorted(accepted.items()))
        keys = tuple(accepted)
    store(state, host, reporter, keys, tuple(accepted.values()), frozenset(keys),
          observed_at=report.observed_at,
          t=received_at, at=(acc.at_seq, acc.at_time), rejected=rejected,
          reasons=reasons or _NO_REASONS)
    acc.touch(host)
    return None
