"""The host table's one string pool: every string value of every string column, by code.

String columns hold int32 codes into this pool (-1: no string), so two
string resources compare by code and `select[]` compares strings as numbers
(`ranks` orders them).  Codes are handed out in the order strings are first
interned; the table re-encodes (rebuilds) the pool when churn has grown it
far beyond its live strings.
"""

from __future__ import annotations

import numpy as np

from crr.projections.host_table.column import FreshStrings, IntArray


class StringPool:
    """Strings by code and codes by string."""

    __slots__ = ("_ranks", "codes", "strings")

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self.strings: list[str] = []
        """The pool, indexed by code."""
        self._ranks: IntArray | None = None

    def intern(self, text: str) -> int:
        """The code of `text`, given a new one if it has none."""
        code = self.codes.get(text)
        if code is None:
            code = len(self.strings)
            self.codes[text] = code
            self.strings.append(text)
        return code

    def code_of(self, text: str) -> int:
        """The code of a string, or -2 if no stored value has it."""
        return self.codes.get(text, -2)

    def ranks(self) -> IntArray:
        """Rank (sorted position) of every pooled string, indexed by code."""
        if self._ranks is None or len(self._ranks) != len(self.strings):
            order = sorted(range(len(self.strings)), key=self.strings.__getitem__)
            ranks = np.empty(len(self.strings), dtype=np.int64)
            ranks[np.asarray(order, dtype=np.int64)] = np.arange(len(order), dtype=np.int64)
            self._ranks = ranks
        return self._ranks

    def code_fresh(self, columns: FreshStrings) -> None:
        """Intern the fresh strings of `columns` (column, rows, texts) row by row (as one
        write per row would), then write their codes."""
        rows = np.concatenate([r for _, r, _ in columns])
        texts = [t for _, _, ts in columns for t in ts]
        pool = self.codes
        intern = self.intern
        # The distinct texts in row order (C-level), interned in that order: the codes
        # interning every text row by row gives.
        for text in dict.fromkeys(map(texts.__getitem__,
                                      np.argsort(rows, kind="stable").tolist())):
            if text not in pool:
                intern(text)
        for col, col_rows, col_texts in columns:
            col.values[col_rows] = np.fromiter(map(pool.__getitem__, col_texts),
                                               dtype=np.int32, count=len(col_texts))
