"""Writing into a column's cells: one cell, or many rows at once with numpy.

`put_cell` writes one row's (state code, expiry, normalized value) — what
`crr.projections.record.codes.entry_code` says of an entry — and keeps the
derived arrays (`fresh`, `stale_flag`, the boolean and member columns,
`min_expiry`) in step.  The bulk writes (`fill_quads`, `fill_cells`,
`fill_present`, `clear_cells`) give, for many rows at once, the cells
`put_cell` of each row would; a string column's codes are left to the
string pool (`StringPool.code_fresh`), which interns them in row order.
"""

from __future__ import annotations

import math
import operator
from itertools import repeat
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from crr.projections.host_table.bulk_values import expiries, numbers, string_sets
from crr.projections.host_table.column import BoolArray, Column, FloatArray, FreshStrings, IntArray
from crr.projections.host_table.string_pool import StringPool
from crr.projections.record.codes import ABSENT, FRESH, NULL, STALE, STATE_CODES

Quad = tuple[str, float | None, str, Any]
"""One entry as a bulk fill reads it: (state, expires_ts, expires_at, value)."""


def put_cell(col: Column, row: int, cell: tuple[int, float, Any], pool: StringPool) -> None:
    """Write one cell: (state code, expiry, normalized value), as `entry_code` gives them."""
    code, expires, value = cell
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
        col.values[row] = pool.intern(value) if value is not None else -1
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

def clear_cells(col: Column, rows: IntArray) -> None:
    """`put_cell(col, row, (ABSENT, inf, None), pool)` of every row in `rows` (vectorised)."""
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

def fill_quads(col: Column, rows: list[int], quads: list[Quad],
               ) -> tuple[IntArray, list[str]] | None:
    """Write (state, expiry, value) at `rows` of a new column, as `put_cell` would.

    A string column's codes are left to `StringPool.code_fresh`: this returns
    its fresh rows and their strings.
    """
    n = len(rows)
    idx = np.asarray(rows, dtype=np.int64)
    states, twins, texts, raw = zip(*quads, strict=True)
    codes = STATE_CODES.get
    # 1 fresh, 2 stale, anything else NULL: entry_code's first two tests.
    state = np.fromiter([codes(st, NULL) for st in states], dtype=np.int8, count=n)
    return fill_cells(col, idx, state, expiries(twins, texts), raw)

def fill_cells(col: Column, idx: IntArray, state: npt.NDArray[np.int8], expires: FloatArray,
               raw: tuple[Any, ...] | list[Any]) -> tuple[IntArray, list[str]] | None:
    """`fill_quads` once the state codes (FRESH, STALE or NULL) and expiries are arrays."""
    n = len(idx)
    kind = col.kind
    num: FloatArray | None = None
    trues: BoolArray | None = None
    falses: BoolArray | None = None
    sets: list[frozenset[str] | None] = []
    if kind == "numeric":
        num = numbers(raw)
        valid = np.isfinite(num)
    elif kind == "boolean":
        trues = np.fromiter(map(operator.is_, raw, repeat(True)), dtype=np.bool_, count=n)
        falses = np.fromiter(map(operator.is_, raw, repeat(False)), dtype=np.bool_, count=n)
        valid = trues | falses
    elif kind == "string":
        valid = np.fromiter(map(isinstance, raw, repeat(str)), dtype=np.bool_, count=n)
    else:
        sets = string_sets(raw, col.known_sets)
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
        col.values[idx] = -1  # the fresh rows get their codes from `StringPool.code_fresh`
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

def fill_present(col: Column, rows: IntArray, codes: npt.NDArray[np.int8], expires: FloatArray,
                 raw: list[Any], *, present: BoolArray | None, clear: bool,
                 strings: FreshStrings) -> None:
    """`fill_cells` of the rows where `present` (None: all of them); the others are
    cleared with `clear`, else left as they are.  A string column's fresh rows and their
    texts go to `strings` (for `StringPool.code_fresh`)."""
    idx = rows
    if present is not None and not present.all():
        if clear:
            clear_cells(col, rows[~present])
        if not present.any():
            return
        where = np.flatnonzero(present)
        raw = list(map(raw.__getitem__, where.tolist()))
        idx, expires, codes = rows[where], expires[where], codes[where]
    fresh_strings = fill_cells(col, idx, codes, expires, raw)
    if fresh_strings is not None:
        strings.append((col, *fresh_strings))

