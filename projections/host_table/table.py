"""The scheduler's cached copy of the snapshot, held column-wise so `select[]` runs in numpy.

A `HostTable` holds one *row* per host (`rows`) and one `Column` per
host-scope resource of the catalog (`column`: the layout and the freshness
rule), string values coded into one pool (`string_pool`), and the
cluster-scope values.  `upsert` costs O(values in the old and the new
snapshot) plus O(changed set members); `set_catalog` rebuilds every column
from the stored snapshots.

Five ways in: `load` (full snapshots in bulk), `upsert` (one snapshot),
`append_records` (records' bytes in bulk, a chunk at a time, from their
`Crr-Columns` headers where they have them), and `upsert_row` /
`upsert_record` (one record's bytes, staged: `staging`).  The bulk paths
write many rows at once (`bulk_fill`); every path gives the table that
upserting each snapshot in turn gives.

Lean rows (the scheduler view): a record is read as far as the columns need
(`record_codec`: the lean body decode or the header, for the catalog's
host resources: state, value and expiry of each — nothing else) and only
its bytes are kept beside the columns; `get` decodes the full
`HostSnapshot` from those bytes on demand.  A host therefore costs its
columns' cells plus one bytes object, never a tree of Python objects that
the cyclic garbage collector must scan.  The expiry is the record's numeric
`expires_ts` twin when it has one, else its parsed `expires_at` (older
records).  A kept record whose full decode fails (the lean one succeeded)
makes `get` return None and is reported to `on_unreadable`.
Pure data structure: no IO, no clock.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import groupby
from typing import Any, Final

import msgspec
import numpy as np
import numpy.typing as npt

from crr.projections.host_table.bulk_fill import (
    ENTRY_FIELDS,
    Gathered,
    fill_gathered,
    fill_headers,
    fill_lean,
    gather,
    gather_docs,
    refill_lean,
)
from crr.projections.host_table.cells import put_cell
from crr.projections.host_table.column import ClusterValue, Column, IntArray
from crr.projections.host_table.record_codec import RecordCodec
from crr.projections.host_table.rows import Doc, Rows
from crr.projections.host_table.staging import Staged, write_staged
from crr.projections.host_table.string_pool import StringPool
from crr.projections.record.body import LeanRecord
from crr.projections.record.codes import ABSENT, Entry, entry_code
from crr.projections.record.packing import unpack
from crr.schemas.catalog import EMPTY_CATALOG, Catalog, Kind, ResourceSpec
from crr.schemas.codec import DECODERS
from crr.schemas.snapshot import ClusterSnapshot, HostSnapshot

LOAD_CHUNK: Final = 2048
"""Records a bulk load hands `HostTable.append_records` at a time (the scheduler view's load;
bounds the load's transient objects), and rebuilds a column from kept bytes."""
SMALL_BATCH: Final = 32
"""`append_records` of fewer records upserts them one by one (the column-wise passes have a
fixed cost per column: at 20 host resources they cost more per record than `upsert_row`
below about 30 records)."""
_POOL_COMPACT_MIN: Final = 65536
_HOST: Final = operator.attrgetter("host")
_VALUES: Final = operator.attrgetter("values")
_host_decoder: Final[msgspec.json.Decoder[HostSnapshot]] = DECODERS[HostSnapshot]


class HostTable:
    """Host snapshots plus their values as numpy columns; see the module doc."""

    def __init__(self, catalog: Catalog | None = None, *,
                 on_unreadable: Callable[[str, Exception], None] | None = None) -> None:
        """`on_unreadable(host, error)`: a lean row's record failed its full decode in `get`."""
        self._catalog: Catalog = catalog if catalog is not None else EMPTY_CATALOG
        self._on_unreadable = on_unreadable
        self._record_codec: RecordCodec | None = None
        """The decoders of records for the catalog's host resources (made on first use)."""
        self._staged = Staged()
        self._rows = Rows(self._grow_columns)
        self._columns: dict[str, Column] = {}
        self._cluster: ClusterSnapshot | None = None
        self._cluster_values: dict[str, ClusterValue] = {}
        self._pool = StringPool()
        self._build_columns()

    # -- the public surface -------------------------------------------------

    @property
    def catalog(self) -> Catalog:
        """The catalog the columns follow."""
        return self._catalog

    def set_catalog(self, catalog: Catalog) -> None:
        """Follow a new catalog: rebuild every column from the stored snapshots."""
        self._catalog = catalog
        self._record_codec = None
        self._build_columns()

    def _codec(self) -> RecordCodec:
        if self._record_codec is None:
            self._record_codec = RecordCodec(sorted(
                n for n, spec in self._catalog.resources.items() if spec.scope == "host"))
        return self._record_codec

    def decode_record(self, data: bytes) -> LeanRecord:
        """A host record's lean decode for this table's catalog (msgspec errors if invalid).

        Only for `upsert_row` of this table, before its catalog changes.
        """
        record: LeanRecord = self._codec().decode(data)
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
        if self._rows.at:
            for snap in snapshots:
                self._replace(snap.host, snap.values, snap)
            return
        rows: dict[str, int] = {}
        snaps: list[Doc | None] = []
        later: list[HostSnapshot] = []
        gathered: dict[str, Gathered] = {}
        for snap in snapshots:
            if snap.host in rows:
                later.append(snap)
                continue
            row = rows[snap.host] = len(snaps)
            snaps.append(snap)
            gather(gathered, row, snap.values, ENTRY_FIELDS, add=True)
        self._rows.take_first(rows, snaps)
        self._build_columns(gathered)
        for snap in later:
            self._replace(snap.host, snap.values, snap)

    def append_records(self, records: Sequence[bytes],
                       on_error: Callable[[int, Exception], None] | None = None,
                       columns: Sequence[str | None] | None = None) -> None:
        """`upsert_row` of each record's `decode_record` in turn, column-wise: one chunk of a load.

        The scheduler view feeds its cold start through this a chunk at a
        time while the records are still arriving.  Hosts the table does not
        have yet get rows (allocated as `upsert_row` would) that are filled
        column by column with a few C-level passes (`bulk_fill`); hosts it
        has, and repeats within the chunk, are upserted after them (the final
        state is the same: a row depends only on its host's last record).
        A record that does not decode is skipped and reported as
        `on_error(index in records, error)`.

        `columns`: each record's `Crr-Columns` header value, or None where it
        has none (`crr.projections.record.columns`).  A run of records that have
        one is read from them (~400 bytes to scan instead of ~6 kB), and gives
        the same table; the rest, and a run whose headers do not all decode,
        from the records themselves.
        """
        codec = self._codec()
        if columns is not None and len(records) >= SMALL_BATCH:
            decoded = codec.decode_headers(columns)
            start = 0
            for has, run in groupby(range(len(records)), lambda i: decoded[i] is not None):
                end = start + len(list(run))
                if has and end - start >= SMALL_BATCH:
                    if self._staged.at:
                        self.apply_staged()
                    self._append(decoded[start:end], records[start:end],
                                 lambda rows, chosen, replace: fill_headers(
                                     self._columns, codec, self._pool, rows, chosen,
                                     replace=replace))
                else:  # (a short run between records without columns: read whole)
                    self.append_records(
                        records[start:end], None if on_error is None else
                        lambda i, exc, at=start: on_error(at + i, exc))  # type: ignore[misc]
                start = end
            return
        if self._staged.at:  # rows this writes in place must not be overwritten by older ones
            self.apply_staged()
        leans, datas, all_twins = codec.decode_many(records, on_error)
        if not leans:
            return
        if len(leans) < SMALL_BATCH:  # a few records: row by row costs less
            for lean, data in zip(leans, datas, strict=True):
                self.upsert_row(lean, data)
            return
        self._append(leans, datas, lambda rows, chosen, replace: fill_lean(
            self._columns, codec, self._pool, rows, list(map(_VALUES, chosen)),
            replace=replace, twins=all_twins))

    def _append(self, leans: list[Any], datas: Sequence[bytes],
                fill: Callable[[IntArray, list[Any], bool], None]) -> None:
        """The rest of `append_records` once its records are decoded (`leans`, each with a
        `host`): rows for the new hosts, the records kept, `fill(rows, the decoded records
        of those rows, replace)` writes the columns."""
        all_rows, at, replace = self._rows.assign(
            list(map(_HOST, leans)), datas,
            members=any(col.members for col in self._columns.values()))
        fill(np.asarray(all_rows, dtype=np.int64),
             leans if len(at) == len(leans) else [leans[i] for i in at], replace)
        if replace:
            self._compact_pool()

    def upsert(self, snapshot: HostSnapshot) -> None:
        """Insert or replace one host's snapshot."""
        self._replace(snapshot.host, snapshot.values, snapshot)

    def upsert_record(self, data: bytes, columns: str | None = None) -> None:
        """`upsert_row` of the record `data`, read from its `Crr-Columns` header value
        `columns` when it has one that decodes, else from itself (msgspec errors if it does
        not decode)."""
        if columns is not None:
            codec = self._codec()
            try:
                decoded = codec.decode_header()(columns)
            except (msgspec.ValidationError, msgspec.DecodeError):
                pass
            else:
                row = self._rows.place(decoded.host, data)
                if self._staged.add_header(row, decoded, codec):
                    self.apply_staged()
                return
        self.upsert_row(self.decode_record(data), data)

    def upsert_row(self, lean: LeanRecord, data: bytes) -> None:
        """Insert or replace one host as a lean row: its `decode_record` and its bytes.

        The row and its record are the table's at once (`get`, `hosts`, `len`); its
        values are *staged* and written to the columns, together with every other
        staged row, by the next read of the columns (`column`, the string pool) or
        once `staging.STAGE_LIMIT` rows wait (`apply_staged`).
        """
        row = self._rows.place(lean.host, data)
        if self._staged.add_entries(row, self._codec().entries_of(lean.values)):
            self.apply_staged()

    def apply_staged(self) -> None:
        """Write the staged rows (`upsert_row`) into the columns now.

        Every read of the columns does this first; a caller may do it earlier
        to choose when the work is done.
        """
        staged = self._staged
        if not staged.at:
            return
        self._staged = Staged()
        write_staged(staged, self._columns, self._codec(), self._pool)
        self._compact_pool()

    @property
    def staged_count(self) -> int:
        """Rows upserted whose values are not in the columns yet (see `upsert_row`)."""
        return len(self._staged.at)

    def remove(self, host: str) -> None:
        """Forget a host (no error if it is not in the table)."""
        row = self._rows.at.pop(host, None)
        if row is None:
            return
        self._staged.at.pop(row, None)
        prev = self._rows.docs[row]
        if prev is not None:
            self._clear_others(row, prev, {})
        self._rows.release(row)

    def set_cluster(self, snapshot: ClusterSnapshot) -> None:
        """Replace the cluster-scope values."""
        self._cluster = snapshot
        self._build_cluster()

    def hosts(self) -> list[str]:
        """Host names, sorted."""
        return list(self.sorted_names())

    def get(self, host: str) -> HostSnapshot | None:
        """The stored snapshot of `host`, if any (a lean row's record is decoded now)."""
        doc = self.stored(host)
        if not isinstance(doc, bytes):
            return doc
        try:
            return _host_decoder.decode(unpack(doc))
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            if self._on_unreadable is not None:
                self._on_unreadable(host, exc)
            return None

    def stored(self, host: str) -> Doc | None:
        """What is stored for `host` (a record or its packed bytes), as is: its identity
        changes whenever the record is replaced or (re)packed, so it keys caches of facts
        derived from the record without decoding it."""
        row = self._rows.at.get(host)
        return None if row is None else self._rows.docs[row]

    def record(self, host: str) -> bytes | None:
        """A lean row's record bytes, as the stream stored them (None: not a lean row)."""
        doc = self.stored(host)
        return unpack(doc) if isinstance(doc, bytes) else None

    # -- packing: lean rows' records compressed (`crr.projections.record.packing`) --

    def unpacked(self, limit: int) -> list[tuple[int, bytes]]:
        """Up to `limit` lean rows whose record is kept uncompressed: (row, bytes), newest first.

        They are taken off the list; hand them back to `packed` (a row whose
        record changed in between is listed again).  Newest first: taking from
        the end of the dict is O(1), from its start costs a scan of every slot
        deleted before (quadratic over a long run of live updates).
        """
        return self._rows.take_unpacked(limit)

    def packed(self, rows: list[tuple[int, bytes]], packed: list[bytes]) -> int:
        """Keep `packed[i]` (`pack` of `rows[i]`'s bytes) where that row still holds those bytes.

        Returns how many were replaced.
        """
        return self._rows.packed(rows, packed)

    @property
    def unpacked_count(self) -> int:
        """Lean rows whose record is kept uncompressed (an upper bound)."""
        return len(self._rows.unpacked)

    def cluster(self) -> ClusterSnapshot | None:
        """The stored cluster snapshot, if any."""
        return self._cluster

    def __len__(self) -> int:
        return len(self._rows.at)

    def __contains__(self, host: object) -> bool:
        return host in self._rows.at

    # -- the evaluator's interface ------------------------------------------

    @property
    def capacity(self) -> int:
        """Number of rows every column has (live rows and free slots)."""
        return self._rows.capacity

    def row_of(self, host: str) -> int | None:
        """The row of `host`, if present."""
        return self._rows.at.get(host)

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
        return self._pool.code_of(text)

    def strings(self) -> list[str]:
        """The string pool, indexed by code."""
        if self._staged.at:
            self.apply_staged()
        return self._pool.strings

    def ranks(self) -> IntArray:
        """Rank (sorted position) of every pooled string, indexed by code."""
        if self._staged.at:
            self.apply_staged()
        return self._pool.ranks()

    def sorted_rows(self) -> IntArray:
        """Rows of the live hosts in host-name order."""
        return self._rows.sorted_rows()

    def sorted_names(self) -> npt.NDArray[np.object_]:
        """Live host names, sorted (aligned with `sorted_rows`)."""
        return self._rows.sorted_names()

    # -- internals ----------------------------------------------------------

    def _grow_columns(self, capacity: int) -> None:
        for col in self._columns.values():
            col.grow(capacity)

    def _replace(self, host: str, new: Mapping[str, Entry], doc: Doc) -> None:
        if self._staged.at:
            self.apply_staged()
        rows = self._rows
        row = rows.at.get(host)
        prev: Doc | None = None
        if row is None:
            row = rows.allocate(host)
        else:
            prev = rows.docs[row]
        rows.docs[row] = doc
        columns = self._columns
        for name, entry in new.items():
            col = columns.get(name)
            if col is not None:
                self._write(col, row, entry)
        if prev is not None:
            self._clear_others(row, prev, new)
        self._compact_pool()

    def _compact_pool(self) -> None:
        strings = len(self._pool.strings)
        if strings > _POOL_COMPACT_MIN and strings > 8 * (
            len(self._rows.at) * max(1, sum(c.kind == "string" for c in self._columns.values()))
        ):
            self._build_columns()  # the string pool grew with churn; re-encode it

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
        put_cell(col, row, entry_code(col.kind, entry), self._pool)

    def _build_columns(self, gathered: dict[str, Gathered] | None = None) -> None:
        """(Re)build every host column from the stored snapshots, column-wise.

        The same state as `_write` of every stored entry, row by row: one pass
        over the entries gathers each column's (row, state, expires_at, value)
        (`load` passes them in, gathered as it went), then each column is
        filled with a few numpy assignments.  A table of lean rows only is
        rebuilt from the kept bytes, a chunk of rows at a time (`fill_lean`).
        """
        self._staged = Staged()  # (their records are in the rows: rebuilt from there)
        self._pool = StringPool()
        self._columns = {
            name: Column(name, spec, self._rows.capacity)
            for name, spec in sorted(self._catalog.resources.items())
            if spec.scope == "host"
        }
        rows, docs = self._rows.at, self._rows.docs
        if gathered is None and rows and all(isinstance(docs[r], bytes) for r in rows.values()):
            refill_lean(self._columns, self._codec(), self._pool, self._rows, LOAD_CHUNK)
        else:
            fill_gathered(self._columns, self._pool, gathered if gathered is not None else
                          gather_docs(self._columns, self._codec, self._rows))
        self._build_cluster()

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
