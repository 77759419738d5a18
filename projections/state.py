"""The projection state the fold mutates, and the snapshot records built from it.

One `ProjectionState` is owned by one fold (the live projector, or a replay).
It holds only what the snapshot needs, in compact mutable records, plus the
compiled catalog it was folded with (`plan`, frozen: `projections.plan`); the wire
Structs of `schemas.snapshot` are built on demand by `host_snapshot` and
`cluster_snapshot`.  Everything here is a deterministic function of the
events applied and the `now`s passed to `expire`: no clock, no randomness,
and dict order never leaks (the codec encodes with sorted keys).

Layout, chosen for the hot path (one report of ~20 values, validated by a
typed msgspec decoder) and for memory (50k hosts x 20 values):

- a `Batch` is the dict of values one report set, with its times; no
  per-value objects.  A reporter's batches on a host are kept oldest first;
  a value's current entry is the newest batch holding its name, and a batch
  whose names a later report all re-set is dropped (`dead`).  `expires_at`
  is derived (`received_at` + the catalog's lifetime), so a catalog change
  moves it without touching the batches;
- a stale value stays in its batch (the snapshot shows it as `last_value`),
  with its `stale_since` in `Batch.stale`;
- the deadline heap holds `Deadline`s (due, counter, host, reporter, batch);
  entries are deleted lazily: when one comes due the fold settles that
  (host, reporter) at the current time; entries of dead batches are skipped.
"""

from __future__ import annotations

import functools
import heapq
import json
import operator
from collections.abc import Set as AbstractSet
from typing import Any

import msgspec

from projections.envelope import Envelope
from projections.plan import EMPTY_PLAN, CatalogPlan
from schemas.catalog import Catalog
from schemas.codec import encode
from schemas.events import Device, Health, Inventory, Pool, Report
from schemas.snapshot import (
    AsOf,
    ClusterSnapshot,
    HostSnapshot,
    InventoryEntry,
    ReporterStatus,
    ValueEntry,
)
from schemas.snapshot_lean import COLUMNS_MAX, columns_of
from schemas.wire_time import format_time

LIFECYCLE_STATES = frozenset({
    "failed", "timeout", "bad_output", "crashed", "quarantined", "restarting",
    "not_applicable", "stopped",
})
"""Health states that win over the projector's own findings (`silent`, `rejecting`)."""

MAX_REJECTIONS = 10
"""Reasons kept per reporter for its last report."""

HEAP_FLOOR = 4096
"""`ProjectionState.heap_limit` never goes below this (small heaps are not compacted)."""


class Batch(msgspec.Struct, gc=False):
    """The values one report set on a host, with that report's times (never in a cycle).

    Either `values` (a dict) or, for a report that set every resource its
    reporter owns, `full` (the typed struct as decoded, its fields in the
    order of `order`): no per-value work on the hot path.  `items()` gives
    the dict either way.
    """

    values: dict[str, Any] | None
    """Canonical values accepted from the report (None: unknown), unless `full` is set."""
    observed_at: str
    received_at: float
    keyset: AbstractSet[str]
    """The names this batch holds."""
    full: Any = None
    order: tuple[str, ...] = ()
    stale: dict[str, float] | None = None
    """Names of this batch that went stale, with their `stale_since`."""
    dead: bool = False
    """True once later reports of the same reporter overwrote every value of this one."""

    def items(self) -> dict[str, Any]:
        """name -> canonical value."""
        if self.values is not None:
            return self.values
        return dict(zip(self.order, msgspec.structs.astuple(self.full), strict=True))

    def kill(self) -> None:
        """Mark it overwritten and let go of its values.

        Its deadline entries stay in the heap until they come due (lazy
        deletion) and are skipped there; without its values a dead batch
        costs ~100 B instead of ~1 KB, so memory no longer grows with
        report rate x lifetime (at 20k reports/s x 15 s, ~250k dead batches).
        """
        self.dead = True
        self.values = None
        self.full = None
        self.stale = None
        self.keyset = frozenset()

    def materialise(self) -> dict[str, Any]:
        """Turn a `full` batch into a dict batch (before it is edited); the dict."""
        if self.values is None:
            self.values = self.items()
            self.full = None
            self.keyset = self.values.keys()
        return self.values


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
    """The mutable state of one fold.  Create empty; feed it with `projections.fold.apply`."""

    __slots__ = ("catalog_seq", "cluster", "counter", "heap", "heap_limit", "hosts", "pending",
                 "plan", "seq")

    def __init__(self) -> None:
        self.plan: CatalogPlan = EMPTY_PLAN
        """The catalog in force, compiled (`projections.plan`); replaced whole on a change."""
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


