"""The projection state the fold mutates (the snapshot records are built from it elsewhere).

One `ProjectionState` is owned by one fold (the live projector, or a replay).
It holds only what the snapshot needs, in compact mutable records, plus the
compiled catalog it was folded with (`plan`, frozen: `crr.projections.plan`); the
records are built from it on demand (`crr.projections.record`: the wire Structs
by `record.snapshot`, the bytes the projector writes by `record.body` and
`record.columns`).  Everything here is a deterministic function of the
events applied and the `now`s passed to `expire`: no clock, no randomness,
and dict order never leaks (the codec encodes with sorted keys).

Layout, chosen for the hot path (one report of ~20 values, validated by a
typed msgspec decoder) and for memory (50k hosts x 20 values):

- a `Batch` is the values one report set (names and values, two tuples in name
  order), with its times; no per-value objects, no dict per report.  A
  reporter's batches on a host are kept oldest first;
  a value's current entry is the newest batch holding its name, and a batch
  whose names a later report all re-set is dropped (`dead`).  `expires_at`
  is derived (`received_at` + the catalog's lifetime), so a catalog change
  moves it without touching the batches;
- a stale value stays in its batch (the snapshot shows it as `last_value`),
  with its `stale_since` in `Batch.stale`;
- the deadline heap holds `Deadline`s (due, counter, host, reporter, batch);
  entries are deleted lazily: when one comes due the fold settles that
  (host, reporter) at the current time; entries of dead batches are skipped,
  and the entry of a batch refreshed in place since (`Batch.due` later than
  the entry's) is pushed again at its new time.
"""

from __future__ import annotations

import heapq
from collections.abc import Set as AbstractSet
from typing import Any

import msgspec

from crr.projections.envelope import Envelope
from crr.projections.plan import EMPTY_PLAN, CatalogPlan
from crr.schemas.catalog import Catalog
from crr.schemas.events import Device, Health, Inventory, Pool, Report

LIFECYCLE_STATES = frozenset({
    "failed", "timeout", "bad_output", "crashed", "quarantined", "restarting",
    "not_applicable", "stopped", "held", "holding",
})
"""Health states that win over the projector's own findings (`silent`, `rejecting`)."""

MAX_REJECTIONS = 10
"""Reasons kept per reporter for its last report."""

HEAP_FLOOR = 4096
"""`ProjectionState.heap_limit` never goes below this (small heaps are not compacted)."""


class Batch(msgspec.Struct, gc=False):
    """The values one report set on a host, with that report's times (never in a cycle).

    Its values are two tuples, `names` and `vals` (no dict per report: a report of
    every resource its reporter owns shares the plan's `names` and stores the typed
    decode's `msgspec.structs.astuple`); `values` is the dict of them."""

    names: tuple[str, ...]
    """The names it holds, in name order (the order the encoder sorts keys in:
    `crr.projections.record.body` joins them as they come)."""
    vals: tuple[Any, ...]
    """Canonical values accepted from the report (None: unknown), one per `names`."""
    observed_at: str
    received_at: float
    keyset: AbstractSet[str]
    """The names this batch holds as a set: for a report of every resource its reporter
    owns the plan's set of them (`crr.projections.plan.ReporterPlan.keyset`)."""
    stale: dict[str, float] | None = None
    """Names of this batch that went stale, with their `stale_since`."""
    dead: bool = False
    """True once later reports of the same reporter overwrote every value of this one."""
    due: float = 0.0
    """When all its values come due, if one heap entry settles them (its reporter's values
    share one lifetime), else 0.  A report that re-sets the same values refreshes the
    batch in place (`crr.projections.reports`) and moves `due` later without a new entry:
    the entry, popped before `due`, is pushed again at `due` (`crr.projections.expiry`)."""

    def kill(self) -> None:
        """Mark it overwritten and let go of its values.

        Its deadline entries stay in the heap until they come due (lazy
        deletion) and are skipped there; without its values a dead batch
        costs ~100 B instead of ~1 KB, so memory no longer grows with
        report rate x lifetime (at 20k reports/s x 15 s, ~250k dead batches).
        """
        self.dead = True
        self.names = self.vals = ()
        self.stale = None
        self.keyset = _NO_NAMES

    @property
    def values(self) -> dict[str, Any]:
        """name -> canonical value, in name order (a new dict: edit `names`/`vals`)."""
        return dict(zip(self.names, self.vals, strict=True))


_NO_NAMES: AbstractSet[str] = frozenset()
"""A dead batch's names (shared: a dead batch is never edited)."""


class InventorySlot(msgspec.Struct):
    """A reporter's inventory on a host or the cluster."""

    pool: Pool
    devices: list[Device]
    observed_at: str
    received_at: float
    expires_at: float
    stale: bool = False


