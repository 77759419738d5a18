"""The scheduler's cached copy of the snapshot, held column-wise so `select[]` runs in numpy.

Layout (one *row* per host, rows reused after `remove`, capacity doubles):

- every **host-scope** resource of the catalog has a `Column`:
  `state` (int8: `ABSENT` never reported, `FRESH`, `STALE`, `NULL` — the
  reporter said null or the value is not of the resource's kind),
  `expires` (float64 epoch seconds; `+inf` for absent rows) and `values`:
  float64 for numeric, bool for boolean, int32 codes into one table-wide
  string pool for string (codes are shared by all string columns, so two
  string resources compare by code), and the member count (float64) for
  string sets;
- a **string set** column also keeps each row's `frozenset` and, lazily, a
  bool *member column* per member that a compiled expression asked about
  (`has "x"`, `has_any`, `has_all`).  A member column is built by one scan
  the first time it is needed and then maintained by `upsert`, which only
  touches the members that changed (the symmetric difference of the old
  and the new set).  At most `MAX_MEMBER_COLUMNS` are kept per resource,
  least recently used first out;
- **cluster-scope** resources are scalars taken from the ClusterSnapshot:
  the same value on every host.

Freshness at evaluation time `now` (`projections.freshness`, the rule every
surface uses; `Column.known`/`stale` are its vectorised form): a value is
*stale* when the snapshot says so **or** its `expires_at` ≤ `now` (this
protects the scheduler if the projector dies); otherwise it is *unknown*
when it is null (or not of the resource's kind), and *fresh* when it has a
value.  A resource never reported on a host is
*never reported* (unknown, never stale).

`upsert` costs O(values in the old and the new snapshot) plus O(changed set
members); `set_catalog` rebuilds every column from the stored snapshots.
Pure data structure: no IO, no clock.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from schemas.catalog import EMPTY_CATALOG, Catalog, Kind, ResourceSpec
from schemas.errors import PayloadError
from schemas.snapshot import ClusterSnapshot, HostSnapshot, ValueEntry
from schemas.timestamps import parse_time

ABSENT: Final = 0
FRESH: Final = 1
STALE: Final = 2
NULL: Final = 3

MAX_MEMBER_COLUMNS: Final = 256
"""Member columns kept per string-set resource (least recently used are dropped)."""

_INITIAL_CAPACITY: Final = 64
_POOL_COMPACT_MIN: Final = 65536

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

Freshness = Literal["fresh", "stale", "unknown", "never_reported"]


_fromisoformat: Final = datetime.fromisoformat


def expires_seconds(text: str) -> float:
    """Epoch seconds of an RFC 3339 timestamp; `-inf` (already expired) if it does not parse.

    The canonical form the projector writes (`2026-12-02T14:00:00.123Z`) is
    parsed by a fast path (upserts parse one timestamp per value:
    `datetime.fromisoformat` is C code, ~10x faster than slicing digits);
    anything else goes through `schemas.timestamps.parse_time`.  Both give
    the same float: whole seconds + milliseconds / 1000.
    """
    if len(text) == 24 and text[23] == "Z" and text[10] == "T" and text[19] == ".":
        try:
            dt = _fromisoformat(text)
        except ValueError:
            pass
        else:
            return int(dt.timestamp()) + dt.microsecond * 1000 / 1e9
    try:
        return parse_time(text)
    except PayloadError:
        return -math.inf


_DIGITS: Final = (0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18, 20, 21, 22)
_SEPARATORS: Final = ((4, "-"), (7, "-"), (10, "T"), (13, ":"), (16, ":"), (19, "."), (23, "Z"))
_MONTH_DAYS: Final = np.array([0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)
_STATE_CODES: Final = {"fresh": FRESH, "stale": STALE}
_ENTRY_FIELDS: Final = operator.attrgetter("state", "expires_at", "value")
_Gathered = tuple[list[int], list[tuple[str, str, Any]]]
"""One column's values before it is built: rows, and (state, expires_at, value) per row."""
_NOTHING: Final[_Gathered] = ([], [])