@functools.lru_cache(maxsize=1 << 14)
def _fmt(t: float) -> str:
    return format_time(t)


def _values(state: ProjectionState, rec: Record) -> dict[str, ValueEntry]:
    out: dict[str, ValueEntry] = {}
    lifetimes = state.plan.lifetimes
    for reporter, rs in rec.reporters.items():
        for b in rs.batches:  # oldest first: a newer batch's entry replaces an older one
            received = _fmt(b.received_at)
            stale = b.stale
            expiry: dict[float, str] = {}  # lifetime -> expires_at (one per batch, mostly)
            for name, value in b.items().items():
                since = stale.get(name) if stale else None
                if since is not None:
                    at = _fmt(since)
                    out[name] = ValueEntry(
                        value=None, state="stale", reporter=reporter, observed_at=b.observed_at,
                        received_at=received, expires_at=at, last_value=value, stale_since=at,
                        received_ts=b.received_at, expires_ts=since)
                else:
                    life = lifetimes[name]
                    expires = expiry.get(life)
                    if expires is None:
                        expires = expiry[life] = _fmt(b.received_at + life)
                    out[name] = ValueEntry(
                        value=value, state="unknown" if value is None else "fresh",
                        reporter=reporter, observed_at=b.observed_at, received_at=received,
                        expires_at=expires, received_ts=b.received_at,
                        expires_ts=b.received_at + life)
    return out


_SENTINEL = "\x00crr:value\x00"
"""Stands for the value in an encoded entry that is split into its shared head and tail."""
_SENTINEL_JSON = encode(_SENTINEL)
_encode = msgspec.json.Encoder(order="sorted").encode
"""`schemas.codec.encode` without the call through it (the same settings: sorted keys)."""


def _encoded_values(state: ProjectionState, rec: Record,
                    scope: str) -> dict[str, msgspec.Raw] | msgspec.Raw:
    """`_values`, each entry already encoded: the projector's hot path (`host_record`).

    The fresh entries of one batch differ only in their value (and their lifetime),
    so each (batch, lifetime) is encoded once with a stand-in value and split around
    it; an entry is then that head + the encoded value + that tail.  Stale and
    unknown entries (rare) are encoded whole.  `tests/test_snapshot_encoding.py`
    checks the bytes against `encode(host_snapshot(...))`.
    """
    out: dict[str, msgspec.Raw] = {}
    lifetimes = state.plan.lifetimes
    raw = msgspec.Raw
    enc = _encode
    if len(rec.reporters) == 1:
        whole = _one_batch(state, rec, scope)
        if whole is not None:
            return whole
    for reporter, rs in rec.reporters.items():
        uniform = state.plan.uniform_life.get((reporter, scope))
        for b in rs.batches:  # oldest first: a newer batch's entry replaces an older one
            received = _fmt(b.received_at)
            stale = b.stale
            if b.full is not None and not stale and uniform is not None:
                # The steady state: a report of every value of its reporter, all fresh.
                values = msgspec.structs.astuple(b.full)
                if None not in values:
                    head, tail = _form(reporter, b, received, uniform)
                    out.update(zip(b.order, [raw(head + enc(v) + tail) for v in values],
                                   strict=True))
                    continue
            forms: dict[float, tuple[bytes, bytes]] = {}  # lifetime -> (head, tail)
            for name, value in b.items().items():
                since = stale.get(name) if stale else None
                if since is not None:
                    at = _fmt(since)
                    out[name] = raw(enc(ValueEntry(
                        value=None, state="stale", reporter=reporter, observed_at=b.observed_at,
                        received_at=received, expires_at=at, last_value=value, stale_since=at,
                        received_ts=b.received_at, expires_ts=since)))
                    continue
                life = lifetimes[name]
                if value is None:
                    out[name] = raw(enc(ValueEntry(
                        value=None, state="unknown", reporter=reporter,
                        observed_at=b.observed_at, received_at=received,
                        expires_at=_fmt(b.received_at + life), received_ts=b.received_at,
                        expires_ts=b.received_at + life)))
                    continue
                form = forms.get(life)
                if form is None:
                    form = forms[life] = _form(reporter, b, received, life)
                out[name] = raw(form[0] + enc(value) + form[1])
    return out


