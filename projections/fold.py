"""The pure fold: `state x event -> state` (`apply`) and `state x now -> state` (`expire`).

Where a report becomes a snapshot value — the path of one stored message:

1. `apply(state, env)` first runs expiry up to the message's receive time
   (`env.received_at`, the JetStream server timestamp), then parses the
   subject (cached per subject).
2. A report from a reporter the catalog knows is decoded by that reporter's
   typed decoder (`projections.plan.ReporterPlan.decoder`); if every value
   it owns is there and valid, the decode *was* the validation and the
   report is stored as decoded (`_fast_report`, the hot path).
3. Anything else is decoded once, generically (`_apply`), and dispatched on
   its type with `match`: a report is checked value by value
   (`projections.validation.validate_value`; rejected values are counted on
   the reporter with their reasons, the rest is stored), an inventory or a
   health event updates its reporter.  What cannot be applied at all comes
   back as `Changes.deadletter` (a reason) for the projector to dead-letter.
4. Accepted values land in `projections.state` as a `Batch` per report, and
   their deadlines go on the state's heap (`Deadline`); `expire` turns them
   stale when they come due.
5. `projections.state.host_snapshot` / `cluster_snapshot` build the
   snapshot records (DESIGN §4) from the state; the projector publishes
   them for the records `Changes` names.

No IO, no clock, no logging: time comes only from `Envelope.received_at` or
the `now` passed to `expire`, so live projection and replay run this same
code and agree byte for byte.  Bad input never raises: an event that cannot
be applied leaves the state as it was, apart from `state.seq`.  The catalog
in force is compiled once into a frozen `projections.plan.CatalogPlan`.
Semantics are DESIGN §3-§5; the decisions where it is silent are written
beside the code that makes them.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Iterable
from typing import Any, Final

import msgspec

from projections.envelope import Envelope
from projections.plan import compile_plan
from projections.state import (
    MAX_REJECTIONS,
    Batch,
    Deadline,
    Held,
    InventorySlot,
    ProjectionState,
    Record,
    ReporterRecord,
    compact_heap,
)
from projections.validation import Rejected, short, validate_devices, validate_value
from schemas.catalog import Catalog
from schemas.catalog_loader import catalog_from_wire
from schemas.codec import decode_event
from schemas.errors import CatalogError, PayloadError, SubjectError
from schemas.events import Forget, Health, Inventory, Report
from schemas.subjects import (
    ADMIN_HOST_PREFIX,
    CATALOG,
    DEADLETTER,
    EventAddress,
    parse_event_subject,
    parse_forget_subject,
)


class Changes(msgspec.Struct, frozen=True, kw_only=True):
    """What one `apply` or `expire` changed, so the caller rewrites only those records."""

    hosts: frozenset[str] = frozenset()
    cluster: bool = False
    catalog: bool = False
    deadletter: str | None = None
    """Why the event could not be applied (the caller dead-letters it), else None."""


NO_CHANGES: Final = Changes()

_EVENT_TYPES: Final[dict[str, type[Report | Inventory | Health]]] = {
    "report": Report, "inventory": Inventory, "health": Health}
_ANY: Final = msgspec.json.Decoder()
_FORGET: Final = msgspec.json.Decoder(Forget)


class _Acc:
    """Collects changes during one call (one set, no per-change allocation)."""

    __slots__ = ("at_seq", "at_time", "catalog", "cluster", "hosts")

    def __init__(self, at_seq: int = 0, at_time: float = 0.0) -> None:
        self.hosts: set[str] = set()
        self.cluster = False
        self.catalog = False
        self.at_seq = at_seq
        """`as_of` stamped on records an event changes (its own seq and time, but see pending)."""
        self.at_time = at_time

    def touch(self, host: str | None) -> None:
        if host is None:
            self.cluster = True
        else:
            self.hosts.add(host)

    def result(self, deadletter: str | None = None) -> Changes:
        if not self.hosts and not self.cluster and not self.catalog and deadletter is None:
            return NO_CHANGES
        return Changes(hosts=frozenset(self.hosts), cluster=self.cluster,
                       catalog=self.catalog, deadletter=deadletter)


@functools.lru_cache(maxsize=1 << 16)
def _address(subject: str) -> EventAddress | str:
    """The parsed event subject, or why it is not one (cached: subjects repeat)."""
    try:
        return parse_event_subject(subject)
    except SubjectError as exc:
        return f"unknown subject: {exc.message}"


# -- public API ---------------------------------------------------------------


@functools.lru_cache(maxsize=1 << 16)
def _host_changed(host: str) -> Changes:
    return Changes(hosts=frozenset((host,)))


_CLUSTER_CHANGED: Final = Changes(cluster=True)


def apply(state: ProjectionState, env: Envelope) -> Changes:
    """Apply one stored event; expiry up to its receive time runs first."""
    t = env.received_at
    heap = state.heap
    if len(heap) > state.heap_limit:
        compact_heap(state)
    acc = None
    if heap and heap[0].due <= t:
        # Most due entries are of overwritten batches: drop them without further ado.
        while heap and (top := heap[0]).due <= t and (b := top.batch) is not None and b.dead:
            heapq.heappop(heap)
        if heap and heap[0].due <= t:
            acc = _Acc(env.seq, t)
            _expire(state, t, acc)
    state.seq = env.seq
    addr = _address(env.subject)
    # The common case, kept cheap: a report setting all its reporter's resources validly.
    if type(addr) is EventAddress and addr.kind == "report":
        done = _fast_report(state, env, addr)
        if done is True:
            host = addr.host
            if acc is None:
                return _CLUSTER_CHANGED if host is None else _host_changed(host)
            acc.touch(host)
            return acc.result()
        if done is not False:  # decoded, but not from whom its subject says
            return (acc or _Acc(env.seq, t)).result(done)
    if acc is None:
        acc = _Acc(env.seq, t)
    reason = _apply(state, env, acc)
    return acc.result(reason)


def expire(state: ProjectionState, now: float) -> Changes:
    """Turn every value, inventory and reporter whose deadline is `<= now` stale or silent."""
    acc = _Acc()
    _expire(state, now, acc)
    return acc.result()


def next_deadline(state: ProjectionState) -> float | None:
    """When `expire` next has something to do (None: nothing pending)."""
    heap = state.heap
    # Drop entries whose report was entirely overwritten; they would do nothing.
    while heap and (b := heap[0].batch) is not None and b.dead:
        heapq.heappop(heap)
    return heap[0].due if heap else None


def fold(
    envs: Iterable[Envelope], now: float | None = None, state: ProjectionState | None = None
) -> ProjectionState:
    """Apply `envs` in order to `state` (a new one by default), then expire at `now` if given."""
    st = state if state is not None else ProjectionState()
    for env in envs:
        apply(st, env)
    if now is not None:
        expire(st, now)
    return st


# -- dispatch -----------------------------------------------------------------


def _apply(state: ProjectionState, env: Envelope, acc: _Acc) -> str | None:
    """Every event but an all-valid full report: decoded here once, then dispatched on
    what it is; returns a dead-letter reason or None."""
    subject = env.subject
    if subject == CATALOG:
        return _apply_catalog(state, env, acc)
    if subject == DEADLETTER:
        return None  # the projector's own output, captured by CRR_EVENTS: nothing to fold
    if subject.startswith(ADMIN_HOST_PREFIX):
        return _apply_forget(state, env, acc)
    addr = _address(subject)
    if isinstance(addr, str):
        return addr
    try:
        event = decode_event(env.data, _EVENT_TYPES[addr.kind])
    except PayloadError as exc:
        return exc.message
    if event.reporter != addr.reporter or event.host != addr.host:
        return _impostor(event.reporter, event.host, addr)
    if state.catalog is None:
        # Nothing can be validated yet: keep the latest per subject until a catalog arrives.
        state.pending[subject] = Held(env, event)
        return None
    return _apply_event(state, event, addr.host, env.received_at, acc, strict_scope=True)


def _apply_event(state: ProjectionState, event: Report | Inventory | Health, host: str | None,
                 received_at: float, acc: _Acc, *, strict_scope: bool) -> str | None:
    """Apply a decoded event whose identity matches its subject; a dead-letter reason or None.

    `strict_scope`: dead-letter a report whose every value is of the other scope
    (else those values are rejected one by one and show on the reporter).
    """
    match event:
        case Report():
            return _apply_report(state, event, host, received_at, acc, strict_scope=strict_scope)
        case Inventory():
            _apply_inventory(state, event, host, received_at, acc)
        case Health():
            _apply_health(state, event, host, received_at, acc)
    return None


def _impostor(reporter: str, host: str | None, addr: EventAddress) -> str:
    """The dead-letter reason of a payload whose identity is not its subject's."""
    return (f"payload names reporter {short(reporter)!r} host {_show_host(host)} but the "
            f"subject says reporter {short(addr.reporter)!r} host {_show_host(addr.host)}")