def expires_many(texts: list[str]) -> FloatArray:
    """`expires_seconds` of every text, vectorised: the same floats, bit for bit.

    Canonical timestamps (`YYYY-MM-DDTHH:MM:SS.mmmZ`, years 1970–9999, a
    real calendar date) are parsed with numpy on their bytes; the rest
    (other forms, garbage) go through `expires_seconds` one by one.
    """
    n = len(texts)
    out: FloatArray = np.empty(n, dtype=np.float64)
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=n)
    sel = np.flatnonzero(lengths == 24)
    ok: BoolArray = np.zeros(n, dtype=np.bool_)
    if len(sel):
        chosen = texts if len(sel) == n else [texts[i] for i in sel.tolist()]
        # Non-ASCII characters become "?" (one byte each), which fails the checks below.
        raw = np.frombuffer("".join(chosen).encode("ascii", "replace"), dtype=np.uint8)
        b = raw.reshape(len(sel), 24)
        good = np.ones(len(sel), dtype=np.bool_)
        for pos, ch in _SEPARATORS:
            good &= b[:, pos] == ord(ch)
        d = b[:, list(_DIGITS)].astype(np.int64) - ord("0")
        good &= ((d >= 0) & (d <= 9)).all(axis=1)
        year = d[:, 0] * 1000 + d[:, 1] * 100 + d[:, 2] * 10 + d[:, 3]
        month = d[:, 4] * 10 + d[:, 5]
        day = d[:, 6] * 10 + d[:, 7]
        hour = d[:, 8] * 10 + d[:, 9]
        minute = d[:, 10] * 10 + d[:, 11]
        second = d[:, 12] * 10 + d[:, 13]
        millis = d[:, 14] * 100 + d[:, 15] * 10 + d[:, 16]
        leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
        dim = _MONTH_DAYS[np.clip(month, 0, 12)] + (leap & (month == 2))
        good &= ((year >= 1970) & (month >= 1) & (month <= 12) & (day >= 1) & (day <= dim)
                 & (hour < 24) & (minute < 60) & (second < 60))
        # Days from civil (H. Hinnant's algorithm; March is month 0, years ≥ 1).
        y = year - (month <= 2)
        era = y // 400
        yoe = y - era * 400
        doy = (153 * ((month + 9) % 12) + 2) // 5 + day - 1
        days = era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468
        secs = days * 86400 + hour * 3600 + minute * 60 + second
        # The scalar fast path's arithmetic: int seconds + (ms * 10**6) / 1e9.
        out[sel] = secs.astype(np.float64) + (millis * 1_000_000).astype(np.float64) / 1e9
        ok[sel] = good
    for i in np.flatnonzero(~ok).tolist():
        out[i] = expires_seconds(texts[i])
    return out


def normalize(kind: Kind, value: Any) -> Any:
    """The value as `select[]` sees it, or None when it is null or not of `kind`.

    numeric → finite float (bool is not a number), boolean → bool,
    string → str, string_set → frozenset[str].
    """
    if value is None:
        return None
    if kind == "numeric":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        try:
            f = float(value)
        except OverflowError:
            return None
        return f if math.isfinite(f) else None
    if kind == "boolean":
        return value if isinstance(value, bool) else None
    if kind == "string":
        return value if isinstance(value, str) else None
    if isinstance(value, list | tuple | set | frozenset) and all(isinstance(m, str) for m in value):
        return frozenset(value)
    return None


def _numeric_or_nan(value: Any) -> float:
    """`normalize("numeric", value)`, NaN for None (the bulk path's slow case)."""
    f = normalize("numeric", value)
    return math.nan if f is None else float(f)


def _string_set(value: Any) -> frozenset[str] | None:
    """`normalize("string_set", value)` with a fast path for a JSON array of strings."""
    if type(value) is list:
        try:
            "".join(value)  # C-speed check that every member is a str
        except TypeError:
            return None
        return frozenset(value)
    result: frozenset[str] | None = normalize("string_set", value)
    return result


