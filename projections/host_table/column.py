"""One host-scope resource over every row of the host table, and a cluster-scope value.

A `Column` (one per host-scope resource of the catalog, one *row* per host):

- `state` (int8 state codes, `crr.projections.record.codes`: `ABSENT` never
  reported, `FRESH`, `STALE`, `NULL` — the reporter said null or the value is
  not of the resource's kind), `expires` (float64 epoch seconds; `+inf` for
  absent rows) and `values`: float64 for numeric, bool for boolean, int32
  codes into the table's one string pool for string (`string_pool`: codes
  are shared by all string columns, so two string resources compare by
  code), and the member count (float64) for string sets;
- a **string set** column also keeps each row's `frozenset` and, lazily, a
  bool *member column* per member that a compiled expression asked about
  (`has "x"`, `has_any`, `has_all`).  A member column is built by one scan
  the first time it is needed and then maintained by every write, which only
  touches the members that changed (the symmetric difference of the old and
  the new set).  At most `MAX_MEMBER_COLUMNS` are kept per resource, least
  recently used first out.

A `ClusterValue` is a **cluster-scope** resource: a scalar taken from the
ClusterSnapshot, the same value on every host.

Freshness at evaluation time `now` (`crr.projections.freshness`, the rule every
surface uses; `known`/`stale` are its vectorised form): a value is *stale*
when the snapshot says so **or** its `expires_at` ≤ `now` (this protects the
scheduler if the projector dies); otherwise it is *unknown* when it is null
(or not of the resource's kind), and *fresh* when it has a value.  A
resource never reported on a host is *never reported* (unknown, never stale).
"""

from __future__ import annotations

import math
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from crr.projections.record.codes import FRESH, NULL, STALE
from crr.schemas.catalog import Kind, ResourceSpec

MAX_MEMBER_COLUMNS: Final = 256
"""Member columns kept per string-set resource (least recently used are dropped)."""

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


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
        """A string-set column's sets by array, shared by bulk fills (`bulk_values.string_sets`)."""
        # Derived, maintained by every cell write (`cells`) so that evaluation at a `now` before
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



FreshStrings = list[tuple[Column, IntArray, list[str]]]
"""String columns' fresh rows and their texts, to be coded by the string pool at once."""
