"""Lean rows of HostTable (the scheduler view's read path) equal the full decode of the records.

The view used to decode every record into a `HostSnapshot` and keep it; it
now lean-decodes (`crr.projections.record.body.lean_decoder`) and keeps the bytes.  On the same
records, `get()`, `explain`, `select` and every column must be what the full
decode gives — with and without the numeric `expires_ts` twins.
"""

from __future__ import annotations

import math
from typing import Any
from unittest import mock

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crr.projections.host_table import HostTable
from crr.projections.host_table import table as table_module
from crr.projections.record.columns import columns_of
from crr.projections.record.packing import pack
from crr.projections.select import compile_select, explain
from crr.schemas.codec import DECODERS, encode
from crr.schemas.snapshot import HostSnapshot
from crr.schemas.wire_time import expires_seconds, format_time
from tests.projections.test_host_table import _SNAPSHOTS, _assert_same_table, _without_twins
from tests.support.select import CATALOG, NOW, host_snapshot

EXPRESSIONS = [
    "free > 10", "ok", "!ok || free <= 3", 'os == "rhel9"', 'os < "m"', 'tags has "a"',
    'tags has_any ["b", "c"]', "count(tags) >= 1 && free > 0", "lic > 1", 'ds has "a"',
    'arch == "x86" || defined(os)',
]


def _full(record: bytes) -> HostSnapshot:
    decoded: HostSnapshot = DECODERS[HostSnapshot].decode(record)
    return decoded


def _load(table: HostTable, records: list[bytes]) -> None:
    """As the scheduler view loads: `append_records`, `LOAD_CHUNK` records at a time."""
    chunk = table_module.LOAD_CHUNK
    for start in range(0, len(records), chunk):
        table.append_records(records[start:start + chunk])


def _upsert(table: HostTable, record: bytes) -> None:
    table.upsert_row(table.decode_record(record), record)


def _with_twins(record: bytes) -> bytes:
    """The record with an `expires_ts` twin beside every value's `expires_at`, as the projector
    writes them: the epoch seconds the string says."""
    doc: dict[str, Any] = msgspec.json.decode(record)
    for entry in doc["values"].values():
        entry["expires_ts"] = expires_seconds(entry["expires_at"])
    return msgspec.json.encode(doc)


def _assert_same_answers(lean: HostTable, full: HostTable, hosts: list[str]) -> None:
    assert lean.hosts() == full.hosts()
    for host in hosts:
        assert _without_twins(lean.get(host)) == _without_twins(full.get(host))
    for text in EXPRESSIONS:
        compiled = compile_select(text, CATALOG)
        assert compiled.select(lean, NOW) == compiled.select(full, NOW), text
        for host in hosts:
            assert explain(compiled, lean, host, NOW) == explain(compiled, full, host, NOW), \
                (text, host)


_TWIN_SAFE_SNAPSHOTS = _SNAPSHOTS.filter(
    lambda s: all(math.isfinite(expires_seconds(e.expires_at)) for e in s.values.values()))
"""Snapshots whose every expires_at parses (a projector writes only those, with twins)."""


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@settings(max_examples=150, deadline=None)
@given(st.lists(_SNAPSHOTS, max_size=40), st.booleans(), st.integers(1, 7))
def test_lean_rows_equal_the_full_decode(snaps: list[HostSnapshot], bulk: bool,
                                         chunk: int) -> None:
    """Random records (every state, wrong kinds, odd timestamps, repeated hosts): a table of
    lean rows — loaded in bulk (in chunks of any size) or upserted one by one — has the
    columns, get(), select and explain of the table of the same records fully decoded."""
    records = [encode(s) for s in snaps]
    full = HostTable(CATALOG)
    lean = HostTable(CATALOG)
    if bulk:
        full.load(_full(r) for r in records)
        with mock.patch.object(table_module, "LOAD_CHUNK", chunk):
            _load(lean, records)
    else:
        for r in records:
            full.upsert(_full(r))
            _upsert(lean, r)
    hosts = sorted({s.host for s in snaps})
    _assert_same_table(lean, full, strict_pool=False, same_docs=False)
    _assert_same_answers(lean, full, [*hosts, "absent-host"])
    with mock.patch.object(table_module, "LOAD_CHUNK", chunk):
        lean.set_catalog(CATALOG)  # rebuilt from the kept bytes
    _assert_same_table(lean, full, strict_pool=False, same_docs=False)


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@settings(max_examples=100, deadline=None)
@given(st.lists(_TWIN_SAFE_SNAPSHOTS, max_size=30), st.booleans())
def test_twins_give_the_columns_of_the_strings(snaps: list[HostSnapshot], bulk: bool) -> None:
    """Records carrying `expires_ts` twins give, bit for bit, the columns and answers that
    parsing their `expires_at` strings gives (old records, full decode)."""
    records = [encode(s) for s in snaps]
    full = HostTable(CATALOG)
    lean = HostTable(CATALOG)
    for r in records:
        full.upsert(_full(r))
    if bulk:
        _load(lean, [_with_twins(r) for r in records])
    else:
        for r in records:
            _upsert(lean, _with_twins(r))
    _assert_same_table(lean, full, strict_pool=False, same_docs=False)
    _assert_same_answers(lean, full, sorted({s.host for s in snaps}))


