"""Restoring the fold state from the snapshot records: the snapshot is the checkpoint.

Pure: no IO.  A `HostSnapshot`/`ClusterSnapshot` written by this version
carries, beside what readers use, everything the fold needs to go on as if
it had never stopped (docs/contract.md, "Payloads"): the exact float times (`*_ts`), stale
values' `last_value` and `stale_since`, each reporter's `first_seen_ts`,
`silent`, `rejected_total` and `missing`.  `record_of` turns one record back
into the fold's `Record`; `restore` builds a whole `ProjectionState`.

What is not kept is what no output depends on: a value's entry is the
newest report holding its name, so the restored batches hold only current
entries (grouped by report: same receive time and `observed_at`), and the
deadline heap is rebuilt from them.  `state -> records -> restored state`
then gives the same records for any later events (tests/projections/test_checkpoint.py
checks it with hypothesis).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from typing import Any

import msgspec

from crr.projections.fold import install, set_catalog
from crr.projections.state import Batch, InventorySlot, ProjectionState, Record, ReporterRecord
from crr.schemas.catalog import Catalog
from crr.schemas.errors import CrrError, SubjectError
from crr.schemas.snapshot import ReporterStatus
from crr.schemas.snapshot_views import CheckpointRecord, DueRecord
from crr.schemas.subjects import CATALOG, parse_event_subject, parse_forget_subject


class CheckpointError(CrrError, ValueError):
    """A snapshot record that cannot be restored from (older writer, inconsistent)."""


decode_record = msgspec.json.Decoder(CheckpointRecord).decode
"""The `CheckpointRecord` of an encoded host or cluster record (msgspec errors if not one)."""


def _reporter(name: str, st: ReporterStatus, held: set[str]) -> ReporterRecord:
    if st.first_seen_ts is None:
        raise CheckpointError(f"reporter {name!r} has no first_seen_ts (an older writer)")
    overdue = {n for n in st.missing if n not in held}
    return ReporterRecord(
        first_seen=st.first_seen_ts, state=st.state, since=st.since_ts,
        last_report_at=st.last_report_ts, rejected=st.rejected, rejections=list(st.rejections),
        health=st.health, detail=st.detail, exit_code=st.exit_code, boot=st.boot,
        silent=st.silent, rejected_total=st.rejected_total, overdue=overdue or None)


def record_of(snap: CheckpointRecord) -> Record:
    """The fold's record of one snapshot record (CheckpointError if it cannot be)."""
    if snap.as_of.ts is None:
        raise CheckpointError("as_of has no ts (an older writer)")
    groups: dict[str, dict[tuple[float, str], Batch]] = {}
    held: dict[str, set[str]] = {}
    fast = _one_batch(snap)
    if fast is not None:
        reporter, one = fast
        groups[reporter] = {(one.received_at, one.observed_at): one}
        held[reporter] = set(one.keyset)
    grouped: dict[tuple[str, tuple[float, str]], dict[str, Any]] = {}  # each batch's values
    for name, v in snap.values.items() if fast is None else ():
        if v.received_ts is None or v.expires_ts is None:
            raise CheckpointError(f"value {name!r} has no received_ts/expires_ts")
        key = (v.received_ts, v.observed_at)
        by_key = groups.setdefault(v.reporter, {})
        batch: Batch | None = by_key.get(key)
        if batch is None:
            batch = by_key[key] = Batch((), (), v.observed_at, v.received_ts, frozenset())
            grouped[v.reporter, key] = {}
        values = grouped[v.reporter, key]
        if v.state == "stale":
            values[name] = v.last_value
            if batch.stale is None:
                batch.stale = {}
            batch.stale[name] = v.expires_ts
        else:
            values[name] = v.value
        held.setdefault(v.reporter, set()).add(name)
    for (reporter, key), values in grouped.items():
        batch = groups[reporter][key]
        batch.names = tuple(sorted(values))  # (a batch's names in name order)
        batch.vals = tuple(values[n] for n in batch.names)
        batch.keyset = frozenset(batch.names)
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


def _one_batch(snap: CheckpointRecord) -> tuple[str, Batch] | None:
    """The common case in one go: every value fresh, from one report of one reporter."""
    values = snap.values
    if not values:
        return None
    entries = values.values()
    first = next(iter(entries))
    if first.received_ts is None or first.expires_ts is None:
        return None
    if len({(v.reporter, v.received_ts, v.observed_at, v.state == "stale",
             v.expires_ts is None) for v in entries}) != 1 or first.state == "stale":
        return None
    names = tuple(sorted(values))
    return first.reporter, Batch(names, tuple(values[n].value for n in names),
                                 first.observed_at, first.received_ts, frozenset(names))


