"""Many values of one column made column-ready at once: expiries, numbers, string sets.

The bulk paths of the host table (a load, a chunk of records, the staged
rows) fill a column from a list of raw values; these turn such a list into
arrays with a few C-level passes, giving value for value what the one-value
rules give (`normalize`, `crr.projections.record.codes.entry_expiry`).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from itertools import chain
from typing import Any, Final

import numpy as np

from crr.projections.host_table.column import FloatArray
from crr.projections.record.body import LeanEntry
from crr.projections.validation import normalize
from crr.schemas.wire_time import expires_many

MAX_KNOWN_SETS: Final = 4096
"""Distinct string sets a string-set column remembers for the next bulk fill (see
`string_sets`): a load's chunks share them; more distinct sets than this start it over."""

_TWIN: Final = operator.attrgetter("expires_ts")
_NONE: Final = type(None)
_NUMBER_TYPES: Final = {float, int, _NONE}
_SET_TYPES: Final = {list, _NONE}


def expiries(twins: tuple[float | None, ...], texts: tuple[str, ...]) -> FloatArray:
    """`entry_expiry` of many entries: the twins where present, the parsed strings elsewhere."""
    if None not in twins:
        return np.array(twins, dtype=np.float64)
    missing = [i for i, t in enumerate(twins) if t is None]
    if len(missing) == len(twins):
        return expires_many(list(texts))
    out = np.array([math.nan if t is None else t for t in twins], dtype=np.float64)
    out[missing] = expires_many([texts[i] for i in missing])
    return out


def entry_expiries(entries: list[LeanEntry]) -> FloatArray:
    """`entry_expiry` of many lean entries: the twins where present, the parsed strings
    elsewhere."""
    twins = list(map(_TWIN, entries))
    if None not in twins:
        return np.array(twins, dtype=np.float64)
    missing = [i for i, t in enumerate(twins) if t is None]
    expires = np.array([math.nan if t is None else t for t in twins], dtype=np.float64)
    expires[missing] = expires_many([entries[i].expires_at for i in missing])
    return expires


def numeric_or_nan(value: Any) -> float:
    """`normalize("numeric", value)`, NaN for None (the bulk path's slow case)."""
    f = normalize("numeric", value)
    return math.nan if f is None else float(f)


def string_set(value: Any) -> frozenset[str] | None:
    """`normalize("string_set", value)` with a fast path for a JSON array of strings."""
    if type(value) is list:
        try:
            "".join(value)  # C-speed check that every member is a str
        except TypeError:
            return None
        return frozenset(value)
    result: frozenset[str] | None = normalize("string_set", value)
    return result


def numbers(raw: Sequence[Any]) -> FloatArray:
    """`numeric_or_nan` of every value: one C-level conversion when all are floats or ints."""
    if set(map(type, raw)) <= _NUMBER_TYPES:  # (None: NaN, as `numeric_or_nan` gives)
        try:
            return np.array(raw, dtype=np.float64)
        except OverflowError:  # an int beyond float: normalize makes it None (NaN)
            pass
    return np.array([v if type(v) is float else numeric_or_nan(v) for v in raw],
                    dtype=np.float64)


def string_sets(raw: Sequence[Any], known: dict[tuple[str, ...], frozenset[str]] | None = None,
                 ) -> list[frozenset[str] | None]:
    """`string_set` of every value: C-level passes when all are JSON arrays of strings
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
    return [string_set(v) for v in raw]