def test_a_mix_of_records_with_and_without_twins() -> None:
    """Old records (strings only) and new ones (with twins) side by side, in a bulk load
    and live: each row's expiry comes from its own record."""
    old = encode(host_snapshot("old", {"free": 5.0}, now=NOW - 14))  # expires at NOW + 30
    new = _with_twins(encode(host_snapshot("new", {"free": 7.0}, now=NOW + 16)))  # NOW + 60
    table = HostTable(CATALOG)
    _load(table, [old, new])
    col = table.column("free")
    assert col is not None
    assert col.expires[table.row_of("old")] == expires_seconds(format_time(NOW + 30))
    assert col.expires[table.row_of("new")] == expires_seconds(format_time(NOW + 60))
    assert compile_select("free > 1", CATALOG).select(table, NOW + 45) == ["new"]
    _upsert(table, _with_twins(old))
    assert compile_select("free > 1", CATALOG).select(table, NOW + 45) == ["new"]


def test_the_twin_is_what_the_column_reads() -> None:
    """When a record has a twin, the column takes it (no string parsed), in both paths."""
    doc: dict[str, Any] = msgspec.json.decode(
        encode(host_snapshot("h", {"free": 5.0})))
    doc["values"]["free"]["expires_ts"] = NOW + 1000.25
    record = msgspec.json.encode(doc)
    bulk = HostTable(CATALOG)
    _load(bulk, [record])
    live = HostTable(CATALOG)
    _upsert(live, record)
    for table in (bulk, live):
        col = table.column("free")
        assert col is not None
        assert col.expires[table.row_of("h")] == NOW + 1000.25


def test_lean_rows_keep_bytes_not_snapshots() -> None:
    """A lean row keeps the record's bytes (the same object); get() decodes a new snapshot."""
    record = encode(host_snapshot("h", {"free": 5.0, "tags": ["a"]}))
    table = HostTable(CATALOG)
    _upsert(table, record)
    assert table.record("h") is record
    assert table.get("h") == _full(record)
    assert table.get("h") is not table.get("h")


def test_lean_upsert_clears_values_the_new_record_lacks() -> None:
    """A lean row replaced by a record without a value clears that cell (the names of the old
    record are not kept: the columns are asked)."""
    table = HostTable(CATALOG)
    _upsert(table, encode(host_snapshot("h", {"free": 5.0, "os": "rhel9"})))
    _upsert(table, encode(host_snapshot("h", {"free": 6.0})))
    assert compile_select('os == "rhel9"', CATALOG).select(table, NOW) == []
    assert compile_select("free > 5.5", CATALOG).select(table, NOW) == ["h"]
    table.remove("h")
    assert table.hosts() == []
    col = table.column("free")
    assert col is not None
    assert not np.any(col.fresh)


def test_a_record_whose_full_decode_fails_is_reported_not_raised() -> None:
    """The lean decode reads only the values: a record whose other parts are invalid is a
    lean row, and get() reports it (callback) and answers None instead of raising."""
    doc: dict[str, Any] = msgspec.json.decode(encode(host_snapshot("h", {"free": 5.0})))
    doc["reporters"] = 5
    record = msgspec.json.encode(doc)
    seen: list[tuple[str, str]] = []
    table = HostTable(CATALOG, on_unreadable=lambda host, exc: seen.append((host, str(exc))))
    _upsert(table, record)
    assert table.get("h") is None
    assert seen == [("h", "Expected `object`, got `int` - at `$.reporters`")]
    assert compile_select("free > 1", CATALOG).select(table, NOW) == ["h"]
    why = explain(compile_select("free > 1", CATALOG), table, "h", NOW)
    assert why.in_table


def test_lean_decode_rejects_what_the_full_decode_rejects_in_values() -> None:
    """An invalid value entry (unknown state, missing expires_at) fails the lean decode as it
    fails the full one, so the view skips the record either way."""
    for bad in ({"state": "bogus", "value": 1, "expires_at": "x"}, {"state": "fresh", "value": 1}):
        record = msgspec.json.encode({"host": "h", "as_of": {"seq": 1, "time": "t"},
                                      "values": {"free": bad}})
        with pytest.raises(msgspec.ValidationError):
            HostTable(CATALOG).decode_record(record)
        with pytest.raises(msgspec.ValidationError):
            _full(record)


