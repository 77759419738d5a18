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

Lean rows (the scheduler view): `decode_record` reads a record's bytes as
far as the columns need (`schemas.snapshot_lean.lean_decoder` for the
catalog's host resources: state, value and expiry of each — nothing else),
`load_records` / `upsert_row` keep only the record's bytes beside the
columns (a bulk load fills each column from its entries with a few C-level
passes, a chunk of records at a time, from the records' columns headers
where they have them: `schemas.snapshot_lean.COLUMNS_HEADER`); `get` decodes the
full `HostSnapshot` from those bytes on demand.  A host therefore costs its
columns' cells plus one bytes object, never a tree of Python objects that
the cyclic garbage collector must scan.  The expiry is the record's numeric
`expires_ts` twin when it has one, else its parsed `expires_at` (older
records).  A kept record whose full decode fails (the lean one succeeded)
makes `get` return None and is reported to `on_unreadable`.
Pure data structure: no IO, no clock.
"""

from __future__ import annotations

import math
import operator
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import chain, compress, groupby, repeat
from operator import countOf
from typing import Any, Final, Literal, cast

import lz4.block
import msgspec
import numpy as np
import numpy.typing as npt

from projections.validation import normalize
from schemas.catalog import EMPTY_CATALOG, Catalog, Kind, ResourceSpec
from schemas.codec import DECODERS
from schemas.snapshot import ClusterSnapshot, HostSnapshot, ValueEntry
from schemas.snapshot_lean import ABSENT as ABSENT_ENTRY
from schemas.snapshot_lean import (
    LeanEntry,
    LeanRecord,
    TwinEntry,
    columns_decoder,
    lean_decoder,
    lean_fields,
)
from schemas.wire_time import expires_many, seconds_of

ABSENT: Final = 0
FRESH: Final = 1
STALE: Final = 2
NULL: Final = 3

MAX_MEMBER_COLUMNS: Final = 256
"""Member columns kept per string-set resource (least recently used are dropped)."""

_INITIAL_CAPACITY: Final = 64
LOAD_CHUNK: Final = 2048
"""Records decoded at a time by `HostTable.load_records` (bounds the load's transient objects)."""
SMALL_BATCH: Final = 32
"""`append_records` of fewer records upserts them one by one (the column-wise passes have a
fixed cost per column: at 20 host resources they cost more per record than `upsert_row`
below about 30 records)."""
STAGE_LIMIT: Final = 1024
"""Rows `upsert_row` stages at most before it writes them to the columns without waiting
for a read (bounds the work of one write and the decoded values held)."""
_POOL_COMPACT_MIN: Final = 65536
MAX_KNOWN_SETS: Final = 4096
"""Distinct string sets a string-set column remembers for the next bulk fill (see
`_string_sets`): a load's chunks share them; more distinct sets than this start it over."""

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

Freshness = Literal["fresh", "stale", "unknown", "never_reported"]


_STATE_CODES: Final = {"fresh": FRESH, "stale": STALE}
_LEAN_CODES: Final = {"fresh": FRESH, "stale": STALE, "unknown": NULL, "absent": ABSENT}
_STATE: Final = operator.attrgetter("state")
_TWIN: Final = operator.attrgetter("expires_ts")
_VALUE: Final = operator.attrgetter("value")
_LEAN_FIELDS: Final = operator.attrgetter("state", "expires_ts", "expires_at", "value")
_HOST: Final = operator.attrgetter("host")
_V: Final = operator.attrgetter("v")
_E: Final = operator.attrgetter("e")
_X: Final = operator.attrgetter("x")
_UNSET: Final = msgspec.UNSET
_VALUES: Final = operator.attrgetter("values")


def _twinless_fields(entry: ValueEntry) -> tuple[str, float | None, str, Any]:
    return entry.state, None, entry.expires_at, entry.value


_ENTRY_FIELDS: Final[Callable[[Any], tuple[str, float | None, str, Any]]] = (
    _LEAN_FIELDS if "expires_ts" in ValueEntry.__struct_fields__ else _twinless_fields
)
"""(state, expires_ts, expires_at, value) of a full entry (ValueEntry has the twin once
the projector writes it; until then it is None)."""
_Quad = tuple[str, float | None, str, Any]
_Gathered = tuple[list[int], list[_Quad]]
"""One column's values before it is built: rows, and (state, expires_ts, expires_at, value)
per row."""
Entry = ValueEntry | LeanEntry
"""What the columns read of a value: a full entry or its lean decode."""
Doc = HostSnapshot | bytes
"""What a row keeps: the snapshot upserted, or the record's bytes (lean rows)."""
_host_decoder: Final[msgspec.json.Decoder[HostSnapshot]] = DECODERS[HostSnapshot]
_NOTHING: Final[_Gathered] = ([], [])
_PLAIN: Final[dict[type, Kind]] = {float: "numeric", bool: "boolean", str: "string"}
"""Value types `normalize` returns unchanged for their kind (a float only when finite)."""


def _expiries(twins: tuple[float | None, ...], texts: tuple[str, ...]) -> FloatArray:
    """`entry_expiry` of many entries: the twins where present, the parsed strings elsewhere."""
    if None not in twins:
        return np.array(twins, dtype=np.float64)
    missing = [i for i, t in enumerate(twins) if t is None]
    if len(missing) == len(twins):
        return expires_many(list(texts))
    out = np.array([math.nan if t is None else t for t in twins], dtype=np.float64)
    out[missing] = expires_many([texts[i] for i in missing])
    return out


def _entry_expiries(entries: list[LeanEntry]) -> FloatArray:
    """`entry_expiry` of many lean entries: the twins where present, the parsed strings
    elsewhere."""
    twins = list(map(_TWIN, entries))
    if None not in twins:
        return np.array(twins, dtype=np.float64)
    missing = [i for i, t in enumerate(twins) if t is None]
    expires = np.array([math.nan if t is None else t for t in twins], dtype=np.float64)
    expires[missing] = expires_many([entries[i].expires_at for i in missing])
    return expires


_PACKED: Final = b"\x00"
"""The first byte of a `pack`ed record (a JSON record never starts with a NUL byte)."""


def pack(data: bytes) -> bytes:
    """A record compressed to keep: LZ4 (block format, ~3 µs and ~8x smaller for a 6 kB host
    record; zlib's fastest level took ~20 µs for ~10x), behind one marker byte."""
    packed: bytes = lz4.block.compress(data, store_size=True)
    return _PACKED + packed


def is_packed(doc: bytes) -> bool:
    """Whether kept bytes are `pack`ed (they start with the marker byte)."""
    return doc[:1] == _PACKED


def unpack(doc: bytes) -> bytes:
    """The record of kept bytes, packed or not."""
    if doc[:1] != _PACKED:
        return doc
    data: bytes = lz4.block.decompress(memoryview(doc)[1:])
    return data


def _capacity_for(n: int, capacity: int) -> int:
    """`capacity` doubled until it holds `n` rows (how the table grows)."""
    while capacity < n:
        capacity *= 2
    return capacity


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


_LeanCodec = tuple[Callable[[bytes], Any], Callable[[Any], Any], list[str],
                   Callable[[bytes], Any]]
"""A table's lean decode of host records (twins first, else the strings), its entry reader
(a record's entries in the order of the names), the host resource names, and the decode of
records with twins alone (a bulk load tries a whole chunk with it first)."""


def _lean_codec(names: list[str]) -> _LeanCodec:
    """The lean codec of `names` (see `_LeanCodec`)."""
    twins = lean_decoder(names, TwinEntry)[0].decode
    strings, entries_of = lean_decoder(names)
    by_strings = strings.decode

    def decode(data: bytes) -> Any:
        try:
            return twins(data)  # no string per value (see TwinEntry)
        except msgspec.ValidationError:  # a record without twins (older), or invalid
            return by_strings(data)

    return decode, entries_of, names, twins


_NONE: Final = type(None)
_NUMBER_TYPES: Final = {float, int, _NONE}
_SET_TYPES: Final = {list, _NONE}


def _numbers(raw: Sequence[Any]) -> FloatArray:
    """`_numeric_or_nan` of every value: one C-level conversion when all are floats or ints."""
    if set(map(type, raw)) <= _NUMBER_TYPES:  # (None: NaN, as `_numeric_or_nan` gives)
        try:
            return np.array(raw, dtype=np.float64)
        except OverflowError:  # an int beyond float: normalize makes it None (NaN)
            pass
    return np.array([v if type(v) is float else _numeric_or_nan(v) for v in raw],
                    dtype=np.float64)


def _string_sets(raw: Sequence[Any], known: dict[tuple[str, ...], frozenset[str]] | None = None,
                 ) -> list[frozenset[str] | None]:
    """`_string_set` of every value: C-level passes when all are JSON arrays of strings
    (or null, a value that is not fresh).

    Hosts often share few distinct sets (the bench's 50k hosts: a few
    hundred `datasets` sets), so equal arrays (the same members in the same
    order) get one `frozenset` between them: one set built per distinct
    array, not one per host, and the column keeps that one (sets are
    immutable; a row's value is only ever replaced).  Fewer sets is less
    memory and fewer objects for the cyclic GC to scan (a frozenset is always
    tracked: 50k of them made each full collection of a scheduler ~100 ms).
    `known`: the sets of earlier calls (a column's, so that a load's chunks
    and the live writes share them too), added to; emptied when it holds
    `MAX_KNOWN_SETS`, so it stays small whatever the values.
    """
    types = set(map(type, raw))
    if types <= _SET_TYPES:
        arrays = raw if _NONE not in types else [v for v in raw if v is not None]
        try:
            "".join(chain.from_iterable(arrays))  # C-speed check that every member is a str
        except TypeError:
            pass
        else:
            keys: list[Any] = list(map(tuple, raw)) if arrays is raw else [
                None if v is None else tuple(v) for v in raw]
            distinct = dict.fromkeys(keys)  # first appearances, in C
            distinct.pop(None, None)
            if known is None:
                known = {}
            elif len(known) + len(distinct) > MAX_KNOWN_SETS:
                known.clear()
            for key in distinct:
                if key not in known:
                    known[key] = frozenset(key)
            return list(map(known.get, keys))  # (None for null: not a key)
    return [_string_set(v) for v in raw]


def entry_expiry(entry: Entry) -> float:
    """Epoch seconds an entry expires at: its `expires_ts` twin, else its parsed `expires_at`."""
    return seconds_of(entry.expires_ts, entry.expires_at)


def entry_code(kind: Kind, entry: Entry | None) -> tuple[int, float, Any]:
    """(state code, expires_at seconds, normalized value) of one snapshot entry."""
    if entry is None:
        return ABSENT, math.inf, None
    return _coded(kind, entry, entry_expiry(entry))


def _coded(kind: Kind, entry: Entry, expires: float) -> tuple[int, float, Any]:
    """`entry_code` once the expiry is known."""
    state = entry.state
    if state == "stale":
        return STALE, expires, None
    if state != "fresh":
        return NULL, expires, None
    value = entry.value
    plain = _PLAIN.get(type(value))  # the usual values: `normalize` would return them as is
    if plain == kind and (plain != "numeric" or math.isfinite(value)):
        return FRESH, expires, value
    value = normalize(kind, value)
    if value is None:
        return NULL, expires, None
    return FRESH, expires, value


class Column:
    """One host-scope resource over all rows (see the module doc for the layout)."""

    __slots__ = (
        "expires", "f_arr", "fresh", "kind", "known_sets", "members", "min_expiry", "name",
        "sets", "spec", "stale_flag", "state", "t_arr", "values",
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
        self.known_sets: dict[tuple[str, ...], frozenset[str]] = {}
        """A string-set column's sets by array, shared across bulk fills (`_string_sets`)."""
        # Derived, maintained by `HostTable._write` so that evaluation at a `now` before
        # any value expires needs no arithmetic: state == FRESH, state == STALE, and for
        # booleans fresh-and-true / fresh-and-false.  `min_expiry` is a lower bound of the
        # expiry of every FRESH or NULL row (tightened lazily by `known`).
        self.fresh: BoolArray = np.zeros(capacity, dtype=np.bool_)
        self.stale_flag: BoolArray = np.zeros(capacity, dtype=np.bool_)
        self.t_arr: BoolArray = np.zeros(capacity if self.kind == "boolean" else 0, np.bool_)
        self.f_arr: BoolArray = np.zeros(capacity if self.kind == "boolean" else 0, np.bool_)
        self.min_expiry = math.inf

    def shrink(self, capacity: int) -> None:
        """Keep the first `capacity` rows of every array (the rest must be absent)."""
        for attr in ("state", "expires", "values", "fresh", "stale_flag"):
            setattr(self, attr, getattr(self, attr)[:capacity].copy())
        if self.kind == "boolean":
            self.t_arr = self.t_arr[:capacity].copy()
            self.f_arr = self.f_arr[:capacity].copy()
        if self.kind == "string_set":
            del self.sets[capacity:]
        for m, col in self.members.items():
            self.members[m] = col[:capacity].copy()

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


class _Staged:
    """Rows upserted but not written to the columns yet (see `HostTable.upsert_row`).

    Each record's entries are flattened when it is staged, while its decoded
    objects are hot: per record, one (state, expiry, value) per host resource
    in the lean codec's order, so writing them is a few C-level passes over
    flat lists (and no pass over the decoded objects) however many are staged.
    """

    __slots__ = ("at", "expires", "rows", "states", "values")

    def __init__(self) -> None:
        self.at: dict[int, int] = {}
        """Row → index of its last staged record (a row removed meanwhile is not here)."""
        self.rows: list[int] = []
        self.states: list[str] = []
        self.expires = array("d")
        """(Doubles, not float objects: nothing of a staged record's expiries is kept alive.)"""
        self.values: list[Any] = []


class HostTable:
    """Host snapshots plus their values as numpy columns; see the module doc."""

    def __init__(self, catalog: Catalog | None = None, *,
                 on_unreadable: Callable[[str, Exception], None] | None = None) -> None:
        """`on_unreadable(host, error)`: a lean row's record failed its full decode in `get`."""
        self._catalog: Catalog = catalog if catalog is not None else EMPTY_CATALOG
        self._on_unreadable = on_unreadable
        self._lean: _LeanCodec | None = None
        self._getters: list[Callable[[Any], LeanEntry]] | None = None
        self._columns_codec: Callable[[str], Any] | None = None
        """The decode of `COLUMNS_HEADER` values for the catalog's host resources."""
        self._column_at: dict[str, int] | None = None
        """Host resource name -> its place in the lean codec's order (`_upsert_columns`)."""
        self._unpacked: dict[int, None] = {}
        self._staged = _Staged()
        """Lean rows whose record may be kept uncompressed (an ordered set; see `unpacked`)."""
        """The lean decoder of the catalog's host resources, its entry reader and the names."""
        self._capacity = _INITIAL_CAPACITY
        self._rows: dict[str, int] = {}
        self._names: list[str | None] = [None] * self._capacity
        self._snaps: list[Doc | None] = [None] * self._capacity
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
        self._lean = None
        self._getters = None
        self._columns_codec = None
        self._column_at = None
        self._build_columns()

    def _lean_codec(self) -> _LeanCodec:
        if self._lean is None:
            names = sorted(n for n, spec in self._catalog.resources.items()
                           if spec.scope == "host")
            self._lean = _lean_codec(names)
        return self._lean

    def _lean_getters(self) -> list[Callable[[Any], LeanEntry]]:
        """Per host resource (in the lean codec's order), the getter of its entry in a lean
        record's values."""
        if self._getters is None:
            self._getters = lean_fields(len(self._lean_codec()[2]))
        return self._getters

    def decode_record(self, data: bytes) -> LeanRecord:
        """A host record's lean decode for this table's catalog (msgspec errors if invalid).

        Only for `load_rows` / `upsert_row` of this table, before its catalog changes.
        """
        record: LeanRecord = self._lean_codec()[0](data)
        return record

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
        self._load(((s.host, s.values, s) for s in snapshots), _ENTRY_FIELDS)

    def load_records(self, records: Sequence[bytes],
                     on_error: Callable[[int, Exception], None] | None = None) -> None:
        """`load` for lean rows, from the records' bytes (see the module doc).

        Gives the table that `upsert_row` of each record's `decode_record` in
        turn gives.  A record that does not decode is skipped and reported as
        `on_error(index, error)`.  The records go through `append_records`
        `LOAD_CHUNK` at a time, so the decoded objects of no more than a chunk
        exist at once (a load must not leave the process with the memory of a
        million short-lived objects).
        """
        for start in range(0, len(records), LOAD_CHUNK):
            self.append_records(
                records[start:start + LOAD_CHUNK],
                None if on_error is None else
                lambda i, exc, at=start: on_error(at + i, exc))  # type: ignore[misc]

    def append_records(self, records: Sequence[bytes],
                       on_error: Callable[[int, Exception], None] | None = None,
                       columns: Sequence[str | None] | None = None) -> None:
        """`upsert_row` of each record's `decode_record` in turn, column-wise: one chunk of a load.

        The scheduler view feeds its cold start through this a chunk at a
        time while the records are still arriving.  Hosts the table does not
        have yet get rows (allocated as `upsert_row` would) that are filled
        column by column with a few C-level passes (`_fill_lean`); hosts it
        has, and repeats within the chunk, are upserted after them (the final
        state is the same: a row depends only on its host's last record).
        A record that does not decode is skipped and reported as
        `on_error(index in records, error)`.

        `columns`: each record's `COLUMNS_HEADER` value, or None where it has
        none (schemas.snapshot_lean).  A run of records that have one is read
        from them (`_fill_columns`: ~400 bytes to scan instead of ~6 kB), and gives
        the same table; the rest, and a run whose headers do not all decode,
        from the records themselves.
        """
        if columns is not None and len(records) >= SMALL_BATCH:
            decoded = self._decode_columns(columns)
            start = 0
            for has, run in groupby(range(len(records)), lambda i: decoded[i] is not None):
                end = start + len(list(run))
                if has and end - start >= SMALL_BATCH:
                    if self._staged.at:
                        self.apply_staged()
                    self._append(decoded[start:end], records[start:end], self._fill_columns)
                else:  # (a short run between records without columns: read whole)
                    self.append_records(
                        records[start:end], None if on_error is None else
                        lambda i, exc, at=start: on_error(at + i, exc))  # type: ignore[misc]
                start = end
            return
        if self._staged.at:  # rows this writes in place must not be overwritten by older ones
            self.apply_staged()
        decode, _, _, twins = self._lean_codec()
        datas: Sequence[bytes] = records
        all_twins = True
        """Every record decoded with `TwinEntry` (so every expiry is a number)."""
        try:
            leans: list[LeanRecord] = list(map(twins, records))
        except (msgspec.ValidationError, msgspec.DecodeError):  # older or bad ones: one by one
            all_twins = False
            leans, kept = [], []
            for i, data in enumerate(records):
                try:
                    leans.append(decode(data))
                except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                    if on_error is not None:
                        on_error(i, exc)
                    continue
                kept.append(data)
            datas = kept
        if not leans:
            return
        if len(leans) < SMALL_BATCH:  # a few records: row by row costs less
            for lean, data in zip(leans, datas, strict=True):
                self.upsert_row(lean, data)
            return
        self._append(leans, datas, lambda rows, chosen, replace: self._fill_lean(
            rows, list(map(_VALUES, chosen)), replace=replace, twins=all_twins))

    def _decode_columns(self, columns: Sequence[str | None]) -> list[Any]:
        """Each `COLUMNS_HEADER` value decoded (`columns_decoder`), None where there is none
        or it does not decode (that record is read whole)."""
        decode = self._columns_decode()
        try:
            return list(map(decode, columns))  # type: ignore[arg-type]
        except (msgspec.ValidationError, msgspec.DecodeError, TypeError):
            pass
        out: list[Any] = []
        for text in columns:
            try:
                out.append(None if text is None else decode(text))
            except (msgspec.ValidationError, msgspec.DecodeError):
                out.append(None)
        return out

    def _append(self, leans: list[Any], datas: Sequence[bytes],
                fill: Callable[[IntArray, list[Any], bool], None]) -> None:
        """The rest of `append_records` once its records are decoded (`leans`, each with a
        `host`): rows for the new hosts, the records kept, `fill(rows, the decoded records
        of those rows, replace)` writes the columns."""
        hosts = list(map(_HOST, leans))
        table_rows = self._rows
        last = dict(zip(hosts, range(len(hosts)), strict=True))
        """Each host's last record (a row depends on nothing else), in first-appearance order."""
        new = [h for h in last if h not in table_rows]
        replace = len(new) < len(last) or any(col.members for col in self._columns.values())
        if new:
            rows = self._take_free(len(new))
            names = self._names
            if rows[-1] - rows[0] == len(rows) - 1:  # ascending and contiguous: a slice
                names[rows[0]:rows[-1] + 1] = new
            else:
                for row, host in zip(rows, new, strict=True):
                    names[row] = host
            table_rows.update(zip(new, rows, strict=True))
            self._order = None
            self._sorted_names = None
        if len(last) == len(leans) and not replace:  # the usual load chunk: all new, in order
            at = range(len(leans))
            all_rows = rows
        else:
            at = list(last.values())  # type: ignore[assignment]
            all_rows = list(map(table_rows.__getitem__, last))
        snaps = self._snaps
        if all_rows[-1] - all_rows[0] == len(all_rows) - 1 and not replace:
            snaps[all_rows[0]:all_rows[-1] + 1] = datas if len(at) == len(datas) else [
                datas[i] for i in at]
        else:
            for row, i in zip(all_rows, at, strict=True):
                snaps[row] = datas[i]
        self._unpacked.update(dict.fromkeys(all_rows))
        fill(np.asarray(all_rows, dtype=np.int64),
             leans if len(at) == len(leans) else [leans[i] for i in at], replace)
        if replace:
            self._compact_pool()

    def _take_free(self, n: int) -> list[int]:
        """`n` rows for new hosts, the ones `_allocate` would give one by one (ascending)."""
        free = self._free
        take = min(n, len(free))
        rows = free[len(free) - take:]
        rows.reverse()
        del free[len(free) - take:]
        if take < n:  # the table grows as often as one-by-one allocation would make it
            self._grow(_capacity_for(self._capacity + n - take, self._capacity))
            more = free[len(free) - (n - take):]
            more.reverse()
            del free[len(free) - (n - take):]
            rows += more
        return rows

    def _take_rows(self, rows: dict[str, int], docs: list[Doc | None]) -> None:
        """Rows 0..n-1 of an empty table: `rows` names them, `docs` is what each keeps."""
        n = len(docs)
        capacity = self._capacity
        while capacity < n:
            capacity *= 2
        self._capacity = capacity
        self._names = [*rows, *([None] * (capacity - n))]
        self._snaps = [*docs, *([None] * (capacity - n))]
        self._rows = rows
        self._free = list(range(capacity - 1, n - 1, -1))  # popped from the end: low rows first
        self._order = None
        self._sorted_names = None

    def _load(self, items: Iterator[tuple[str, Mapping[str, Entry], Doc]],
              fields: Callable[[Any], _Quad]) -> None:
        """The bulk load of full snapshots: gathered entry by entry (see `load`)."""
        if self._rows:
            for host, values, doc in items:
                self._replace(host, values, doc)
            return
        rows: dict[str, int] = {}
        snaps: list[Doc | None] = []
        later: list[tuple[str, Mapping[str, Entry], Doc]] = []
        gathered: dict[str, _Gathered] = {}
        for host, values, doc in items:
            if host in rows:
                later.append((host, values, doc))
                continue
            row = rows[host] = len(snaps)
            snaps.append(doc)
            for name, entry in values.items():
                lists = gathered.get(name)
                if lists is None:
                    lists = gathered[name] = ([], [])
                lists[0].append(row)
                lists[1].append(fields(entry))
        self._take_rows(rows, snaps)
        self._build_columns(gathered)
        for host, values, doc in later:
            self._replace(host, values, doc)

    def upsert(self, snapshot: HostSnapshot) -> None:
        """Insert or replace one host's snapshot."""
        self._replace(snapshot.host, snapshot.values, snapshot)

    def upsert_record(self, data: bytes, columns: str | None = None) -> None:
        """`upsert_row` of the record `data`, read from its `COLUMNS_HEADER` value `columns`
        when it has one that decodes (`_upsert_columns`), else from itself (msgspec errors
        if it does not decode)."""
        if columns is not None:
            try:
                decoded = self._columns_decode()(columns)
            except (msgspec.ValidationError, msgspec.DecodeError):
                pass
            else:
                self._upsert_columns(decoded, data)
                return
        self.upsert_row(self.decode_record(data), data)

    def _columns_decode(self) -> Callable[[str], Any]:
        decode = self._columns_codec
        if decode is None:
            decode = self._columns_codec = columns_decoder(self._lean_codec()[2]).decode
        return decode

    def _upsert_columns(self, decoded: Any, data: bytes) -> None:
        """`upsert_row` of a record read from its decoded columns header: the same row,
        record and staged cells.  A value in `v` is fresh (unknown when null) and
        expires at `e`; one in `x` is as it says; the others are absent."""
        row = self._place(decoded.host, data)
        values = list(self._lean_codec()[1](decoded.v))  # (the same fields as a lean record's)
        n = len(values)
        staged = self._staged
        staged.at[row] = len(staged.rows)
        staged.rows.append(row)
        if decoded.x is None and not countOf(values, _UNSET):  # a host's steady state
            staged.states += repeat("fresh", n)
            staged.expires.extend(repeat(decoded.e, n))
            staged.values += values
        else:
            states = ["absent" if v is _UNSET else "fresh" for v in values]
            expires = [math.inf if v is _UNSET else decoded.e for v in values]
            if decoded.x:
                index = self._column_at
                if index is None:
                    index = self._column_at = {
                        name: i for i, name in enumerate(self._lean_codec()[2])}
                for name, (value, state, ts) in decoded.x.items():
                    i = index.get(name)
                    if i is not None:
                        values[i], states[i], expires[i] = value, state, ts
            staged.states += states
            staged.expires.extend(expires)
            staged.values += [None if v is _UNSET else v for v in values]
        if len(staged.at) >= STAGE_LIMIT:
            self.apply_staged()

    def _place(self, host: str, data: bytes) -> int:
        """The row of `host` (allocated if new), now keeping `data`."""
        row = self._rows.get(host)
        if row is None:
            row = self._allocate(host)
        self._snaps[row] = data
        self._unpacked[row] = None
        return row

    def upsert_row(self, lean: LeanRecord, data: bytes) -> None:
        """Insert or replace one host as a lean row: its `decode_record` and its bytes.

        The row and its record are the table's at once (`get`, `hosts`, `len`); its
        values are *staged* and written to the columns, together with every other
        staged row, by the next read of the columns (`column`, the string pool) or
        once `STAGE_LIMIT` rows wait (`apply_staged`): one column-wise pass over many
        rows costs a fraction of writing each row's cells one by one, and no reader
        can tell the difference.
        """
        row = self._place(lean.host, data)
        entries = self._lean_codec()[1](lean.values)
        staged = self._staged
        staged.at[row] = len(staged.rows)  # a row depends only on its host's last record
        staged.rows.append(row)
        staged.states += map(_STATE, entries)
        twins = list(map(_TWIN, entries))
        staged.expires.extend(twins if None not in twins else map(entry_expiry, entries))
        staged.values += map(_VALUE, entries)
        if len(staged.at) >= STAGE_LIMIT:
            self.apply_staged()

    def apply_staged(self) -> None:
        """Write the staged rows (`upsert_row`) into the columns now.

        Every read of the columns does this first; a caller may do it earlier
        to choose when the work is done.  The same cells as `_fill_lean` with
        `replace` of each row's last record: one column at a time, from the
        flat lists `upsert_row` filled.
        """
        staged = self._staged
        if not staged.at:
            return
        self._staged = _Staged()
        width = len(self._lean_codec()[2])
        states, expiries, values, row_list = (staged.states, staged.expires, staged.values,
                                              staged.rows)
        if len(staged.at) < len(row_list):  # rows staged twice, or removed: the last ones
            keep = sorted(staged.at.values())
            row_list = [row_list[k] for k in keep]
            states = [x for k in keep for x in states[k * width:(k + 1) * width]]
            expiries = array("d", [x for k in keep for x in expiries[k * width:(k + 1) * width]])
            values = [x for k in keep for x in values[k * width:(k + 1) * width]]
        n = len(row_list)
        rows = np.asarray(row_list, dtype=np.int64)
        by_col = np.frombuffer(expiries, dtype=np.float64).reshape(n, width).T.copy()
        all_fresh = states.count("fresh") == n * width
        codes_by_col = None if all_fresh else np.fromiter(
            map(_LEAN_CODES.__getitem__, states), dtype=np.int8,
            count=n * width).reshape(n, width).T.copy()
        fresh_codes = np.full(n, FRESH, dtype=np.int8)
        strings: list[tuple[Column, IntArray, list[str]]] = []
        for j, col in enumerate(map(self._columns.__getitem__, self._lean_codec()[2])):
            codes = fresh_codes if codes_by_col is None else codes_by_col[j]
            self._fill_present(col, rows, codes, by_col[j], values[j::width],
                               present=None if codes_by_col is None else codes != ABSENT,
                               clear=True, strings=strings)
        if strings:
            self._fill_string_codes(strings)
        self._compact_pool()

    @property
    def staged_count(self) -> int:
        """Rows upserted whose values are not in the columns yet (see `upsert_row`)."""
        return len(self._staged.at)

    def _replace(self, host: str, new: Mapping[str, Entry], doc: Doc) -> None:
        if self._staged.at:
            self.apply_staged()
        row = self._rows.get(host)
        prev: Doc | None = None
        if row is None:
            row = self._allocate(host)
        else:
            prev = self._snaps[row]
        self._snaps[row] = doc
        columns = self._columns
        for name, entry in new.items():
            col = columns.get(name)
            if col is not None:
                self._write(col, row, entry)
        if prev is not None:
            self._clear_others(row, prev, new)
        self._compact_pool()

    def _compact_pool(self) -> None:
        if len(self._strings) > _POOL_COMPACT_MIN and len(self._strings) > 8 * (
            len(self._rows) * max(1, sum(c.kind == "string" for c in self._columns.values()))
        ):
            self._build_columns()  # the string pool grew with churn; re-encode it

    def remove(self, host: str) -> None:
        """Forget a host (no error if it is not in the table)."""
        row = self._rows.pop(host, None)
        if row is None:
            return
        self._staged.at.pop(row, None)
        prev = self._snaps[row]
        if prev is not None:
            self._clear_others(row, prev, {})
        self._snaps[row] = None
        self._names[row] = None
        self._unpacked.pop(row, None)
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
        """The stored snapshot of `host`, if any (a lean row's record is decoded now)."""
        row = self._rows.get(host)
        doc = None if row is None else self._snaps[row]
        if not isinstance(doc, bytes):
            return doc
        try:
            return _host_decoder.decode(unpack(doc))
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            if self._on_unreadable is not None:
                self._on_unreadable(host, exc)
            return None

    def stored(self, host: str) -> object | None:
        """What is stored for `host` (a record or its packed bytes), as is: its identity
        changes whenever the record is replaced or (re)packed, so it keys caches of facts
        derived from the record without decoding it."""
        row = self._rows.get(host)
        return None if row is None else self._snaps[row]

    def record(self, host: str) -> bytes | None:
        """A lean row's record bytes, as the stream stored them (None: not a lean row)."""
        row = self._rows.get(host)
        doc = None if row is None else self._snaps[row]
        return unpack(doc) if isinstance(doc, bytes) else None

    # -- packing: lean rows' records compressed (see `pack`) ----------------

    def unpacked(self, limit: int) -> list[tuple[int, bytes]]:
        """Up to `limit` lean rows whose record is kept uncompressed: (row, bytes), newest first.

        They are taken off the list; hand them back to `packed` (a row whose
        record changed in between is listed again).  Newest first: taking from
        the end of the dict is O(1), from its start costs a scan of every slot
        deleted before (quadratic over a long run of live updates).
        """
        out: list[tuple[int, bytes]] = []
        todo = self._unpacked
        snaps = self._snaps
        pop = todo.popitem
        while todo and len(out) < limit:
            row = pop()[0]
            doc = snaps[row]
            if isinstance(doc, bytes) and not is_packed(doc):
                out.append((row, doc))
        return out

    def packed(self, rows: list[tuple[int, bytes]], packed: list[bytes]) -> int:
        """Keep `packed[i]` (`pack` of `rows[i]`'s bytes) where that row still holds those bytes.

        Returns how many were replaced.
        """
        snaps = self._snaps
        done = 0
        for (row, raw), small in zip(rows, packed, strict=True):
            if snaps[row] is raw:
                snaps[row] = small
                done += 1
        return done

    @property
    def unpacked_count(self) -> int:
        """Lean rows whose record is kept uncompressed (an upper bound)."""
        return len(self._unpacked)

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
        """The column of a host-scope resource (staged rows written first)."""
        if self._staged.at:
            self.apply_staged()
        return self._columns.get(name)

    def cluster_value(self, name: str) -> ClusterValue | None:
        """The value of a cluster-scope resource (None: never reported)."""
        return self._cluster_values.get(name)

    def code_of(self, text: str) -> int:
        """The pool code of a string, or -2 if no stored value has it."""
        if self._staged.at:
            self.apply_staged()
        return self._pool.get(text, -2)

    def strings(self) -> list[str]:
        """The string pool, indexed by code."""
        if self._staged.at:
            self.apply_staged()
        return self._strings

    def ranks(self) -> IntArray:
        """Rank (sorted position) of every pooled string, indexed by code."""
        if self._staged.at:
            self.apply_staged()
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

    def _clear_others(self, row: int, prev: Doc, new: Mapping[str, Entry]) -> None:
        """Clear the row's cells that `prev` had a value for and `new` does not."""
        columns = self._columns
        if isinstance(prev, bytes):  # the names are not kept: ask the columns
            for name, col in columns.items():
                if name not in new and col.state[row] != ABSENT:
                    self._write(col, row, None)
            return
        for name in prev.values:
            if name not in new:
                old = columns.get(name)
                if old is not None:
                    self._write(old, row, None)

    def _write(self, col: Column, row: int, entry: Entry | None) -> None:
        self._put(col, row, *entry_code(col.kind, entry))

    def _put(self, col: Column, row: int, code: int, expires: float, value: Any) -> None:
        """Write one cell: state `code`, expiry and normalized value (see `entry_code`)."""
        state = col.state
        if state[row] != code:  # (the flags follow the state: unchanged with it)
            state[row] = code
            col.fresh[row] = code == FRESH
            col.stale_flag[row] = code == STALE
        col.expires[row] = expires
        if expires < col.min_expiry and code in (FRESH, NULL):
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

    def _build_columns(self, gathered: dict[str, _Gathered] | None = None,
                       *, lean: bool = False) -> None:
        """(Re)build every host column from the stored snapshots, column-wise.

        The same state as `_write` of every stored entry, row by row: one pass
        over the entries gathers each column's (row, state, expires_at, value)
        (`load` passes them in, gathered as it went), then each column is
        filled with a few numpy assignments.  `lean`: only make the empty
        columns (`load_records` fills them).  A table of lean rows only is
        rebuilt from the kept bytes, a chunk of rows at a time (`_fill_lean`).
        """
        self._staged = _Staged()  # (their records are in `_snaps`: rebuilt from there)
        self._pool = {}
        self._strings = []
        self._ranks = None
        self._columns = {
            name: Column(name, spec, self._capacity)
            for name, spec in sorted(self._catalog.resources.items())
            if spec.scope == "host"
        }
        if lean:
            return
        if gathered is None and self._rows and all(
                isinstance(self._snaps[r], bytes) for r in self._rows.values()):
            self._refill_lean()
            return
        if gathered is None:
            gathered = {name: ([], []) for name in self._columns}
            get = gathered.get
            snaps = self._snaps
            for row in sorted(self._rows.values()):
                snap = snaps[row]
                assert snap is not None, row
                values: Mapping[str, Entry]
                fields: Callable[[Any], _Quad]
                if isinstance(snap, bytes):  # decoded before, so it decodes again
                    values, fields = self._lean_items(snap), _LEAN_FIELDS
                else:
                    values, fields = snap.values, _ENTRY_FIELDS
                for name, entry in values.items():
                    lists = get(name)
                    if lists is not None:
                        lists[0].append(row)
                        lists[1].append(fields(entry))
        strings: list[tuple[Column, IntArray, list[str]]] = []
        for name, col in self._columns.items():
            rows, quads = gathered.get(name, _NOTHING)
            if rows:
                fresh_strings = self._fill(col, rows, quads)
                if fresh_strings is not None:
                    strings.append((col, *fresh_strings))
        if strings:
            self._fill_string_codes(strings)
        self._build_cluster()

    def _fill(
        self, col: Column, rows: list[int], quads: list[_Quad]
    ) -> tuple[IntArray, list[str]] | None:
        """Write (state, expiry, value) at `rows` of a new column, as `_write` would.

        A string column's codes are left to `_fill_string_codes`: this returns
        its fresh rows and their strings.
        """
        n = len(rows)
        idx = np.asarray(rows, dtype=np.int64)
        states, twins, texts, raw = zip(*quads, strict=True)
        codes = _STATE_CODES.get
        # 1 fresh, 2 stale, anything else NULL: entry_code's first two tests.
        state = np.fromiter([codes(st, NULL) for st in states], dtype=np.int8, count=n)
        return self._fill_arrays(col, idx, state, _expiries(twins, texts), raw)

    def _fill_arrays(self, col: Column, idx: IntArray, state: npt.NDArray[np.int8],
                     expires: FloatArray, raw: tuple[Any, ...] | list[Any],
                     ) -> tuple[IntArray, list[str]] | None:
        """`_fill` once the state codes (FRESH, STALE or NULL) and expiries are arrays."""
        n = len(idx)
        kind = col.kind
        num: FloatArray | None = None
        trues: BoolArray | None = None
        falses: BoolArray | None = None
        sets: list[frozenset[str] | None] = []
        if kind == "numeric":
            num = _numbers(raw)
            valid = np.isfinite(num)
        elif kind == "boolean":
            trues = np.fromiter(map(operator.is_, raw, repeat(True)), dtype=np.bool_, count=n)
            falses = np.fromiter(map(operator.is_, raw, repeat(False)), dtype=np.bool_, count=n)
            valid = trues | falses
        elif kind == "string":
            valid = np.fromiter(map(isinstance, raw, repeat(str)), dtype=np.bool_, count=n)
        else:
            sets = _string_sets(raw, col.known_sets)
            valid = np.fromiter(map(operator.is_not, sets, repeat(None)), dtype=np.bool_,
                                count=n)
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
            col.values[idx] = -1  # the fresh rows get their codes from `_fill_string_codes`
            where = np.flatnonzero(fresh)
            return idx[where], [raw[i] for i in where.tolist()]
        else:
            kept = sets if fresh.all() else [
                v if ok else None for v, ok in zip(sets, fresh.tolist(), strict=True)]
            col_sets = col.sets
            first = int(idx[0])
            if int(idx[-1]) - first == n - 1 and (n < 2 or bool((np.diff(idx) == 1).all())):
                col_sets[first:first + n] = kept  # contiguous rows (a load): one slice
            else:
                for row, value in zip(idx.tolist(), kept, strict=True):
                    col_sets[row] = value
            col.values[idx] = np.fromiter(
                (len(v) if v is not None else 0 for v in kept) if None in kept
                else map(len, cast("list[frozenset[str]]", kept)), dtype=np.float64, count=n)
            for member, mcol in col.members.items():  # (none in a new column)
                mcol[idx] = np.fromiter((v is not None and member in v for v in kept),
                                        dtype=np.bool_, count=n)
        return None

    def _lean_items(self, data: bytes) -> dict[str, LeanEntry]:
        """A lean row's entries by name (its record decoded again: it decoded before)."""
        decode, entries_of, names, _ = self._lean_codec()
        values = decode(unpack(data)).values
        return {name: e for name, e in zip(names, entries_of(values), strict=True)
                if e is not ABSENT_ENTRY}

    def _refill_lean(self) -> None:
        """Fill the new columns from every lean row's kept bytes, a chunk at a time."""
        decode = self._lean_codec()[0]
        rows = sorted(self._rows.values())
        for start in range(0, len(rows), LOAD_CHUNK):
            part = rows[start:start + LOAD_CHUNK]
            self._fill_lean(np.asarray(part, dtype=np.int64),
                            [decode(self._record_at(r)).values for r in part])
        self._build_cluster()

    def _record_at(self, row: int) -> bytes:
        doc = self._snaps[row]
        assert isinstance(doc, bytes), row
        return unpack(doc)

    def _fill_lean(self, rows: IntArray, values: list[Any], *, replace: bool = False,
                   twins: bool = False) -> None:
        """Write the decoded values of `rows` into every column, one column at a time.

        Each column's entries are taken from the records' values in C (`map` of
        the column's field getter) and read with C-level passes (`map` of an
        attribute getter), so the per-value work is numpy's; rows without a
        value (`ABSENT`) are left as they are, or with `replace` (rows that may
        hold values, member columns that may exist) cleared as `_put` clears a
        cell.  A column whose entries are all fresh (the usual case) skips the
        state codes.  `twins`: every entry is a `TwinEntry` (its `expires_ts` is a number),
        so the expiries are read in one pass without looking for missing ones.
        """
        names, getters = self._lean_codec()[2], self._lean_getters()
        n = len(values)
        columns = self._columns
        strings: list[tuple[Column, IntArray, list[str]]] = []
        fresh_codes: npt.NDArray[np.int8] | None = None
        for name, getter in zip(names, getters, strict=True):
            col = columns[name]
            entries: list[LeanEntry] = list(map(getter, values))
            present: BoolArray | None = None
            if countOf(map(_STATE, entries), "fresh") == n:  # (no list of states)
                if fresh_codes is None:
                    fresh_codes = np.full(n, FRESH, dtype=np.int8)
                codes = fresh_codes
            else:
                codes = np.fromiter(map(_LEAN_CODES.__getitem__, map(_STATE, entries)),
                                    dtype=np.int8, count=n)
                present = codes != ABSENT
            # (an absent entry's expiry is ABSENT's +inf: read, then left out with it)
            expires = (np.fromiter(map(_TWIN, entries), dtype=np.float64, count=n) if twins
                       else _entry_expiries(entries))
            self._fill_present(col, rows, codes, expires, list(map(_VALUE, entries)),
                               present=present, clear=replace, strings=strings)
        if strings:
            self._fill_string_codes(strings)

    def _fill_columns(self, rows: IntArray, decoded: list[Any], replace: bool) -> None:
        """`_fill_lean` for records read from their columns headers (`columns_decoder`).

        A column's values are taken from every record's `v` in C (`map` of the
        field getter): fresh, expiring at the record's `e` (one array for all
        columns); the record's `x` entries of that name (stale values, other
        expiries: few) are put in place; a value that neither has is absent
        (`msgspec.UNSET`), left as it is or, with `replace`, cleared.
        """
        names, getters = self._lean_codec()[2], self._lean_getters()
        n = len(decoded)
        vs = list(map(_V, decoded))
        expiry = np.fromiter(map(_E, decoded), dtype=np.float64, count=n)
        fresh_codes = np.full(n, FRESH, dtype=np.int8)
        others: dict[str, list[tuple[int, tuple[Any, str, float]]]] = {}
        for i in compress(range(n), map(_X, decoded)):
            for name, entry in decoded[i].x.items():
                others.setdefault(name, []).append((i, entry))
        columns = self._columns
        strings: list[tuple[Column, IntArray, list[str]]] = []
        for name, getter in zip(names, getters, strict=True):
            col = columns[name]
            values: list[Any] = list(map(getter, vs))
            codes, expires = fresh_codes, expiry
            extra = others.get(name)
            if extra is not None:
                codes, expires = codes.copy(), expires.copy()
                for i, (value, state, ts) in extra:
                    values[i] = value
                    codes[i] = _LEAN_CODES[state]
                    expires[i] = ts
            present = np.fromiter(map(operator.is_not, values, repeat(_UNSET)),
                                  dtype=np.bool_, count=n) if countOf(values, _UNSET) else None
            self._fill_present(col, rows, codes, expires, values, present=present,
                               clear=replace, strings=strings)
        if strings:
            self._fill_string_codes(strings)

    def _fill_present(self, col: Column, rows: IntArray, codes: npt.NDArray[np.int8],
                      expires: FloatArray, raw: list[Any], *, present: BoolArray | None,
                      clear: bool, strings: list[tuple[Column, IntArray, list[str]]]) -> None:
        """`_fill_arrays` of the rows where `present` (None: all of them); the others are
        cleared with `clear`, else left as they are.  A string column's fresh rows and their
        texts go to `strings` (for `_fill_string_codes`)."""
        idx = rows
        if present is not None and not present.all():
            if clear:
                self._clear_cells(col, rows[~present])
            if not present.any():
                return
            where = np.flatnonzero(present)
            raw = list(map(raw.__getitem__, where.tolist()))
            idx, expires, codes = rows[where], expires[where], codes[where]
        fresh_strings = self._fill_arrays(col, idx, codes, expires, raw)
        if fresh_strings is not None:
            strings.append((col, *fresh_strings))

    @staticmethod
    def _clear_cells(col: Column, rows: IntArray) -> None:
        """`_put(col, row, ABSENT, inf, None)` of every row in `rows` (vectorised)."""
        rows = rows[col.state[rows] != ABSENT]
        if not len(rows):
            return
        col.state[rows] = ABSENT
        col.expires[rows] = math.inf
        col.fresh[rows] = False
        col.stale_flag[rows] = False
        if col.kind == "string":
            col.values[rows] = -1
        else:
            col.values[rows] = 0
        if col.kind == "boolean":
            col.t_arr[rows] = False
            col.f_arr[rows] = False
        elif col.kind == "string_set":
            sets = col.sets
            for row in rows.tolist():
                sets[row] = None
            for mcol in col.members.values():
                mcol[rows] = False

    def _fill_string_codes(self, columns: list[tuple[Column, IntArray, list[str]]]) -> None:
        """Intern the fresh strings of `columns` row by row (as upserts would), then code them."""
        rows = np.concatenate([r for _, r, _ in columns])
        texts = [t for _, _, ts in columns for t in ts]
        pool = self._pool
        intern = self._intern
        # The distinct texts in row order (C-level), interned in that order: the codes
        # interning every text row by row gives.
        for text in dict.fromkeys(map(texts.__getitem__,
                                      np.argsort(rows, kind="stable").tolist())):
            if text not in pool:
                intern(text)
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
