"""Rows upserted one by one, staged, and written to the columns many at a time.

`HostTable.upsert_row` / `upsert_record` make a row and its record the
table's at once; its values wait here (`Staged`) until the next read of the
columns, or until `STAGE_LIMIT` rows wait, and are then written together
(`write_staged`): one column-wise pass over many rows costs a fraction of
writing each row's cells one by one, and no reader can tell the difference.
"""

from __future__ import annotations

import math
import operator
from array import array
from collections.abc import Sequence
from itertools import repeat
from operator import countOf
from typing import Any, Final

import msgspec
import numpy as np

from crr.projections.host_table.cells import fill_present
from crr.projections.host_table.column import Column, FreshStrings
from crr.projections.host_table.record_codec import RecordCodec
from crr.projections.host_table.string_pool import StringPool
from crr.projections.record.body import LeanEntry
from crr.projections.record.codes import ABSENT, FRESH, LEAN_CODES, entry_expiry

STAGE_LIMIT: Final = 1024
"""Rows staged at most before they are written to the columns without waiting for a read
(bounds the work of one write and the decoded values held)."""

_STATE: Final = operator.attrgetter("state")
_TWIN: Final = operator.attrgetter("expires_ts")
_VALUE: Final = operator.attrgetter("value")
_UNSET: Final = msgspec.UNSET


class Staged:
    """Rows upserted but not written to the columns yet.

    Each record's entries are flattened when it is staged, while its decoded
    objects are hot: per record, one (state, expiry, value) per host resource
    in the codec's order, so writing them is a few C-level passes over flat
    lists (and no pass over the decoded objects) however many are staged.
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

    def add_entries(self, row: int, entries: Sequence[LeanEntry]) -> bool:
        """Stage `row`'s lean entries (one per host resource); True once `STAGE_LIMIT` rows
        wait."""
        self.at[row] = len(self.rows)  # a row depends only on its host's last record
        self.rows.append(row)
        self.states += map(_STATE, entries)
        twins = list(map(_TWIN, entries))
        self.expires.extend(twins if None not in twins else map(entry_expiry, entries))
        self.values += map(_VALUE, entries)
        return len(self.at) >= STAGE_LIMIT

    def add_header(self, row: int, decoded: Any, codec: RecordCodec) -> bool:
        """Stage `row` from its decoded `Crr-Columns` header: the same cells as its lean
        entries.  A value in `v` is fresh (unknown when null) and expires at `e`; one in `x`
        is as it says; the others are absent.  True once `STAGE_LIMIT` rows wait."""
        values = list(codec.entries_of(decoded.v))  # (the same fields as a lean record's)
        n = len(values)
        self.at[row] = len(self.rows)
        self.rows.append(row)
        if decoded.x is None and not countOf(values, _UNSET):  # a host's steady state
            self.states += repeat("fresh", n)
            self.expires.extend(repeat(decoded.e, n))
            self.values += values
        else:
            states = ["absent" if v is _UNSET else "fresh" for v in values]
            expires = [math.inf if v is _UNSET else decoded.e for v in values]
            if decoded.x:
                index = codec.column_at()
                for name, (value, state, ts) in decoded.x.items():
                    i = index.get(name)
                    if i is not None:
                        values[i], states[i], expires[i] = value, state, ts
            self.states += states
            self.expires.extend(expires)
            self.values += [None if v is _UNSET else v for v in values]
        return len(self.at) >= STAGE_LIMIT


def write_staged(staged: Staged, columns: dict[str, Column], codec: RecordCodec,
                 pool: StringPool) -> None:
    """Write the staged rows into `columns`: the same cells as a bulk fill with `replace`
    of each row's last record, one column at a time, from the flat lists."""
    width = len(codec.names)
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
        map(LEAN_CODES.__getitem__, states), dtype=np.int8,
        count=n * width).reshape(n, width).T.copy()
    fresh_codes = np.full(n, FRESH, dtype=np.int8)
    strings: FreshStrings = []
    for j, col in enumerate(map(columns.__getitem__, codec.names)):
        codes = fresh_codes if codes_by_col is None else codes_by_col[j]
        fill_present(col, rows, codes, by_col[j], values[j::width],
                     present=None if codes_by_col is None else codes != ABSENT,
                     clear=True, strings=strings)
    if strings:
        pool.code_fresh(strings)