def _one_batch(state: ProjectionState, rec: Record, scope: str) -> msgspec.Raw | None:
    """The values object of a record whose one reporter's one batch set all its values,
    all fresh and known (a host's steady state), encoded in one piece; else None.

    Such a batch's names are in sorted order already (`order`), the order the
    encoder sorts keys in, so the entries are joined as they come."""
    ((reporter, rs),) = rec.reporters.items()
    if len(rs.batches) != 1:
        return None
    b = rs.batches[0]
    uniform = state.plan.uniform_life.get((reporter, scope))
    if b.full is None or b.stale or uniform is None:
        return None
    values = msgspec.structs.astuple(b.full)
    if None in values:
        return None
    n = len(values)
    if not n:
        return None
    head, tail = _form(reporter, b, _fmt(b.received_at), uniform)
    first, after = _joints(b.order, tail)
    # head.join: `{"a":` head v1 `},"b":` head v2 ... head vn `}}` (tail = `}`, say).
    parts = [first]
    parts += map(operator.add, map(_encode, values), after)
    return msgspec.Raw(head.join(parts))


@functools.lru_cache(maxsize=256)
def _joints(order: tuple[str, ...], tail: bytes) -> tuple[bytes, list[bytes]]:
    """What goes around the entries of a values object of the names `order` (sorted):
    `{"first":`, and after each value its entry's tail, then `,"next":` or the final `}`
    (once per reporter, catalog and entry tail)."""
    assert list(order) == sorted(order), "a full batch's names are sorted"
    keys = [_encode(name) + b":" for name in order]
    return b"{" + keys[0], [tail + b"," + k for k in keys[1:]] + [tail + b"}"]


def _form(reporter: str, b: Batch, received: str, life: float) -> tuple[bytes, bytes]:
    """(head, tail) of an encoded fresh entry of batch `b` with lifetime `life`: the
    entry of a value `v` is head + its encoding + tail (built from `_entry_frame`)."""
    p0, p1, p2, p3, p4, p5, tail = _entry_frame(reporter)
    expires = b.received_at + life
    head = b"".join((p0, _encode(_fmt(expires)), p1, _encode(expires), p2,
                     _encode(b.observed_at), p3, _encode(received), p4,
                     _encode(b.received_at), p5))
    return head, tail


_STAND_INS = ("\x00crr:expires_at\x00", -1.2345678901234567e-299, "\x00crr:observed_at\x00",
              "\x00crr:received_at\x00", -2.2345678901234567e-299)
"""Stand-ins for an entry's expires_at, expires_ts, observed_at, received_at and received_ts
(their fields in the order the encoder writes them: sorted keys), then the value."""


@functools.lru_cache(maxsize=1024)
def _entry_frame(reporter: str) -> tuple[bytes, ...]:
    """A fresh entry of `reporter` encoded with stand-ins, cut around them: seven pieces
    that `_form` joins with the encoded times (once per reporter name)."""
    e_at, e_ts, o_at, r_at, r_ts = _STAND_INS
    whole = _encode(ValueEntry(
        value=_SENTINEL, state="fresh", reporter=reporter, observed_at=o_at, received_at=r_at,
        expires_at=e_at, received_ts=r_ts, expires_ts=e_ts))
    pieces: list[bytes] = []
    for stand_in in _STAND_INS:  # (written before `reporter`: the first match is the field)
        before, found, whole = whole.partition(_encode(stand_in))
        assert found, "the entry's fields are encoded in the order of `_STAND_INS`"
        pieces.append(before)
    before, found, tail = whole.rpartition(_SENTINEL_JSON)  # `value`: the last field
    assert found, "an entry's value is where the stand-in was encoded"
    return (*pieces, before, tail)