def _apply_forget(state: ProjectionState, env: Envelope, acc: _Acc) -> str | None:
    """`crr hosts forget`: drop everything known about the host (DESIGN §3 admin subject).

    Its batches are killed (their deadline entries are skipped when they come
    due; a silence entry finds no record and does nothing), events of it held
    for a catalog are dropped, and the host is reported changed: with no record
    left the projector writes a delete marker.  Later events bring it back.
    """
    try:
        host = parse_forget_subject(env.subject)
    except SubjectError as exc:
        return f"unknown subject: {exc.message}"
    if host is None:
        return f"unknown subject: {short(env.subject)!r} is no admin instruction crr knows"
    try:
        forget = _FORGET.decode(env.data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return f"bad forget instruction: {exc}"
    if forget.host != host:
        return (f"payload names host {short(forget.host)!r} but the subject says "
                f"{short(host)!r}")
    rec = state.hosts.pop(host, None)
    if rec is not None:
        for rs in rec.reporters.values():
            for b in rs.batches:
                b.kill()
            rs.batches = []
    for subject in [s for s in state.pending if _pending_host(s) == host]:
        del state.pending[subject]
    acc.hosts.add(host)
    return None


def _pending_host(subject: str) -> str | None:
    addr = _address(subject)
    return addr.host if isinstance(addr, EventAddress) else None


def _show_host(host: str | None) -> str:
    return "(cluster)" if host is None else repr(short(host))


def _stamp(rec: Record, acc: _Acc) -> None:
    rec.as_seq = acc.at_seq
    rec.as_time = acc.at_time


def _reporter(state: ProjectionState, rec: Record, reporter: str, host: str | None,
              t: float) -> ReporterRecord:
    rs = rec.reporters.get(reporter)
    if rs is None:
        rs = rec.reporters[reporter] = _new_reporter(state, reporter, host, t)
    return rs


def _new_reporter(state: ProjectionState, reporter: str, host: str | None,
                  t: float, held: Any = ()) -> ReporterRecord:
    """A reporter first seen at `t`; its declared resources are due by `t` + their lifetime
    (`missing` names those still never reported then; `held`: those its first report sets)."""
    rs = ReporterRecord(first_seen=t)
    for d in _overdue_deadlines(state, rs, reporter, host, held):
        _push(state, d, host, reporter, None)
    return rs


def _overdue_deadlines(state: ProjectionState, rs: ReporterRecord, reporter: str,
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


def _push(state: ProjectionState, deadline: float, host: str | None, reporter: str,
          batch: Batch | None) -> None:
    state.counter += 1
    heapq.heappush(state.heap, Deadline(deadline, state.counter, host, reporter, batch))


# -- reports ------------------------------------------------------------------


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


def _fast_report(state: ProjectionState, env: Envelope, addr: EventAddress) -> bool | str:
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
        return False
    if report.reporter != reporter or report.host != host:
        return _impostor(report.reporter, report.host, addr)
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
        rs = rec.reporters[reporter] = _new_reporter(state, reporter, host, received_at,
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


def _apply_report(
    state: ProjectionState, report: Report, host: str | None, received_at: float, acc: _Acc,
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


# -- inventory and health ------------------------------------------------------


def _apply_inventory(
    state: ProjectionState, inv: Inventory, host: str | None, received_at: float, acc: _Acc
) -> None:
    """Apply an Inventory: replaces the reporter's pool on that host unless it is malformed."""
    reporter = inv.reporter
    rec = state.record(host)
    rs = _reporter(state, rec, reporter, host, received_at)
    life = state.plan.reporter_lifetime(reporter)
    bad = validate_devices(inv.devices)
    if bad is None:
        rec.inventory[reporter] = InventorySlot(
            pool=inv.pool, devices=inv.devices, observed_at=inv.observed_at,
            received_at=received_at, expires_at=received_at + life)
        rs.rejected, rs.rejections = 0, []
    else:
        rs.rejected, rs.rejections = 1, [bad.reason]  # the previous inventory stays
        rs.rejected_total += 1
    rs.last_report_at = received_at
    rs.silent = False
    rs.restate(received_at)
    _push(state, received_at + life, host, reporter, None)
    _stamp(rec, acc)
    acc.touch(host)


def _apply_health(
    state: ProjectionState, health: Health, host: str | None, received_at: float, acc: _Acc
) -> None:
    """Apply a Health event: the runner's view of the reporter's lifecycle."""
    reporter = health.reporter
    rec = state.record(host)
    new = reporter not in rec.reporters
    rs = _reporter(state, rec, reporter, host, received_at)
    rs.health = health.state
    rs.detail = health.detail
    rs.exit_code = health.exit_code
    rs.boot = health.boot
    rs.restate(received_at)
    if new:
        # A reporter seen only through Health turns silent if it never reports.
        _push(state, received_at + state.plan.reporter_lifetime(reporter), host, reporter,
              None)
    _stamp(rec, acc)
    acc.touch(host)


# -- expiry -------------------------------------------------------------------


def _expire(state: ProjectionState, now: float, acc: _Acc) -> None:
    heap = state.heap
    while heap and heap[0].due <= now:
        entry = heapq.heappop(heap)
        batch = entry.batch
        if batch is not None and batch.dead:
            continue
        _settle(state, entry.host, entry.reporter, acc, batch=batch, now=now)


def _settle(state: ProjectionState, host: str | None, reporter: str, acc: _Acc, *,
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


# -- catalog ------------------------------------------------------------------


def _apply_catalog(state: ProjectionState, env: Envelope, acc: _Acc) -> str | None:
    try:
        catalog = catalog_from_wire(_ANY.decode(env.data))
    except msgspec.DecodeError as exc:
        return f"catalog is not valid JSON: {exc}"
    except CatalogError as exc:
        return "invalid catalog (kept the previous one): " + "; ".join(exc.problems)
    if catalog == state.catalog:
        return None
    first = state.catalog is None
    old_lifetimes = state.plan.lifetimes
    state.plan = compile_plan(catalog)
    state.catalog_seq = env.seq
    acc.catalog = True
    t = env.received_at
    if first:
        # Apply what waited for a catalog, in stream order; the records change now.
        pending = sorted(state.pending.values(), key=lambda held: held.env.seq)
        state.pending.clear()
        # Records touched here changed as of the catalog event: stamp them with it.
        inner = _Acc(env.seq, t)
        for held in pending:
            received_at = held.env.received_at
            if state.heap and state.heap[0].due <= received_at:
                _expire(state, received_at, inner)
            # Not dead-lettered now (Changes speaks for the catalog event): wrong-scope
            # values are rejected one by one and show on the reporter instead.
            _apply_event(state, held.event, held.event.host, received_at, inner,
                         strict_scope=False)
        for host in inner.hosts:
            _stamp(state.hosts[host], inner)
        if inner.cluster:
            _stamp(state.cluster, inner)
        acc.hosts |= inner.hosts
        acc.cluster = acc.cluster or inner.cluster
    else:
        for host, rec in state.hosts.items():
            if _recatalog(state, catalog, rec, old_lifetimes, cluster=False):
                _stamp(rec, acc)
                acc.touch(host)
        if _recatalog(state, catalog, state.cluster, old_lifetimes, cluster=True):
            _stamp(state.cluster, acc)
            acc.touch(None)
        _rebuild_heap(state)
    _expire(state, t, acc)
    return None


def _recatalog(
    state: ProjectionState, catalog: Catalog, rec: Record, old_lifetimes: dict[str, float], *,
    cluster: bool,
) -> bool:
    """Fit one record to a new catalog; True if anything in it changed.

    A value is kept only while the catalog still declares its resource with
    the same reporter and scope and the value still validates; a kept value's
    `expires_at` follows the new lifetime (it is derived from its receive
    time).  Stale values and silent reporters stay as they are until a new
    report: staleness is a recorded fact, not re-derived.
    """
    scope = "cluster" if cluster else "host"
    changed = False
    for reporter, rs in rec.reporters.items():
        for batch in rs.batches:
            values = batch.materialise()
            for name in list(values):
                spec = catalog.resources.get(name)
                if (spec is None or spec.reporter != reporter or spec.scope != scope
                        or isinstance(validate_value(name, spec, values[name]), Rejected)):
                    del values[name]
                    if batch.stale:
                        batch.stale.pop(name, None)
                    changed = True
                elif old_lifetimes.get(name) != state.plan.lifetimes[name] and not (
                        batch.stale and name in batch.stale):
                    changed = True
            if not values:
                batch.dead = True
        rs.batches = [b for b in rs.batches if not b.dead]
        if rs.overdue:
            # Only what the new catalog declares can be missing (a resource declared
            # again later is due again from the reporter's first sight).
            declared = state.plan.declared(reporter, scope)
            before = len(rs.overdue)
            rs.overdue.intersection_update(declared)
            changed = changed or len(rs.overdue) != before
    for reporter, inv in rec.inventory.items():
        if not inv.stale:
            exp = inv.received_at + state.plan.reporter_lifetime(reporter)
            if exp != inv.expires_at:
                inv.expires_at = exp
                changed = True
    return changed


def _rebuild_heap(state: ProjectionState) -> None:
    """Recreate the deadline heap from the records (after a catalog change moved deadlines)."""
    entries: list[Deadline] = []
    records: list[tuple[str | None, Record]] = [(h, r) for h, r in sorted(state.hosts.items())]
    records.append((None, state.cluster))
    for host, rec in records:
        entries.extend(_record_deadlines(state, host, rec))
    heapq.heapify(entries)
    state.heap = entries


def _record_deadlines(state: ProjectionState, host: str | None, rec: Record) -> list[Deadline]:
    """Heap entries for everything of one record still to come due."""
    entries: list[Deadline] = []
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
                due = {batch.received_at + uniform}
            else:
                due = {batch.received_at + lifetimes[n] for n in batch.keyset
                       if n not in stale}
            for d in sorted(due):
                state.counter += 1
                entries.append(Deadline(d, state.counter, host, reporter, batch))
        inv = rec.inventory.get(reporter)
        other: set[float] = set()
        if inv is not None and not inv.stale:
            other.add(inv.expires_at)
        if rs is not None and not rs.silent:
            other.add(rs.silence_start() + plan.reporter_lifetime(reporter))
        if rs is not None:
            other.update(_overdue_deadlines(state, rs, reporter, host))
        for d in sorted(other):
            state.counter += 1
            entries.append(Deadline(d, state.counter, host, reporter, None))
    return entries


# -- restoring (projections.checkpoint) ------------------------------------------


def set_catalog(state: ProjectionState, catalog: Catalog, seq: int) -> None:
    """Make `catalog` (from the `CRR_EVENTS` event at `seq`) the state's catalog, without
    touching any record: for a restore, whose records were folded with it already."""
    state.plan = compile_plan(catalog)
    state.catalog_seq = seq


def install(state: ProjectionState, host: str | None, rec: Record) -> None:
    """Put a restored record in place of `host`'s (the cluster's for None), with its
    deadlines; the record it replaces, if any, is let go (its heap entries are skipped)."""
    old = state.hosts.get(host) if host is not None else state.cluster
    if old is not None:
        for rs in old.reporters.values():
            for b in rs.batches:
                b.kill()
    if host is None:
        state.cluster = rec
    else:
        state.hosts[host] = rec
    for entry in _record_deadlines(state, host, rec):
        heapq.heappush(state.heap, entry)


def advance(state: ProjectionState, env: Envelope) -> Changes:
    """Pass over an event without applying it (a restored record already reflects it):
    expiry up to its receive time runs, and the position moves, as `apply` would."""
    acc = _Acc(env.seq, env.received_at)
    if state.heap and state.heap[0].due <= env.received_at:
        _expire(state, env.received_at, acc)
    state.seq = env.seq
    return acc.result()