def place(state: ProjectionState, host: str | None, snap: CheckpointRecord) -> None:
    """Install one restored record into `state` (replacing what it held for `host`)."""
    rec = record_of(snap)
    lifetimes = state.plan.lifetimes
    for rs in rec.reporters.values():
        for b in rs.batches:
            if b.keyset <= lifetimes.keys():
                continue
            unknown = [n for n in b.keyset if n not in lifetimes]
            if unknown:
                raise CheckpointError(f"record of {host or '(cluster)'} holds {unknown[0]!r}, "
                                      "which the catalog it was folded with does not declare")
    install(state, host, rec)


def restore(catalog: Catalog, catalog_seq: int, seq: int, records: Iterable[CheckpointRecord],
            ) -> ProjectionState:
    """The fold state the records (host records and maybe the cluster's) describe, at
    `CRR_EVENTS` sequence `seq`."""
    state = ProjectionState()
    set_catalog(state, catalog, catalog_seq)
    state.seq = seq
    for snap in records:
        place(state, snap.host, snap)
    return state


Restorable = tuple[str | None, CheckpointRecord]
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


# -- lazy restore: a host's record is placed when something first needs it ---------------


_decode_due = msgspec.json.Decoder(DueRecord).decode


def earliest_due(state: ProjectionState, data: bytes) -> tuple[str | None, int, float]:
    """(host, `as_of.seq`, a time no later than the first deadline still pending in the
    record).

    Exact for values, inventories, silence and the declared resources never
    reported (the reporter's first sight + the shortest lifetime of those).
    Reads only the times (a cheap decode); msgspec errors if `data` is not a
    record, CheckpointError if it lacks the times.
    """
    rec = _decode_due(data)
    if rec.as_of.ts is None:
        raise CheckpointError("as_of has no ts (an older writer)")
    scope = "cluster" if rec.host is None else "host"
    values = rec.values.values()
    fresh = [v.expires_ts for v in values if v.state != "stale"]
    if None in fresh:
        raise CheckpointError("a value has no expires_ts (an older writer)")
    due = min((t for t in fresh if t is not None), default=math.inf)
    # The names each reporter holds a value of, fresh or stale.  A stale value is also in
    # its reporter's `missing`, so these are sets, not counts: counting it twice hid a
    # declared resource never reported, and the record was placed after it went overdue.
    held: dict[str, set[str]] = {}
    if len(rec.reporters) == 1:
        held[next(iter(rec.reporters))] = set(rec.values)
    else:
        for n, v in rec.values.items():
            held.setdefault(v.reporter, set()).add(n)
    for inv in rec.inventory.values():
        if inv.state != "stale" and inv.expires_ts is not None:
            due = min(due, inv.expires_ts)
    lifetimes = state.plan.lifetimes
    for name, r in rec.reporters.items():
        if r.first_seen_ts is None:
            raise CheckpointError(f"reporter {name!r} has no first_seen_ts (an older writer)")
        if not r.silent:
            start = r.last_report_ts if r.last_report_ts is not None else r.first_seen_ts
            due = min(due, start + state.plan.reporter_lifetime(name))
        declared = state.plan.declared(name, scope)
        if declared:
            known = held.get(name, set())
            known.update(r.missing)
            never = [lifetimes[n] for n in declared if n not in known]
            if never:  # declared, never reported, not overdue yet: it comes due then
                due = min(due, r.first_seen_ts + min(never))
    return rec.host, rec.as_of.seq, due


