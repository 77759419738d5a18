"""The host record: every representation of it, where each is written and where it is read.

One host's record (docs/contract.md, "Payloads", `crr.v1.snapshot.host.<host>`; the cluster
record is the same without a host) exists in these forms; each module here
holds the writer and the reader of its form side by side:

- **the fold's state** (`crr.projections.state`: `Record`, `Batch`): written by
  `crr.projections.fold`; read by every writer below.
- **the `HostSnapshot` Struct** (`crr.schemas.snapshot`): written by
  `record.snapshot.host_snapshot` (replay, history, tests); read by
  `crr.projections.freshness` (`host_at`), REST, `crr hosts`, `explain`.
- **the body**, the record's JSON bytes: written by `record.body.host_record`
  (the projector: `encode(host_snapshot)`, byte for byte, spliced from
  pieces); read in full by `crr.schemas.codec.DECODERS[HostSnapshot]`, and lean
  by `record.body.lean_decoder` (the host table: state, value and expiry of
  the catalog's host resources, nothing else).
- **the `Crr-Columns` header**, those columns in compact JSON: written by
  `record.columns.host_columns` (the rule: `columns_of`) and sent beside the
  body by `crr.projector.snapshot_writer`; read by
  `record.columns.columns_decoder` (the host table), else the body is.
- **kept bytes**, the body as the scheduler view keeps it: written by
  `record.packing.pack` (the view packs in the background); read by
  `record.packing.unpack` (the host table, on every read of a kept record).
- **a column's cells** (`crr.projections.host_table`): state code, expiry and
  value, written from each entry by `record.codes.entry_code` and the
  table's writes; read by `select[]`, `explain` and exports, through
  `crr.projections.freshness.freshness_at`.

The state codes (`record.codes`: `ABSENT`, `FRESH`, `STALE`, `NULL`,
`Freshness`) are the columns' vocabulary, shared by the host table and
`crr.projections.freshness`.  Layers: this package is in `projections/` (it
builds records from the fold's state); `schemas/` holds the wire Structs it
writes and reads, and imports nothing of it.  Where a snapshot record goes
by its subject (host, cluster, status) is routed by its readers in `ops/`.
"""