def entry_code(kind: Kind, entry: ValueEntry | None) -> tuple[int, float, Any]:
    """(state code, expires_at seconds, normalized value) of one snapshot entry."""
    if entry is None:
        return ABSENT, math.inf, None
    expires = expires_seconds(entry.expires_at)
    if entry.state == "stale":
        return STALE, expires, None
    value = normalize(kind, entry.value) if entry.state == "fresh" else None
    if value is None:
        return NULL, expires, None
    return FRESH, expires, value


class Column:
    """One host-scope resource over all rows (see the module doc for the layout)."""

    __slots__ = (
        "expires", "f_arr", "fresh", "kind", "members", "min_expiry", "name", "sets", "spec",
        "stale_flag", "state", "t_arr", "values",
    )

    def __init__(self, name: str, spec: ResourceSpec, capacity: int) -> None:
        self.name = name
        self.spec = spec
        self.kind: Kind = spec.kind
        self.state = np.zeros(capacity, dtype=np.int8)
        self.expires: FloatArray = np.full(capacity, math.inf)
        self.values: npt.NDArray[Any]
        if self.kind == "boolean":
            self.values = np.zeros(capacity, dtype=np.bool_)
        elif self.kind == "string":
            self.values = np.full(capacity, -1, dtype=np.int32)
        else:
            self.values = np.zeros(capacity, dtype=np.float64)
        self.sets: list[frozenset[str] | None] = (
            [None] * capacity if self.kind == "string_set" else []
        )
        self.members: dict[str, BoolArray] = {}
        # Derived, maintained by `HostTable._write` so that evaluation at a `now` before
        # any value expires needs no arithmetic: state == FRESH, state == STALE, and for
        # booleans fresh-and-true / fresh-and-false.  `min_expiry` is a lower bound of the
        # expiry of every FRESH or NULL row (tightened lazily by `known`).
        self.fresh: BoolArray = np.zeros(capacity, dtype=np.bool_)
        self.stale_flag: BoolArray = np.zeros(capacity, dtype=np.bool_)
        self.t_arr: BoolArray = np.zeros(capacity if self.kind == "boolean" else 0, np.bool_)
        self.f_arr: BoolArray = np.zeros(capacity if self.kind == "boolean" else 0, np.bool_)
        self.min_expiry = math.inf

    def grow(self, capacity: int) -> None:
        """Extend every array to `capacity` rows; new rows are absent."""
        old = len(self.state)
        self.state = np.concatenate([self.state, np.zeros(capacity - old, dtype=np.int8)])
        self.expires = np.concatenate([self.expires, np.full(capacity - old, math.inf)])
        fill: npt.NDArray[Any]
        if self.kind == "string":
            fill = np.full(capacity - old, -1, dtype=np.int32)
        else:
            fill = np.zeros(capacity - old, dtype=self.values.dtype)
        self.values = np.concatenate([self.values, fill])
        more = np.zeros(capacity - old, dtype=np.bool_)
        self.fresh = np.concatenate([self.fresh, more])
        self.stale_flag = np.concatenate([self.stale_flag, more])
        if self.kind == "boolean":
            self.t_arr = np.concatenate([self.t_arr, more])
            self.f_arr = np.concatenate([self.f_arr, more])
        if self.kind == "string_set":
            self.sets.extend([None] * (capacity - old))
            for m, col in self.members.items():
                self.members[m] = np.concatenate([col, np.zeros(capacity - old, dtype=np.bool_)])

    def expiring(self, now: float) -> bool:
        """Whether some FRESH or NULL row has `expires_at` ≤ `now` (else no math is needed).

        Callers must not modify the arrays `known`, `stale` and `member` return.
        """
        if now < self.min_expiry:
            return False
        live = (self.state == FRESH) | (self.state == NULL)
        self.min_expiry = float(self.expires[live].min()) if live.any() else math.inf
        return now >= self.min_expiry

    def known(self, now: float) -> BoolArray:
        """Rows whose value is fresh at `now`."""
        if not self.expiring(now):
            return self.fresh
        return self.fresh & (self.expires > now)

    def stale(self, now: float) -> BoolArray:
        """Rows whose value is stale at `now` (absent rows never are: their expiry is +inf)."""
        if not self.expiring(now):
            return self.stale_flag
        return self.stale_flag | (self.expires <= now)

    def member(self, member: str) -> BoolArray:
        """The bool column `member in set` over all rows, built on first use."""
        col = self.members.pop(member, None)
        if col is None:
            col = np.fromiter(
                (s is not None and member in s for s in self.sets),
                dtype=np.bool_, count=len(self.sets),
            )
            if len(self.members) >= MAX_MEMBER_COLUMNS:
                del self.members[next(iter(self.members))]
        self.members[member] = col  # re-inserted last: most recently used
        return col