class Lazy:
    """Host records restored on first need rather than all at start (a fast restart).

    Restoring a record is exact whenever it happens, as long as it happens
    before anything of that host changes: before an event of the host is
    applied (`before`), before a catalog event (every record then), and no
    later than its first pending deadline (`due`).  Until then the record in
    CRR_SNAPSHOT is what it would be anyway.

    A record added with a bound (`exact=False`: the status's `next_due_ts`,
    no later than any record's first deadline) is not read at all until that
    bound comes: then its own first deadline is read (`earliest_due`) and it
    waits on for that, or is placed.  `refine` reads those first deadlines a
    few at a time beforehand (the projector does, after it is ready), so that
    the bound does not come with all of them to read at once.  `upto`: the
    sequence the restore starts
    from; a record placed from here must not reflect a later event (nor name
    another host), or CheckpointError.
    """

    def __init__(self, upto: int | None = None) -> None:
        self._raw: dict[str, bytes] = {}
        self._heap: list[tuple[float, str]] = []
        self._when: dict[str, float] = {}
        """Each waiting host's entry in the heap (others are left-overs, skipped); a
        waiting host without one is bounded (`_bound`)."""
        self._unrefined: list[str] = []
        """Bounded hosts not read yet (some may be placed or read by now)."""
        self._bound = math.inf
        """No bounded record's first deadline comes before this."""
        self._upto = upto

    def add(self, host: str, data: bytes, due: float, *, exact: bool = True) -> None:
        """A host record to place later (`due`: see `earliest_due`, or a bound on it when
        not `exact`)."""
        if not exact:
            self.add_bounded([(host, data)], due)
            return
        self._raw[host] = data
        self._when[host] = due
        heapq.heappush(self._heap, (due, host))

    def add_bounded(self, records: Iterable[tuple[str, bytes]], bound: float) -> None:
        """Host records (host, bytes) not read now: none has a deadline before `bound`."""
        hosts = dict(records)
        self._raw.update(hosts)
        self._unrefined.extend(hosts)
        if hosts:
            self._bound = min(self._bound, bound)

    def __len__(self) -> int:
        return len(self._raw)

    @property
    def next_due(self) -> float | None:
        """When `due` next has something to place (None: nothing left)."""
        if not self._raw:
            return None
        heap = self._heap
        when = self._when
        if len(heap) > 2 * len(when) + 64:  # many were placed early: compact
            self._heap = heap = [(d, h) for d, h in heap if when.get(h) == d]
            heapq.heapify(heap)
        while heap and when.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        top = heap[0][0] if heap else None
        if self._unrefined:
            top = self._bound if top is None else min(top, self._bound)
        return top

    @property
    def unrefined(self) -> int:
        """Bounded records whose own first deadline is not read yet (an upper bound)."""
        return len(self._unrefined)

    def refine(self, state: ProjectionState, limit: int) -> None:
        """Read the first deadline of up to `limit` bounded records (see the class doc).
        CheckpointError (or a msgspec error) for a record that is not one."""
        todo = self._unrefined
        raw = self._raw
        when = self._when
        while todo and limit > 0:
            host = todo.pop()
            data = raw.get(host)
            if data is None or host in when:
                continue
            limit -= 1
            _, _, first = earliest_due(state, data)
            when[host] = first
            heapq.heappush(self._heap, (first, host))
        if not todo:
            self._bound = math.inf

    def take(self, state: ProjectionState, host: str) -> bool:
        """Place `host`'s record now if it is still waiting; whether it was.
        CheckpointError (or a msgspec error) if the record does not restore."""
        data = self._raw.pop(host, None)
        if data is None:
            return False
        self._when.pop(host, None)
        snap = decode_record(data)
        if snap.host != host:
            raise CheckpointError(f"the record of {host!r} names host {snap.host!r}")
        if self._upto is not None and snap.as_of.seq > self._upto:
            raise CheckpointError(f"the record of {host!r} reflects seq {snap.as_of.seq}, "
                                  f"past the status's {self._upto}")
        place(state, host, snap)
        return True

    def due(self, state: ProjectionState, now: float) -> None:
        """Place every record whose first deadline is `<= now` (the bounded ones are read
        first when their bound has come)."""
        if self.next_due is None:
            return
        if self._unrefined and self._bound <= now:
            self.refine(state, len(self._unrefined))
        heap = self._heap
        when = self._when
        while heap and heap[0][0] <= now:
            d, host = heapq.heappop(heap)
            if when.get(host) == d:
                self.take(state, host)

    def before(self, state: ProjectionState, subject: str, received_at: float) -> None:
        """Place what an event on `subject` (as published) received at `received_at`
        needs in place first."""
        if subject == CATALOG:
            self.everything(state)
            return
        try:
            # A forget instruction needs its host in place too, or the fold would drop
            # nothing and the host's restored record would come back later.
            host = parse_forget_subject(subject) or parse_event_subject(subject)[2]
        except SubjectError:
            host = None
        if host is not None and host in self._raw:
            self.take(state, host)
        if (self._heap and self._heap[0][0] <= received_at) or (
                self._unrefined and self._bound <= received_at):
            self.due(state, received_at)

    def everything(self, state: ProjectionState) -> None:
        """Place every record still waiting."""
        for host in list(self._raw):
            self.take(state, host)
        self._heap.clear()
        self._when.clear()
        self._unrefined.clear()
        self._bound = math.inf
