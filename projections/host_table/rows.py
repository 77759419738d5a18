"""The host table's rows: which host has which row, and what each row keeps.

One *row* per host, reused after a host is removed (free rows are handed
out lowest first); the capacity doubles when no row is free, and every
column grows with it (`on_grow`).  A row keeps either the snapshot upserted
or the record's bytes (a *lean* row: `crr.projections.record.packing` says how
they are kept); lean rows whose bytes are not packed yet are listed
(`unpacked`) for the background packing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from crr.projections.host_table.column import IntArray
from crr.projections.record.packing import is_packed
from crr.schemas.snapshot import HostSnapshot

INITIAL_CAPACITY: Final = 64

Doc = HostSnapshot | bytes
"""What a row keeps: the snapshot upserted, or the record's bytes (lean rows)."""


def _capacity_for(n: int, capacity: int) -> int:
    """`capacity` doubled until it holds `n` rows (how the table grows)."""
    while capacity < n:
        capacity *= 2
    return capacity


class Rows:
    """Hosts to rows, and the document each row keeps (see the module doc)."""

    __slots__ = ("_order", "_sorted_names", "at", "capacity", "docs", "free", "names",
                 "on_grow", "unpacked")

    def __init__(self, on_grow: Callable[[int], None]) -> None:
        self.on_grow = on_grow
        """Called with the new capacity when the rows grow (the columns grow with them)."""
        self.capacity = INITIAL_CAPACITY
        self.at: dict[str, int] = {}
        """Host -> its row."""
        self.names: list[str | None] = [None] * self.capacity
        self.docs: list[Doc | None] = [None] * self.capacity
        self.free: list[int] = list(range(self.capacity - 1, -1, -1))  # low rows first
        self.unpacked: dict[int, None] = {}
        """Lean rows whose record may be kept uncompressed (an ordered set; see `take_unpacked`)."""
        self._order: IntArray | None = None
        self._sorted_names: npt.NDArray[np.object_] | None = None

    def moved(self) -> None:
        """Hosts came or went: the sorted order is computed again when next asked."""
        self._order = None
        self._sorted_names = None

    def allocate(self, host: str) -> int:
        """A row for a new host (the lowest free one; the rows grow if none is)."""
        if not self.free:
            self.grow(self.capacity * 2)
        row = self.free.pop()
        self.at[host] = row
        self.names[row] = host
        self.moved()
        return row

    def grow(self, capacity: int) -> None:
        """`capacity` rows (and columns) from now on; the new rows are free."""
        old = self.capacity
        self.names.extend([None] * (capacity - old))
        self.docs.extend([None] * (capacity - old))
        self.on_grow(capacity)
        # Free rows are popped from the end: hand out low rows first.
        self.free.extend(range(capacity - 1, old - 1, -1))
        self.capacity = capacity

    def place(self, host: str, data: bytes) -> int:
        """The row of `host` (allocated if new), now keeping the record `data`."""
        row = self.at.get(host)
        if row is None:
            row = self.allocate(host)
        self.docs[row] = data
        self.unpacked[row] = None
        return row

    def release(self, row: int) -> None:
        """Free the row of a host taken out of `at`."""
        self.docs[row] = None
        self.names[row] = None
        self.unpacked.pop(row, None)
        self.free.append(row)
        self.moved()

    def take_free(self, n: int) -> list[int]:
        """`n` rows for new hosts, the ones `allocate` would give one by one (ascending)."""
        free = self.free
        take = min(n, len(free))
        rows = free[len(free) - take:]
        rows.reverse()
        del free[len(free) - take:]
        if take < n:  # the table grows as often as one-by-one allocation would make it
            self.grow(_capacity_for(self.capacity + n - take, self.capacity))
            more = free[len(free) - (n - take):]
            more.reverse()
            del free[len(free) - (n - take):]
            rows += more
        return rows

    def take_first(self, rows: dict[str, int], docs: list[Doc | None]) -> None:
        """Rows 0..n-1 of an empty table: `rows` names them, `docs` is what each keeps (the
        columns are built after this, at the capacity it sets)."""
        n = len(docs)
        capacity = self.capacity
        while capacity < n:
            capacity *= 2
        self.capacity = capacity
        self.names = [*rows, *([None] * (capacity - n))]
        self.docs = [*docs, *([None] * (capacity - n))]
        self.at = rows
        self.free = list(range(capacity - 1, n - 1, -1))  # popped from the end: low rows first
        self.moved()

    def assign(self, hosts: list[str], datas: Sequence[bytes], *,
               members: bool) -> tuple[list[int], Sequence[int], bool]:
        """Rows for a chunk of records of `hosts` (new hosts get rows as `allocate` would
        give them), each now keeping its host's last record of `datas`.

        Returns the rows, the index in the chunk of each one's record and whether the
        cells must be replaced (some host had a row, or a column has `members`: `members`),
        not only written.
        """
        table_rows = self.at
        last = dict(zip(hosts, range(len(hosts)), strict=True))
        """Each host's last record (a row depends on nothing else), in first-appearance order."""
        new = [h for h in last if h not in table_rows]
        replace = len(new) < len(last) or members
        rows: list[int] = []
        if new:
            rows = self.take_free(len(new))
            names = self.names
            if rows[-1] - rows[0] == len(rows) - 1:  # ascending and contiguous: a slice
                names[rows[0]:rows[-1] + 1] = new
            else:
                for row, host in zip(rows, new, strict=True):
                    names[row] = host
            table_rows.update(zip(new, rows, strict=True))
            self.moved()
        at: Sequence[int]
        if len(last) == len(hosts) and not replace:  # the usual load chunk: all new, in order
            at = range(len(hosts))
            all_rows = rows
        else:
            at = list(last.values())
            all_rows = list(map(table_rows.__getitem__, last))
        snaps = self.docs
        if all_rows[-1] - all_rows[0] == len(all_rows) - 1 and not replace:
            snaps[all_rows[0]:all_rows[-1] + 1] = datas if len(at) == len(datas) else [
                datas[i] for i in at]
        else:
            for row, i in zip(all_rows, at, strict=True):
                snaps[row] = datas[i]
        self.unpacked.update(dict.fromkeys(all_rows))
        return all_rows, at, replace

    def sorted_rows(self) -> IntArray:
        """Rows of the live hosts in host-name order."""
        if self._order is None:
            names = sorted(self.at)
            self._order = np.fromiter((self.at[h] for h in names), dtype=np.int64,
                                      count=len(names))
            self._sorted_names = np.array(names, dtype=object)
        return self._order

    def sorted_names(self) -> npt.NDArray[np.object_]:
        """Live host names, sorted (aligned with `sorted_rows`)."""
        if self._sorted_names is None:
            self.sorted_rows()
        assert self._sorted_names is not None
        return self._sorted_names

    def take_unpacked(self, limit: int) -> list[tuple[int, bytes]]:
        """Up to `limit` lean rows whose record is kept uncompressed, newest first (see
        `HostTable.unpacked`)."""
        out: list[tuple[int, bytes]] = []
        todo = self.unpacked
        snaps = self.docs
        pop = todo.popitem
        while todo and len(out) < limit:
            row = pop()[0]
            doc = snaps[row]
            if isinstance(doc, bytes) and not is_packed(doc):
                out.append((row, doc))
        return out

    def packed(self, rows: list[tuple[int, bytes]], packed: list[bytes]) -> int:
        """Keep `packed[i]` where `rows[i]`'s row still holds its bytes; how many did."""
        snaps = self.docs
        done = 0
        for (row, raw), small in zip(rows, packed, strict=True):
            if snaps[row] is raw:
                snaps[row] = small
                done += 1
        return done
