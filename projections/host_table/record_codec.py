"""How a host table reads host records for its catalog: lean bodies and `Crr-Columns` headers.

One `RecordCodec` per catalog (its host resources, sorted: `names`), made
on first use: the lean decode of a record's body
(`crr.projections.record.body.lean_decoder`, twins first, else the strings),
its entry reader (a record's entries in the order of `names`), and the
decode of `Crr-Columns` header values (`crr.projections.record.columns`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from crr.projections.record.body import (
    ABSENT_ENTRY,
    LeanEntry,
    LeanRecord,
    TwinEntry,
    lean_decoder,
    lean_fields,
)
from crr.projections.record.columns import columns_decoder


class RecordCodec:
    """The decoders of host records for the host resources `names` (see the module doc)."""

    __slots__ = ("_column_at", "_columns", "_getters", "by_twins", "decode", "entries_of",
                 "names")

    def __init__(self, names: list[str]) -> None:
        self.names = names
        """The catalog's host resources, sorted: the order of every entry reader."""
        twins = lean_decoder(names, TwinEntry)[0].decode
        strings, entries_of = lean_decoder(names)
        by_strings = strings.decode

        def decode(data: bytes) -> Any:
            try:
                return twins(data)  # no string per value (see TwinEntry)
            except msgspec.ValidationError:  # a record without twins (older), or invalid
                return by_strings(data)

        self.decode: Callable[[bytes], Any] = decode
        """A record's lean decode (msgspec errors if it is not a valid host record)."""
        self.entries_of: Callable[[Any], Any] = entries_of
        """A lean record's values -> its entries, in the order of `names`."""
        self.by_twins: Callable[[bytes], Any] = twins
        """The decode of records with twins alone (a bulk load tries a whole chunk with it)."""
        self._getters: list[Callable[[Any], LeanEntry]] | None = None
        self._columns: Callable[[str], Any] | None = None
        self._column_at: dict[str, int] | None = None

    def getters(self) -> list[Callable[[Any], LeanEntry]]:
        """Per host resource (in the order of `names`), the getter of its entry in a lean
        record's values (or of its value in a decoded header's `v`)."""
        if self._getters is None:
            self._getters = lean_fields(len(self.names))
        return self._getters

    def column_at(self) -> dict[str, int]:
        """Host resource name -> its place in `names`."""
        if self._column_at is None:
            self._column_at = {name: i for i, name in enumerate(self.names)}
        return self._column_at

    def decode_header(self) -> Callable[[str], Any]:
        """The decode of a `Crr-Columns` header value (msgspec errors if it does not)."""
        decode = self._columns
        if decode is None:
            decode = self._columns = columns_decoder(self.names).decode
        return decode

    def decode_headers(self, columns: Sequence[str | None]) -> list[Any]:
        """Each `Crr-Columns` header value decoded, None where there is none or it does not
        decode (that record is read whole)."""
        decode = self.decode_header()
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

    def decode_many(self, records: Sequence[bytes],
                    on_error: Callable[[int, Exception], None] | None,
                    ) -> tuple[list[LeanRecord], Sequence[bytes], bool]:
        """The lean decodes of `records`, the records that decoded (in step with them), and
        whether every one decoded with `TwinEntry` (so every expiry is a number).  A record
        that does not decode is skipped and reported as `on_error(index, error)`."""
        try:
            return list(map(self.by_twins, records)), records, True
        except (msgspec.ValidationError, msgspec.DecodeError):  # older or bad ones: one by one
            pass
        leans: list[LeanRecord] = []
        kept: list[bytes] = []
        decode = self.decode
        for i, data in enumerate(records):
            try:
                leans.append(decode(data))
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                if on_error is not None:
                    on_error(i, exc)
                continue
            kept.append(data)
        return leans, kept, False

    def items(self, data: bytes) -> dict[str, LeanEntry]:
        """A record's entries by name (`data` unpacked), the absent ones left out."""
        values = self.decode(data).values
        return {name: e for name, e in zip(self.names, self.entries_of(values), strict=True)
                if e is not ABSENT_ENTRY}
