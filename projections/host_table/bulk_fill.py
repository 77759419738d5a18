"""Many records written into the columns at once: a chunk of lean records or of headers.

A load, a chunk of records (`HostTable.append_records`) and a rebuild from
kept bytes fill every column from many decoded records with a few C-level
passes per column (`fill_lean`, `fill_headers`); full snapshots are gathered
entry by entry (`gather`) and each column filled from its gathered entries
(`cells.fill_quads`).  The cells are those of `cells.put_cell` of each row's
last record.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from itertools import compress, repeat
from operator import countOf
from typing import Any, Final

import msgspec
import numpy as np
import numpy.typing as npt

from crr.projections.host_table.bulk_values import entry_expiries
from crr.projections.host_table.cells import Quad, fill_present, fill_quads
from crr.projections.host_table.column import BoolArray, Column, FreshStrings, IntArray
from crr.projections.host_table.record_codec import RecordCodec
from crr.projections.host_table.rows import Rows
from crr.projections.host_table.string_pool import StringPool
from crr.projections.record.body import LeanEntry
from crr.projections.record.codes import ABSENT, FRESH, LEAN_CODES, Entry
from crr.projections.record.packing import unpack
from crr.schemas.snapshot import ValueEntry

_STATE: Final = operator.attrgetter("state")
_TWIN: Final = operator.attrgetter("expires_ts")
_VALUE: Final = operator.attrgetter("value")
_V: Final = operator.attrgetter("v")
_E: Final = operator.attrgetter("e")
_X: Final = operator.attrgetter("x")
_UNSET: Final = msgspec.UNSET
LEAN_FIELDS: Final = operator.attrgetter("state", "expires_ts", "expires_at", "value")
"""(state, expires_ts, expires_at, value) of a lean entry."""


def _twinless_fields(entry: ValueEntry) -> Quad:
    return entry.state, None, entry.expires_at, entry.value


ENTRY_FIELDS: Final[Callable[[Any], Quad]] = (
    LEAN_FIELDS if "expires_ts" in ValueEntry.__struct_fields__ else _twinless_fields
)
"""(state, expires_ts, expires_at, value) of a full entry (ValueEntry has the twin once
the projector writes it; until then it is None)."""
Gathered = tuple[list[int], list[Quad]]
"""One column's values before it is built: rows, and a `Quad` per row."""
NOTHING: Final[Gathered] = ([], [])


def gather(gathered: dict[str, Gathered], row: int, values: Mapping[str, Entry],
           fields: Callable[[Any], Quad], *, add: bool) -> None:
    """Add `row`'s entries to `gathered` (name -> rows and quads); `add`: make the lists of
    names not in it yet (else their entries are left out)."""
    get = gathered.get
    for name, entry in values.items():
        lists = get(name)
        if lists is None:
            if not add:
                continue
            lists = gathered[name] = ([], [])
        lists[0].append(row)
        lists[1].append(fields(entry))


def gather_docs(columns: dict[str, Column], codec: Callable[[], RecordCodec], rows: Rows,
                ) -> dict[str, Gathered]:
    """Every stored row's entries of the `columns`' resources, gathered (a rebuild); `codec`
    gives the table's record codec (asked only for lean rows)."""
    gathered: dict[str, Gathered] = {name: ([], []) for name in columns}
    docs = rows.docs
    for row in sorted(rows.at.values()):
        doc = docs[row]
        assert doc is not None, row
        values: Mapping[str, Entry]
        fields: Callable[[Any], Quad]
        if isinstance(doc, bytes):  # decoded before, so it decodes again
            values, fields = codec().items(unpack(doc)), LEAN_FIELDS
        else:
            values, fields = doc.values, ENTRY_FIELDS
        gather(gathered, row, values, fields, add=False)
    return gathered


def fill_gathered(columns: dict[str, Column], pool: StringPool,
                  gathered: dict[str, Gathered]) -> None:
    """Fill new `columns` from their gathered entries (`cells.fill_quads` of each)."""
    strings: FreshStrings = []
    for name, col in columns.items():
        col_rows, quads = gathered.get(name, NOTHING)
        if col_rows:
            fresh_strings = fill_quads(col, col_rows, quads)
            if fresh_strings is not None:
                strings.append((col, *fresh_strings))
    if strings:
        pool.code_fresh(strings)


