"""The pure fold: `state x event -> state` (`apply`) and `state x now -> state` (`expire`).

Where a report becomes a snapshot value — the path of one stored message:

1. `apply(state, env)` first runs expiry up to the message's receive time
   (`env.received_at`, the JetStream server timestamp), then parses the
   subject (cached per subject).
2. A report from a reporter the catalog knows is decoded by that reporter's
   typed decoder (`crr.projections.plan.ReporterPlan.decoder`); if every value
   it sets is one it owns, valid, the decode *was* the validation
   (`crr.projections.reports.apply_typed`, the fast validation; the hot path)
   and the report goes to the one store (`crr.projections.reports.store`).
3. Anything else is decoded once, generically (`_apply`), and dispatched on
   its type with `match` (`crr.projections.event_dispatch`): a report is checked
   value by value (`crr.projections.reports.apply_report`; rejected values are
   counted on the reporter with their reasons, the rest goes to the same
   store), an
   inventory or a health event updates its reporter; a catalog
   (`crr.projections.catalog_change`) or a forget instruction
   (`crr.projections.forgetting`) is applied here too.  What cannot be applied at
   all comes back as `Changes.deadletter` (a reason) for the projector to
   dead-letter.
4. Accepted values land in `crr.projections.state` as a `Batch` per report, and
   their deadlines go on the state's heap (`crr.projections.deadlines`); `expire`
   (`crr.projections.expiry`) turns them stale when they come due.
5. `crr.projections.record.snapshot.host_snapshot` / `cluster_snapshot` build the
   snapshot records (docs/contract.md, "Payloads") from the state; the projector publishes
   them for the records `Changes` names.

No IO, no clock, no logging: time comes only from `Envelope.received_at` or
the `now` passed to `expire`, so live projection and replay run this same
code and agree byte for byte.  Bad input never raises: an event that cannot
be applied leaves the state as it was, apart from `state.seq`.  The catalog
in force is compiled once into a frozen `crr.projections.plan.CatalogPlan`.
Semantics are docs/contract.md's "Subjects and streams", "Payloads" and "`resources.yaml`"; the
decisions where it is silent are written
beside the code that makes them.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Iterable
from typing import Final

from crr.projections.catalog_change import apply_catalog
from crr.projections.changes import Acc, Changes
from crr.projections.deadlines import push_record
from crr.projections.envelope import Envelope
from crr.projections.event_address import address
from crr.projections.event_dispatch import apply_event
from crr.projections.expiry import expire_due, push_refreshed
from crr.projections.forgetting import apply_forget
from crr.projections.plan import compile_plan
from crr.projections.reports import apply_typed, impostor
from crr.projections.state import Held, ProjectionState, Record, compact_heap
from crr.schemas.catalog import Catalog
from crr.schemas.codec import decode_event
from crr.schemas.errors import PayloadError
from crr.schemas.events import Health, Inventory, Report
from crr.schemas.subjects import (
    ADMIN_BRIDGE_PREFIX,
    ADMIN_HOST_PREFIX,
    CATALOG,
    DEADLETTER,
    EventAddress,
)

__all__ = ["Changes", "advance", "apply", "expire", "fold", "install", "next_deadline",
           "set_catalog"]
"""The fold's entry points; `Changes` (from `crr.projections.changes`) is what they answer."""

_EVENT_TYPES: Final[dict[str, type[Report | Inventory | Health]]] = {
    "report": Report, "inventory": Inventory, "health": Health}


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
            acc = Acc(env.seq, t)
            expire_due(state, t, acc)
    state.seq = env.seq
    addr = address(env.subject)
    # The common case, kept cheap: a report whose values its reporter owns, all valid.
    if (type(addr) is EventAddress and addr.kind == "report" and state.typed_validation
            and apply_typed(state, env, addr)):
        host = addr.host
        if acc is None:
            return _CLUSTER_CHANGED if host is None else _host_changed(host)
        acc.touch(host)
        return acc.result()
    if acc is None:
        acc = Acc(env.seq, t)
    reason = _apply(state, env, acc)
    return acc.result(reason)


def expire(state: ProjectionState, now: float) -> Changes:
    """Turn every value, inventory and reporter whose deadline is `<= now` stale or silent."""
    acc = Acc()
    expire_due(state, now, acc)
    return acc.result()


def next_deadline(state: ProjectionState) -> float | None:
    """When `expire` next has something to do (None: nothing pending)."""
    # Entries whose report was entirely overwritten, or refreshed since, would do nothing.
    push_refreshed(state)
    return state.heap[0].due if state.heap else None


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


def _apply(state: ProjectionState, env: Envelope, acc: Acc) -> str | None:
    """Every event but a report the fast validation passed: decoded here once, then
    dispatched on what it is; returns a dead-letter reason or None."""
    subject = env.subject
    if subject == CATALOG:
        return apply_catalog(state, env, acc)
    if subject == DEADLETTER:
        return None  # the projector's own output, captured by CRR_EVENTS: nothing to fold
    if subject.startswith(ADMIN_HOST_PREFIX):
        return apply_forget(state, env, acc)
    if subject.startswith(ADMIN_BRIDGE_PREFIX):
        return None  # a bridge's instruction (`crr bridge release`): for the bridge and the record
    addr = address(subject)
    if isinstance(addr, str):
        return addr
    try:
        event = decode_event(env.data, _EVENT_TYPES[addr.kind])
    except PayloadError as exc:
        return exc.message
    if event.reporter != addr.reporter or event.host != addr.host:
        return impostor(event.reporter, event.host, addr)
    if state.catalog is None:
        # Nothing can be validated yet: keep the latest per subject until a catalog arrives.
        state.pending[subject] = Held(env, event)
        return None
    return apply_event(state, event, addr.host, env.received_at, acc, strict_scope=True)


# -- restoring (crr.projections.checkpoint) ------------------------------------------


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
    push_record(state, host, rec)


def advance(state: ProjectionState, env: Envelope) -> Changes:
    """Pass over an event without applying it (a restored record already reflects it):
    expiry up to its receive time runs, and the position moves, as `apply` would."""
    acc = Acc(env.seq, env.received_at)
    if state.heap and state.heap[0].due <= env.received_at:
        expire_due(state, env.received_at, acc)
    state.seq = env.seq
    return acc.result()
