"""The host and cluster records as `crr.schemas.snapshot` Structs, built from a fold's state.

`host_snapshot` / `cluster_snapshot` are the reference writer of the
`crr.v1.snapshot.host.<host>` and `crr.v1.snapshot.cluster` records (docs/contract.md,
"Payloads"): what the projector writes is their encoding, byte for byte
(`crr.projections.record.body` builds those bytes with less work).  Readers
decode them with `crr.schemas.codec.DECODERS`.  A deterministic function of the
state: no clock, and dict order never leaks (the codec sorts keys).
"""

from __future__ import annotations

import functools
from typing import Any

from crr.projections.state import InventorySlot, ProjectionState, Record, ReporterRecord
from crr.schemas.snapshot import (
    AsOf,
    ClusterSnapshot,
    HostSnapshot,
    InventoryEntry,
    ReporterStatus,
    ValueEntry,
)
from crr.schemas.wire_time import format_time


@functools.lru_cache(maxsize=1 << 14)
def fmt(t: float) -> str:
    """`format_time`, cached (a batch's times repeat across its entries and records)."""
    return format_time(t)


def value_entries(state: ProjectionState, rec: Record) -> dict[str, ValueEntry]:
    """The `values` of a record: each name's entry from the newest batch holding it."""
    out: dict[str, ValueEntry] = {}
    lifetimes = state.plan.lifetimes
    for reporter, rs in rec.reporters.items():
        for b in rs.batches:  # oldest first: a newer batch's entry replaces an older one
            received = fmt(b.received_at)
            stale = b.stale
            expiry: dict[float, str] = {}  # lifetime -> expires_at (one per batch, mostly)
            for name, value in zip(b.names, b.vals, strict=True):
                since = stale.get(name) if stale else None
                if since is not None:
                    at = fmt(since)
                    out[name] = ValueEntry(
                        value=None, state="stale", reporter=reporter, observed_at=b.observed_at,
                        received_at=received, expires_at=at, last_value=value, stale_since=at,
                        received_ts=b.received_at, expires_ts=since)
                else:
                    life = lifetimes[name]
                    expires = expiry.get(life)
                    if expires is None:
                        expires = expiry[life] = fmt(b.received_at + life)
                    out[name] = ValueEntry(
                        value=value, state="unknown" if value is None else "fresh",
                        reporter=reporter, observed_at=b.observed_at, received_at=received,
                        expires_at=expires, received_ts=b.received_at,
                        expires_ts=b.received_at + life)
    return out


def _inventory_entry(reporter: str, inv: InventorySlot) -> InventoryEntry:
    expires = fmt(inv.expires_at)
    return InventoryEntry(pool=inv.pool, devices=inv.devices,
                          state="stale" if inv.stale else "fresh", reporter=reporter,
                          observed_at=inv.observed_at, received_at=fmt(inv.received_at),
                          expires_at=expires, stale_since=expires if inv.stale else None,
                          received_ts=inv.received_at, expires_ts=inv.expires_at)


def missing(state: ProjectionState, rs: ReporterRecord, reporter: str, scope: str) -> list[str]:
    """The declared resources of `reporter` it has not reported in time here, sorted.

    Stale ones, and those never reported that are past the reporter's first
    sight + their lifetime (`overdue`, kept by the expiry).  A value reported
    as null counts as reported (the reporter said it cannot tell).
    """
    declared = state.plan.declared(reporter, scope)
    if not declared:
        return []
    batches = rs.batches
    if not rs.overdue:
        for b in batches:
            if b.stale:
                break
        else:  # nothing stale, nothing overdue (the steady state, partial reports or not)
            return []
    current: dict[str, bool] = {}  # name -> stale, newest batch wins
    for b in batches:
        stale = b.stale
        for name in b.keyset:
            current[name] = stale is not None and name in stale
    overdue = rs.overdue or ()
    return sorted(n for n in declared
                  if current.get(n, False) or (n not in current and n in overdue))


def _reporter_status(state: ProjectionState, rs: ReporterRecord, reporter: str,
                     scope: str) -> ReporterStatus:
    return ReporterStatus(
        state=rs.state,  # type: ignore[arg-type]
        detail=rs.detail,
        since=fmt(rs.since) if rs.since is not None else None,
        last_report_at=fmt(rs.last_report_at) if rs.last_report_at is not None else None,
        rejected=rs.rejected,
        rejections=list(rs.rejections),
        exit_code=rs.exit_code,
        boot=rs.boot,
        health=rs.health,
        rejected_total=rs.rejected_total,
        missing=missing(state, rs, reporter, scope),
        silent=rs.silent,
        first_seen_ts=rs.first_seen,
        since_ts=rs.since,
        last_report_ts=rs.last_report_at,
    )


def record_parts(state: ProjectionState, rec: Record, scope: str, values: Any) -> dict[str, Any]:
    """The fields of a host or cluster record but its host, with `values` as given (the
    entries, or their encodings: `crr.projections.record.body`)."""
    return {
        "as_of": AsOf(seq=rec.as_seq, time=fmt(rec.as_time), ts=rec.as_time),
        "values": values,
        "inventory": {r: _inventory_entry(r, i) for r, i in rec.inventory.items()},
        "reporters": {r: _reporter_status(state, s, r, scope)
                      for r, s in rec.reporters.items()},
    }


def host_snapshot(state: ProjectionState, host: str) -> HostSnapshot:
    """The `crr.v1.snapshot.host.<host>` record; KeyError if nothing was ever seen for `host`."""
    rec = state.hosts[host]
    return HostSnapshot(host=host, **record_parts(state, rec, "host", value_entries(state, rec)))


def cluster_snapshot(state: ProjectionState) -> ClusterSnapshot:
    """The `crr.v1.snapshot.cluster` record (cluster-scope values, inventories, reporters)."""
    rec = state.cluster
    return ClusterSnapshot(**record_parts(state, rec, "cluster", value_entries(state, rec)))


def host_names(state: ProjectionState) -> list[str]:
    """Every host the state knows, sorted."""
    return sorted(state.hosts)