def refill_lean(columns: dict[str, Column], codec: RecordCodec, pool: StringPool, rows: Rows,
                chunk: int) -> None:
    """Fill new `columns` from every (lean) row's kept bytes, `chunk` rows at a time."""
    decode, docs = codec.decode, rows.docs

    def record_at(row: int) -> bytes:
        doc = docs[row]
        assert isinstance(doc, bytes), row
        return unpack(doc)

    ordered = sorted(rows.at.values())
    for start in range(0, len(ordered), chunk):
        part = ordered[start:start + chunk]
        fill_lean(columns, codec, pool, np.asarray(part, dtype=np.int64),
                  [decode(record_at(r)).values for r in part])


def fill_lean(columns: dict[str, Column], codec: RecordCodec, pool: StringPool, rows: IntArray,
              values: list[Any], *, replace: bool = False, twins: bool = False) -> None:
    """Write the decoded values of `rows` into every column, one column at a time.

    Each column's entries are taken from the records' values in C (`map` of
    the column's field getter) and read with C-level passes (`map` of an
    attribute getter), so the per-value work is numpy's; rows without a
    value (`ABSENT_ENTRY`) are left as they are, or with `replace` (rows that
    may hold values, member columns that may exist) cleared as `put_cell`
    clears a cell.  A column whose entries are all fresh (the usual case) skips the
    state codes.  `twins`: every entry is a `TwinEntry` (its `expires_ts` is a number),
    so the expiries are read in one pass without looking for missing ones.
    """
    names, getters = codec.names, codec.getters()
    n = len(values)
    strings: FreshStrings = []
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
            codes = np.fromiter(map(LEAN_CODES.__getitem__, map(_STATE, entries)),
                                dtype=np.int8, count=n)
            present = codes != ABSENT
        # (an absent entry's expiry is ABSENT's +inf: read, then left out with it)
        expires = (np.fromiter(map(_TWIN, entries), dtype=np.float64, count=n) if twins
                   else entry_expiries(entries))
        fill_present(col, rows, codes, expires, list(map(_VALUE, entries)),
                     present=present, clear=replace, strings=strings)
    if strings:
        pool.code_fresh(strings)


def fill_headers(columns: dict[str, Column], codec: RecordCodec, pool: StringPool,
                 rows: IntArray, decoded: list[Any], *, replace: bool) -> None:
    """`fill_lean` for records read from their decoded `Crr-Columns` headers.

    A column's values are taken from every record's `v` in C (`map` of the
    field getter): fresh, expiring at the record's `e` (one array for all
    columns); the record's `x` entries of that name (stale values, other
    expiries: few) are put in place; a value that neither has is absent
    (`msgspec.UNSET`), left as it is or, with `replace`, cleared.
    """
    names, getters = codec.names, codec.getters()
    n = len(decoded)
    vs = list(map(_V, decoded))
    expiry = np.fromiter(map(_E, decoded), dtype=np.float64, count=n)
    fresh_codes = np.full(n, FRESH, dtype=np.int8)
    others: dict[str, list[tuple[int, tuple[Any, str, float]]]] = {}
    for i in compress(range(n), map(_X, decoded)):
        for name, entry in decoded[i].x.items():
            others.setdefault(name, []).append((i, entry))
    strings: FreshStrings = []
    for name, getter in zip(names, getters, strict=True):
        col = columns[name]
        values: list[Any] = list(map(getter, vs))
        codes, expires = fresh_codes, expiry
        extra = others.get(name)
        if extra is not None:
            codes, expires = codes.copy(), expires.copy()
            for i, (value, state, ts) in extra:
                values[i] = value
                codes[i] = LEAN_CODES[state]
                expires[i] = ts
        present = np.fromiter(map(operator.is_not, values, repeat(_UNSET)),
                              dtype=np.bool_, count=n) if countOf(values, _UNSET) else None
        fill_present(col, rows, codes, expires, values, present=present, clear=replace,
                     strings=strings)
    if strings:
        pool.code_fresh(strings)