def _inventory_entry(reporter: str, inv: InventorySlot) -> InventoryEntry:
    expires = _fmt(inv.expires_at)
    return InventoryEntry(pool=inv.pool, devices=inv.devices,
                          state="stale" if inv.stale else "fresh", reporter=reporter,
                          observed_at=inv.observed_at, received_at=_fmt(inv.received_at),
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
    if len(batches) == 1 and not batches[0].stale and batches[0].keyset >= declared.keys():
        return []  # the steady state: one fresh report of everything
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
        since=_fmt(rs.since) if rs.since is not None else None,
        last_report_at=_fmt(rs.last_report_at) if rs.last_report_at is not None else None,
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


def _parts(state: ProjectionState, rec: Record, scope: str, *,
           encoded: bool = False) -> dict[str, Any]:
    return {
        "as_of": AsOf(seq=rec.as_seq, time=_fmt(rec.as_time), ts=rec.as_time),
        "values": _encoded_values(state, rec, scope) if encoded else _values(state, rec),
        "inventory": {r: _inventory_entry(r, i) for r, i in rec.inventory.items()},
        "reporters": {r: _reporter_status(state, s, r, scope)
                      for r, s in rec.reporters.items()},
    }


def host_snapshot(state: ProjectionState, host: str) -> HostSnapshot:
    """The `crr.v1.snapshot.host.<host>` record; KeyError if nothing was ever seen for `host`."""
    return HostSnapshot(host=host, **_parts(state, state.hosts[host], "host"))


def host_record(state: ProjectionState, host: str) -> bytes:
    """`encode(host_snapshot(state, host))`, byte for byte, built with less work (the
    projector writes one per report: see `_encoded_values`)."""
    return encode(HostSnapshot(host=host, **_parts(state, state.hosts[host], "host",
                                                    encoded=True)))


def host_columns(state: ProjectionState, host: str) -> str | None:
    """The `COLUMNS_HEADER` value of `host_record(state, host)` (schemas.snapshot_lean), or
    None when it would be longer than `COLUMNS_MAX`.

    `columns_of` the record's entries; a host's steady state (one reporter's one
    report of all its values, none stale: one expiry) is built without entry
    objects (`tests/test_snapshot_encoding.py` checks it against `columns_of`).
    """
    rec = state.hosts[host]
    if len(rec.reporters) == 1:
        ((reporter, rs),) = rec.reporters.items()
        uniform = state.plan.uniform_life.get((reporter, "host"))
        if len(rs.batches) == 1 and uniform is not None:
            b = rs.batches[0]
            if b.full is not None and not b.stale and b.order:  # (`full` encodes as `v`)
                return _columns_bytes(b"".join((
                    b'{"e":', _encode(b.received_at + uniform), b',"host":', _encode(host),
                    b',"v":', _encode(b.full), b"}")))
    return _columns_text(columns_of(host, _values(state, rec)))


def _columns_text(columns: dict[str, Any]) -> str | None:
    return _columns_bytes(_encode(columns))


def _columns_bytes(data: bytes) -> str | None:
    if not data.isascii():  # (rare) JSON's \u escapes: header values stay ASCII, which every
        # NATS client reads alike (nats-py's email-based parsing makes others `Header` objects)
        data = json.dumps(msgspec.json.decode(data), ensure_ascii=True,
                          separators=(",", ":")).encode()
    return data.decode() if len(data) <= COLUMNS_MAX else None


def cluster_record(state: ProjectionState) -> bytes:
    """`encode(cluster_snapshot(state))`, byte for byte (see `host_record`)."""
    return encode(ClusterSnapshot(**_parts(state, state.cluster, "cluster", encoded=True)))


def cluster_snapshot(state: ProjectionState) -> ClusterSnapshot:
    """The `crr.v1.snapshot.cluster` record (cluster-scope values, inventories, reporters)."""
    return ClusterSnapshot(**_parts(state, state.cluster, "cluster"))


def host_names(state: ProjectionState) -> list[str]:
    """Every host the state knows, sorted."""
    return sorted(state.hosts)