def test_a_bulk_load_skips_and_reports_what_does_not_decode() -> None:
    """Undecodable records in a bulk load go to on_error with their index; the rest load,
    and the capacity is what loading the good ones alone gives."""
    good = [encode(host_snapshot(f"h{i}", {"free": float(i)})) for i in range(70)]
    records = [good[0], b"{nope", *good[1:], b'{"host": 1}']
    errors: list[int] = []
    table = HostTable(CATALOG)
    table.append_records(records, on_error=lambda i, _exc: errors.append(i))
    assert errors == [1, 71]
    alone = HostTable(CATALOG)
    alone.append_records(good)
    _assert_same_table(table, alone, strict_pool=True, same_docs=False)
    assert compile_select("free >= 69", CATALOG).select(table, NOW) == ["h69"]


def test_packing_keeps_the_answers_and_skips_rows_that_changed() -> None:
    """Packed (compressed) records give the same get() and record(); a row updated between
    `unpacked` and `packed` keeps its new record, and is listed again."""
    records = [encode(host_snapshot(f"h{i}", {"free": float(i)})) for i in range(5)]
    table = HostTable(CATALOG)
    table.append_records(records)
    batch = table.unpacked(10)
    assert sorted(row for row, _ in batch) == [0, 1, 2, 3, 4]  # (newest first)
    newer = encode(host_snapshot("h2", {"free": 42.0}))
    _upsert(table, newer)
    assert table.packed(batch, [pack(raw) for _, raw in batch]) == 4
    assert table.unpacked_count == 1
    for i in (0, 1, 3, 4):
        assert table.record(f"h{i}") == records[i]
        assert table.get(f"h{i}") == _full(records[i])
    assert table.record("h2") is newer
    assert table.unpacked(10) == [(2, newer)]
    table.set_catalog(CATALOG)  # rebuilt from packed and unpacked bytes alike
    assert compile_select("free > 40", CATALOG).select(table, NOW) == ["h2"]


def _columns(record: bytes, mode: str, k: int) -> str | None:
    """The record's columns header as the projector writes it, for `mode` "all"; none for
    "none"; every other one for "some"; for "bad", every third one undecodable."""
    if mode == "none" or (mode == "some" and k % 2) or (mode == "bad" and k % 3 == 0):
        return '{"host": 1}' if mode == "bad" else None
    snap = _full(record)
    return encode(columns_of(snap.host, snap.values)).decode()


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_SNAPSHOTS, max_size=12), min_size=1, max_size=6),
       st.lists(st.sampled_from(["h0", "h1", "h2", "a", "b"]), max_size=3),
       st.sampled_from(["", "a", "b"]), st.booleans(),
       st.sampled_from(["none", "all", "some", "bad"]))
def test_batches_equal_upserts_one_by_one(batches: list[list[HostSnapshot]], removed: list[str],
                                          member: str, twins: bool, columns: str) -> None:
    """`append_records` of batches — new hosts, hosts the table has (rewritten in place,
    cells the new record lacks cleared), repeats within a batch, removals between batches,
    member columns already built; records with and without twins, with twins also with
    columns headers (on all, on some, some undecodable) — gives the table (and the member
    columns) that `upsert_row` of every record in turn gives; so does `upsert_record` of
    every record with its header (the view's live path)."""
    one_by_one = HostTable(CATALOG)
    batched = HostTable(CATALOG)
    live = HostTable(CATALOG)
    if member:  # a member column built before any row, maintained by every write after
        for table in (one_by_one, batched, live):
            col = table.column("tags")
            assert col is not None
            col.member(member)
    with mock.patch.object(table_module, "SMALL_BATCH", 1):
        for i, snaps in enumerate(batches):
            records = [_with_twins(encode(s)) if twins else encode(s) for s in snaps]
            headers = [_columns(r, columns, k) if twins else None
                       for k, r in enumerate(records)]
            for r, header in zip(records, headers, strict=True):
                _upsert(one_by_one, r)
                live.upsert_record(r, header)
            batched.append_records(records, columns=headers if twins else None)
            if i == 0:
                for table in (one_by_one, batched, live):
                    for host in removed:
                        table.remove(host)
    for table in (batched, live):
        _assert_same_table(table, one_by_one, strict_pool=False, same_docs=False)
        for name in ("tags", "ds"):
            col, other = one_by_one.column(name), table.column(name)
            assert col is not None
            assert other is not None
            assert col.members.keys() == other.members.keys()
            for m, bits in col.members.items():
                assert np.array_equal(other.members[m], bits), (name, m)
    for table in (batched, live):  # (after: the queries build member columns)
        _assert_same_answers(table, one_by_one, sorted(one_by_one.hosts()))