class ClusterValue:
    """A cluster-scope resource: one value shared by every host."""

    __slots__ = ("code", "expires", "spec", "value")

    def __init__(self, spec: ResourceSpec, code: int, expires: float, value: Any) -> None:
        self.spec = spec
        self.code = code
        self.expires = expires
        self.value = value

    def known(self, now: float) -> bool:
        """Whether the value is fresh at `now`."""
        return self.code == FRESH and self.expires > now

    def stale(self, now: float) -> bool:
        """Whether the value is stale at `now`."""
        return self.code == STALE or self.expires <= now


class HostTable:
    """Host snapshots plus their values as numpy columns; see the module doc."""

    def __init__(self, catalog: Catalog | None = None) -> None:
        self._catalog: Catalog = catalog if catalog is not None else EMPTY_CATALOG
        self._capacity = _INITIAL_CAPACITY
        self._rows: dict[str, int] = {}
        self._names: list[str | None] = [None] * self._capacity
        self._snaps: list[HostSnapshot | None] = [None] * self._capacity
        self._free: list[int] = list(range(self._capacity - 1, -1, -1))  # low rows first
        self._columns: dict[str, Column] = {}
        self._cluster: ClusterSnapshot | None = None
        self._cluster_values: dict[str, ClusterValue] = {}
        self._pool: dict[str, int] = {}
        self._strings: list[str] = []
        self._ranks: IntArray | None = None
        self._order: IntArray | None = None
        self._sorted_names: npt.NDArray[np.object_] | None = None
        self._build_columns()

    # -- the public surface -------------------------------------------------

    @property
    def catalog(self) -> Catalog:
        """The catalog the columns follow."""
        return self._catalog

    def set_catalog(self, catalog: Catalog) -> None:
        """Follow a new catalog: rebuild every column from the stored snapshots."""
        self._catalog = catalog
        self._build_columns()

    def load(self, snapshots: Iterable[HostSnapshot]) -> None:
        """Insert many snapshots at once (a cold start), built column-wise.

        Gives the state that upserting each snapshot in turn would: the same
        rows (in order of first appearance), stored snapshots, capacity,
        string pool and column contents.  `snapshots` is consumed once, in
        order: a generator that decodes records one by one keeps each one hot
        in the CPU cache while its values are gathered.  A host seen again is
        upserted after the build; on a table that already has hosts this is
        `upsert` per snapshot.
        """
        if self._rows:
            for snap in snapshots:
                self.upsert(snap)
            return
        rows: dict[str, int] = {}
        snaps: list[HostSnapshot | None] = []
        later: list[HostSnapshot] = []
        gathered: dict[str, _Gathered] = {}
        fields = _ENTRY_FIELDS
        for snap in snapshots:
            host = snap.host
            if host in rows:
                later.append(snap)
                continue
            row = rows[host] = len(snaps)
            snaps.append(snap)
            for name, entry in snap.values.items():
                lists = gathered.get(name)
                if lists is None:
                    lists = gathered[name] = ([], [])
                lists[0].append(row)
                lists[1].append(fields(entry))
        n = len(snaps)
        capacity = self._capacity
        while capacity < n:
            capacity *= 2
        self._capacity = capacity
        self._names = [*rows, *([None] * (capacity - n))]
        self._snaps = [*snaps, *([None] * (capacity - n))]
        self._rows = rows
        self._free = list(range(capacity - 1, n - 1, -1))  # popped from the end: low rows first
        self._order = None
        self._sorted_names = None
        self._build_columns(gathered)
        for snap in later:
            self.upsert(snap)

    def upsert(self, snapshot: HostSnapshot) -> None:
        """Insert or replace one host's snapshot."""
        row = self._rows.get(snapshot.host)
        old: dict[str, ValueEntry] = {}
        if row is None:
            row = self._allocate(snapshot.host)
        else:
            prev = self._snaps[row]
            if prev is not None:
                old = prev.values
        self._snaps[row] = snapshot
        new = snapshot.values
        columns = self._columns
        for name, entry in new.items():
            col = columns.get(name)
            if col is not None:
                self._write(col, row, entry)
        for name in old:
            if name not in new:
                col = columns.get(name)
                if col is not None:
                    self._write(col, row, None)
        if len(self._strings) > _POOL_COMPACT_MIN and len(self._strings) > 8 * (
            len(self._rows) * max(1, sum(c.kind == "string" for c in columns.values()))
        ):
            self._build_columns()  # the string pool grew with churn; re-encode it

    def remove(self, host: str) -> None:
        """Forget a host (no error if it is not in the table)."""
        row = self._rows.pop(host, None)
        if row is None:
            return
        prev = self._snaps[row]
        if prev is not None:
            for name in prev.values:
                col = self._columns.get(name)
                if col is not None:
                    self._write(col, row, None)
        self._snaps[row] = None
        self._names[row] = None
        self._free.append(row)
        self._order = None
        self._sorted_names = None

    def set_cluster(self, snapshot: ClusterSnapshot) -> None:
        """Replace the cluster-scope values."""
        self._cluster = snapshot
        self._build_cluster()

    def hosts(self) -> list[str]:
        """Host names, sorted."""
        return list(self.sorted_names())

    def get(self, host: str) -> HostSnapshot | None:
        """The stored snapshot of `host`, if any."""
        row = self._rows.get(host)
        return None if row is None else self._snaps[row]

    def cluster(self) -> ClusterSnapshot | None:
        """The stored cluster snapshot, if any."""
        return self._cluster

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, host: object) -> bool:
        return host in self._rows

    # -- the evaluator's interface ------------------------------------------

    @property
    def capacity(self) -> int:
        """Number of rows every column has (live rows and free slots)."""
        return self._capacity

    def row_of(self, host: str) -> int | None:
        """The row of `host`, if present."""
        return self._rows.get(host)

    def spec_for(self, name: str, kind: Kind) -> ResourceSpec | None:
        """The active descriptor of `name` if it still has `kind`.

        A compiled expression whose resource left the catalog or changed kind
        sees it as never reported rather than failing.
        """
        spec = self._catalog.resources.get(name)
        return spec if spec is not None and spec.kind == kind else None

    def column(self, name: str) -> Column | None:
        """The column of a host-scope resource."""
        return self._columns.get(name)

    def cluster_value(self, name: str) -> ClusterValue | None:
        """The value of a cluster-scope resource (None: never reported)."""
        return self._cluster_values.get(name)

    def code_of(self, text: str) -> int:
        """The pool code of a string, or -2 if no stored value has it."""
        return self._pool.get(text, -2)

    def strings(self) -> list[str]:
        """The string pool, indexed by code."""
        return self._strings

    def ranks(self) -> IntArray:
        """Rank (sorted position) of every pooled string, indexed by code."""
        if self._ranks is None or len(self._ranks) != len(self._strings):
            order = sorted(range(len(self._strings)), key=self._strings.__getitem__)
            ranks = np.empty(len(self._strings), dtype=np.int64)
            ranks[np.asarray(order, dtype=np.int64)] = np.arange(len(order), dtype=np.int64)
            self._ranks = ranks
        return self._ranks

    def sorted_rows(self) -> IntArray:
        """Rows of the live hosts in host-name order."""
        if self._order is None:
            names = sorted(self._rows)
            self._order = np.fromiter((self._rows[h] for h in names), dtype=np.int64,
                                      count=len(names))
            self._sorted_names = np.array(names, dtype=object)
        return self._order

    def sorted_names(self) -> npt.NDArray[np.object_]:
        """Live host names, sorted (aligned with `sorted_rows`)."""
        if self._sorted_names is None:
            self.sorted_rows()
        assert self._sorted_names is not None
        return self._sorted_names

    # -- internals ----------------------------------------------------------

    def _allocate(self, host: str) -> int:
        if not self._free:
            self._grow(self._capacity * 2)
        row = self._free.pop()
        self._rows[host] = row
        self._names[row] = host
        self._order = None
        self._sorted_names = None
        return row

    def _grow(self, capacity: int) -> None:
        old = self._capacity
        self._names.extend([None] * (capacity - old))
        self._snaps.extend([None] * (capacity - old))
        for col in self._columns.values():
            col.grow(capacity)
        # Free rows are popped from the end: hand out low rows first.
        self._free.extend(range(capacity - 1, old - 1, -1))
        self._capacity = capacity

    def _intern(self, text: str) -> int:
        code = self._pool.get(text)
        if code is None:
            code = len(self._strings)
            self._pool[text] = code
            self._strings.append(text)
        return code

    def _write(self, col: Column, row: int, entry: ValueEntry | None) -> None:
        code, expires, value = entry_code(col.kind, entry)
        col.state[row] = code
        col.expires[row] = expires
        col.fresh[row] = code == FRESH
        col.stale_flag[row] = code == STALE
        if code in (FRESH, NULL) and expires < col.min_expiry:
            col.min_expiry = expires
        kind = col.kind
        if kind == "numeric":
            col.values[row] = value if value is not None else 0.0
        elif kind == "boolean":
            col.values[row] = value is True
            col.t_arr[row] = value is True
            col.f_arr[row] = value is False
        elif kind == "string":
            col.values[row] = self._intern(value) if value is not None else -1
        else:
            new: frozenset[str] = value if value is not None else frozenset()
            old = col.sets[row]
            col.sets[row] = value
            col.values[row] = len(new)
            if col.members and old != new:
                for m in new.symmetric_difference(old or ()):
                    mcol = col.members.get(m)
                    if mcol is not None:
                        mcol[row] = m in new

    def _build_columns(self, gathered: dict[str, _Gathered] | None = None) -> None:
        """(Re)build every host column from the stored snapshots, column-wise.

        The same state as `_write` of every stored entry, row by row: one pass
        over the entries gathers each column's (row, state, expires_at, value)
        (`load` passes them in, gathered as it went), then each column is
        filled with a few numpy assignments.
        """
        self._pool = {}
        self._strings = []
        self._ranks = None
        self._columns = {
            name: Column(name, spec, self._capacity)
            for name, spec in sorted(self._catalog.resources.items())
            if spec.scope == "host"
        }
        if gathered is None:
            gathered = {name: ([], []) for name in self._columns}
            get = gathered.get
            fields = _ENTRY_FIELDS
            snaps = self._snaps
            for row in sorted(self._rows.values()):
                snap = snaps[row]
                assert snap is not None, row
                for name, entry in snap.values.items():
                    lists = get(name)
                    if lists is not None:
                        lists[0].append(row)
                        lists[1].append(fields(entry))
        strings: list[tuple[Column, IntArray, list[str]]] = []
        for name, col in self._columns.items():
            rows, triples = gathered.get(name, _NOTHING)
            if rows:
                fresh_strings = self._fill(col, rows, triples)
                if fresh_strings is not None:
                    strings.append((col, *fresh_strings))
        if strings:
            self._fill_string_codes(strings)
        self._build_cluster()

    def _fill(
        self, col: Column, rows: list[int], triples: list[tuple[str, str, Any]]
    ) -> tuple[IntArray, list[str]] | None:
        """Write (state, expires_at, value) at `rows` of a new column, as `_write` would.

        A string column's codes are left to `_fill_string_codes`: this returns
        its fresh rows and their strings.
        """
        n = len(rows)
        idx = np.asarray(rows, dtype=np.int64)
        states, texts, raw = zip(*triples, strict=True)
        codes = _STATE_CODES.get
        # 1 fresh, 2 stale, anything else NULL: entry_code's first two tests.
        state = np.fromiter([codes(st, NULL) for st in states], dtype=np.int8, count=n)
        expires = expires_many(list(texts))
        kind = col.kind
        num: FloatArray | None = None
        trues: BoolArray | None = None
        falses: BoolArray | None = None
        sets: list[frozenset[str] | None] = []
        if kind == "numeric":
            num = np.array([v if type(v) is float else _numeric_or_nan(v) for v in raw],
                           dtype=np.float64)
            valid = np.isfinite(num)
        elif kind == "boolean":
            trues = np.array([v is True for v in raw], dtype=np.bool_)
            falses = np.array([v is False for v in raw], dtype=np.bool_)
            valid = trues | falses
        elif kind == "string":
            valid = np.array([isinstance(v, str) for v in raw], dtype=np.bool_)
        else:
            sets = [_string_set(v) for v in raw]
            valid = np.array([s is not None for s in sets], dtype=np.bool_)
        stale = state == STALE
        fresh = (state == FRESH) & valid
        col.state[idx] = np.where(stale, STALE, np.where(fresh, FRESH, NULL))
        col.expires[idx] = expires
        col.fresh[idx] = fresh
        col.stale_flag[idx] = stale
        live = ~stale
        if live.any():
            col.min_expiry = min(col.min_expiry, float(expires[live].min()))
        if num is not None:
            col.values[idx] = np.where(fresh, num, 0.0)
        elif trues is not None and falses is not None:
            col.values[idx] = fresh & trues
            col.t_arr[idx] = fresh & trues
            col.f_arr[idx] = fresh & falses
        elif kind == "string":
            where = np.flatnonzero(fresh)
            return idx[where], [raw[i] for i in where.tolist()]
        else:
            col_sets = col.sets
            for row, value, ok in zip(rows, sets, fresh.tolist(), strict=True):
                col_sets[row] = value if ok else None
            col.values[idx] = np.fromiter([len(v) if v is not None else 0 for v in sets],
                                          dtype=np.float64, count=n) * fresh
        return None

    def _fill_string_codes(self, columns: list[tuple[Column, IntArray, list[str]]]) -> None:
        """Intern the fresh strings of `columns` row by row (as upserts would), then code them."""
        rows = np.concatenate([r for _, r, _ in columns])
        texts = [t for _, _, ts in columns for t in ts]
        intern = self._intern
        for i in np.argsort(rows, kind="stable").tolist():
            intern(texts[i])
        pool = self._pool
        for col, col_rows, col_texts in columns:
            col.values[col_rows] = np.fromiter(map(pool.__getitem__, col_texts),
                                               dtype=np.int32, count=len(col_texts))

    def _build_cluster(self) -> None:
        values: dict[str, ClusterValue] = {}
        entries = self._cluster.values if self._cluster is not None else {}
        for name, spec in self._catalog.resources.items():
            if spec.scope != "cluster":
                continue
            entry = entries.get(name)
            if entry is not None:
                code, expires, value = entry_code(spec.kind, entry)
                values[name] = ClusterValue(spec, code, expires, value)
        self._cluster_values = values


def upsert_all(table: HostTable, snapshots: Iterable[HostSnapshot]) -> None:
    """Upsert many snapshots (a cold start): `table.load`, column-wise when the table is empty."""
    table.load(snapshots)
