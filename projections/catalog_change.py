"""A new catalog in force: the first one applies what waited for it; a later one fits every
record to it (`_recatalog`) and rebuilds the deadline heap."""

from __future__ import annotations

from typing import Final

import msgspec

from crr.projections.changes import Acc, stamp
from crr.projections.deadlines import rebuild_heap
from crr.projections.envelope import Envelope
from crr.projections.event_dispatch import apply_event
from crr.projections.expiry import expire_due
from crr.projections.plan import compile_plan
from crr.projections.state import ProjectionState, Record
from crr.projections.validation import Rejected, validate_value
from crr.schemas.catalog import Catalog
from crr.schemas.catalog_loader import catalog_from_wire
from crr.schemas.errors import CatalogError

_ANY: Final = msgspec.json.Decoder()


def apply_catalog(state: ProjectionState, env: Envelope, acc: Acc) -> str | None:
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
        inner = Acc(env.seq, t)
        for held in pending:
            received_at = held.env.received_at
            if state.heap and state.heap[0].due <= received_at:
                expire_due(state, received_at, inner)
            # Not dead-lettered now (Changes speaks for the catalog event): wrong-scope
            # values are rejected one by one and show on the reporter instead.
            apply_event(state, held.event, held.event.host, received_at, inner,
                        strict_scope=False)
        for host in inner.hosts:
            stamp(state.hosts[host], inner)
        if inner.cluster:
            stamp(state.cluster, inner)
        acc.hosts |= inner.hosts
        acc.cluster = acc.cluster or inner.cluster
    else:
        for host, rec in state.hosts.items():
            if _recatalog(state, catalog, rec, old_lifetimes, cluster=False):
                stamp(rec, acc)
                acc.touch(host)
        if _recatalog(state, catalog, state.cluster, old_lifetimes, cluster=True):
            stamp(state.cluster, acc)
            acc.touch(None)
        rebuild_heap(state)
    expire_due(state, t, acc)
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
        # Newest batch first: a name a newer batch holds is shadowed in the older ones
        # (a partial report re-set it) and goes from them now, so that dropping it from
        # the newer batch below cannot bring the overwritten value back.
        seen: set[str] = set()
        for batch in reversed(rs.batches):
            values = batch.values  # (a copy: edited below, then put back)
            shadowed = seen.intersection(values)
            seen.update(values)
            for name in shadowed:
                del values[name]
                if batch.stale:
                    batch.stale.pop(name, None)
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
            batch.names, batch.vals = tuple(values), tuple(values.values())
            batch.keyset = frozenset(values)  # (not the plan's set of names)
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