class ReporterRecord(msgspec.Struct):
    """A reporter's status on a host or the cluster (see `ReporterStatus`)."""

    first_seen: float
    state: str = "ok"
    since: float | None = None
    last_report_at: float | None = None
    rejected: int = 0
    rejections: list[str] = msgspec.field(default_factory=list)
    health: str | None = None
    detail: str | None = None
    exit_code: int | None = None
    boot: str | None = None
    silent: bool = False
    rejected_total: int = 0
    """Values (and inventories) rejected since the reporter's first event here."""
    overdue: set[str] | None = None
    """Declared resources never reported here that are past `first_seen` + their lifetime."""
    batches: list[Batch] = msgspec.field(default_factory=list)
    """Batches still holding a current value, oldest first; a newer one shadows an older one."""

    def silence_start(self) -> float:
        """When the silence clock started: the last report or inventory, else first sight."""
        return self.last_report_at if self.last_report_at is not None else self.first_seen

    def compute_state(self) -> str:
        """The status by precedence: lifecycle health, then silent, then rejecting, then ok."""
        if self.health in LIFECYCLE_STATES:
            return self.health
        if self.silent:
            return "silent"
        if self.rejected:
            return "rejecting"
        return "ok"

    def restate(self, at: float) -> bool:
        """Recompute `state`; stamp `since` with `at` when it changed.  True if it changed."""
        new = self.compute_state()
        if new == self.state and self.since is not None:
            return False
        self.state = new
        self.since = at
        return True


class Record(msgspec.Struct):
    """Everything known about one host (or the cluster)."""

    inventory: dict[str, InventorySlot] = msgspec.field(default_factory=dict)
    reporters: dict[str, ReporterRecord] = msgspec.field(default_factory=dict)
    as_seq: int = 0
    as_time: float = 0.0


class Deadline(msgspec.Struct, order=True, frozen=True, gc=False):
    """An entry of the deadline heap: at `due`, settle `reporter` on `host` (see the module doc).

    Entries order by (`due`, `counter`); `counter` is unique, so `host`,
    `reporter` and `batch` never take part in a comparison.
    """

    due: float
    counter: int
    """Tie-breaker: the order entries were pushed in."""
    host: str | None
    """None for the cluster."""
    reporter: str
    batch: Batch | None
    """The batch whose values come due (skipped if it died since); None: the reporter's
    silence, its inventory or its overdue resources."""


class ProjectionState:
    """The mutable state of one fold.  Create empty; feed it with `crr.projections.fold.apply`."""

    __slots__ = ("catalog_seq", "cluster", "counter", "heap", "heap_limit", "hosts", "pending",
                 "plan", "refresh_in_place", "seq", "typed_validation")

    def __init__(self, *, typed_validation: bool = True, refresh_in_place: bool = True) -> None:
        self.typed_validation: bool = typed_validation
        """A public switch: True (the default) puts the fast validation (one typed decode,
        `crr.projections.reports.apply_typed`) in front of the one store; False sends
        every report through the value-by-value check.  Both store the same: tests hold
        them equal (tests/projections/test_fold_properties.py)."""
        self.refresh_in_place: bool = refresh_in_place
        """A public switch: True (the default) lets a report that re-sets what its
        reporter's last report set refresh that batch in place, without a new heap
        entry; False gives every report a batch and an entry of its own.  Both give the
        same records and deadlines: tests hold them equal."""
        self.plan: CatalogPlan = EMPTY_PLAN
        """The catalog in force, compiled (`crr.projections.plan`); replaced whole on a change."""
        self.catalog_seq: int = 0
        """`CRR_EVENTS` sequence of the catalog event that set `catalog`."""
        self.seq: int = 0
        """Last `CRR_EVENTS` sequence applied."""
        self.hosts: dict[str, Record] = {}
        self.cluster: Record = Record()
        self.heap: list[Deadline] = []
        self.heap_limit: int = HEAP_FLOOR
        """The heap's length that makes `compact_heap` drop the dead batches' entries."""
        self.counter: int = 0
        """The `counter` of the last `Deadline` pushed."""
        self.pending: dict[str, Held] = {}
        """Events that arrived before any catalog, decoded: the latest per subject."""

    @property
    def catalog(self) -> Catalog | None:
        """The catalog in force (None before the first catalog event)."""
        return self.plan.catalog

    def record(self, host: str | None) -> Record:
        """The record of `host` (the cluster record for None), created on first use."""
        if host is None:
            return self.cluster
        rec = self.hosts.get(host)
        if rec is None:
            rec = self.hosts[host] = Record()
        return rec


def compact_heap(state: ProjectionState) -> None:
    """Drop the deadline entries of dead batches (which expiry would skip) from the heap.

    Lazy deletion leaves an overwritten batch's entry in the heap until it comes
    due: with reports every `interval` and a lifetime of several intervals the
    heap holds several dead entries (each with its ~100 B batch) per live one,
    and memory grows with report rate x lifetime (measured: +2.5 MB/s at 5-7k
    reports/s with a 120 s interval, 950 MB after a 3-minute ramp).  Run when the
    heap reaches `heap_limit`, which it then sets to twice what is left, so the
    O(n) pass costs O(1) per push; what expiry does, and when, is unchanged.
    """
    heap = state.heap
    heap[:] = [e for e in heap if (b := e.batch) is None or not b.dead]
    heapq.heapify(heap)
    state.heap_limit = max(HEAP_FLOOR, 2 * len(heap))


class Held(msgspec.Struct, frozen=True, gc=False):
    """An event held for want of a catalog, with its decoded payload (decoded once)."""

    env: Envelope
    event: Report | Inventory | Health
