"""Restoring the fold state from the snapshot records: the snapshot is the checkpoint.

Pure: no IO.  A `HostSnapshot`/`ClusterSnapshot` written by this version
carries, beside what readers use, everything the fold needs to go on as if
it had never stopped (DESIGN §4): the exact float times (`*_ts`), stale
values' `last_value` and `stale_since`, each reporter's `first_seen_ts`,
`silent`, `rejected_total` and `missing`.  `record_of` turns one record back
into the fold's `Record`; `restore` builds a whole `ProjectionState`.

What is not kept is what no output depends on: a value's entry is the
newest report holding its name, so the restored batches hold only current
entries (grouped by report: same receive time and `observed_at`), and the
deadline heap is rebuilt from them.  `state -> records -> restored state`
then gives the same records for any later events (tests/test_checkpoint.py
checks it with hypothesis).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from projections.fold import install, set_catalog
from projections.state import Batch, InventorySlot, ProjectionState, Record, ReporterRecord
from schemas.catalog import Catalog
from schemas.errors import CrrError
from schemas.snapshot import ClusterSnapshot, HostSnapshot, ReporterStatus


class CheckpointError(CrrError, ValueError):
    """A snapshot record that cannot be restored from (older writer, inconsistent)."""


def _reporter(name: str, st: ReporterStatus, held: set[str]) -> ReporterRecord:
    if st.first_seen_ts is None:
        raise CheckpointError(f"reporter {name!r} has no first_seen_ts (an older writer)")
    overdue = {n for n in st.missing if n not in held}
    return ReporterRecord(
        first_seen=st.first_seen_ts, state=st.state, since=st.since_ts,
        last_report_at=st.last_report_ts, rejected=st.rejected, rejections=list(st.rejections),
        health=st.health, detail=st.detail, exit_code=st.exit_code, boot=st.boot,
        silent=st.silent, rejected_total=st.rejected_total, overdue=overdue or None)


def record_of(snap: HostSnapshot | ClusterSnapshot) -> Record:
    """The fold's record of one snapshot record (CheckpointError if it cannot be)."""
    if snap.as_of.ts is None:
        raise CheckpointError("as_of has no ts (an older writer)")
    groups: dict[str, dict[tuple[float, str], Batch]] = {}
    held: dict[str, set[str]] = {}
    for name, v in snap.values.items():
        if v.received_ts is None or v.expires_ts is None:
            raise CheckpointError(f"value {name!r} has no received_ts/expires_ts")
        key = (v.received_ts, v.observed_at)
        by_key = groups.setdefault(v.reporter, {})
        batch = by_key.get(key)
        if batch is None:
            values: dict[str, Any] = {}
            batch = by_key[key] = Batch(values, v.observed_at, v.received_ts, values.keys())
        assert batch.values is not None
        if v.state == "stale":
            batch.values[name] = v.last_value
            if batch.stale is None:
                batch.stale = {}
            batch.stale[name] = v.expires_ts
        else:
            batch.values[name] = v.value
        held.setdefault(v.reporter, set()).add(name)
    rec = Record(as_seq=snap.as_of.seq, as_time=snap.as_of.ts)
    for name, st in snap.reporters.items():
        rs = _reporter(name, st, held.get(name, set()))
        rs.batches = sorted(groups.pop(name, {}).values(), key=lambda b: b.received_at)
        rec.reporters[name] = rs
    if groups:
        raise CheckpointError(f"values of reporter(s) {sorted(groups)} with no reporter status")
    for name, inv in snap.inventory.items():
        if inv.received_ts is None or inv.expires_ts is None:
            raise CheckpointError(f"inventory {name!r} has no received_ts/expires_ts")
        if name not in rec.reporters:
            raise CheckpointError(f"inventory of {name!r} with no reporter status")
        rec.inventory[name] = InventorySlot(
            pool=inv.pool, devices=list(inv.devices), observed_at=inv.observed_at,
            received_at=inv.received_ts, expires_at=inv.expires_ts, stale=inv.state == "stale")
    return rec


def place(state: ProjectionState, host: str | None, snap: HostSnapshot | ClusterSnapshot) -> None:
    """Install one restored record into `state` (replacing what it held for `host`)."""
    rec = record_of(snap)
    for rs in rec.reporters.values():
        for b in rs.batches:
            unknown = [n for n in b.keyset if n not in state.lifetimes]
            if unknown:
                raise CheckpointError(f"record of {host or '(cluster)'} holds {unknown[0]!r}, "
                                      "which the catalog it was folded with does not declare")
    install(state, host, rec)


def restore(catalog: Catalog, catalog_seq: int, seq: int, hosts: Iterable[HostSnapshot],
            cluster: ClusterSnapshot | None) -> ProjectionState:
    """The fold state the records describe, at `CRR_EVENTS` sequence `seq`."""
    state = ProjectionState()
    set_catalog(state, catalog, catalog_seq)
    state.seq = seq
    for snap in hosts:
        place(state, snap.host, snap)
    if cluster is not None:
        place(state, None, cluster)
    return state


Restorable = tuple[str | None, HostSnapshot | ClusterSnapshot]
"""(host or None for the cluster, its record)."""


class Deferred:
    """Records written after the status the restore starts from (a flush cut short).

    Such a record already reflects the events of its host up to its `as_of.seq`
    (a record is stamped by every event that changes it).  The events after the
    status are folded again from the stream, so each of these records is put in
    place once the fold has passed its `as_of.seq`, replacing what the events
    up to there rebuilt for that host: nothing is applied twice, nothing lost.
    """

    def __init__(self, records: Iterable[Restorable]) -> None:
        self._items = sorted(records, key=lambda r: (r[1].as_of.seq, r[0] or ""))

    def __len__(self) -> int:
        return len(self._items)

    @property
    def next_seq(self) -> int | None:
        """`as_of.seq` of the next record to place (None: none left)."""
        return self._items[0][1].as_of.seq if self._items else None

    def place_before(self, state: ProjectionState, seq: int) -> list[str | None]:
        """Place every record whose `as_of.seq` is below `seq` (about to be applied); the
        hosts placed (None: the cluster).  CheckpointError as `place`."""
        placed: list[str | None] = []
        while self._items and self._items[0][1].as_of.seq < seq:
            host, snap = self._items.pop(0)
            place(state, host, snap)
            placed.append(host)
        return placed

    def place_rest(self, state: ProjectionState) -> list[str | None]:
        """Place what is left (the stream holds nothing more to fold first)."""
        placed: list[str | None] = []
        while self._items:
            host, snap = self._items.pop(0)
            place(state, host, snap)
            placed.append(host)
        return placed
