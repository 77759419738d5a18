"""A host record's `Crr-Columns` header: written by the projector, read by the host table.

The columns header (`COLUMNS_HEADER`, docs/contract.md, "crr's additions to the wire format"): the
projector sends each host record with a NATS header holding just its
columns in compact JSON, `{"e": E, "host": H, "v": {name: value}, "x":
{name: [value, state, expires_ts]}}`: `v` has the values whose state is
"fresh" (or "unknown", as null) and whose `expires_ts` is `e`, `x` every
other value (stale ones; other expiries); `e` and `x` are left out when
empty.  It is derived from the record's own entries and says nothing the
body does not; the scheduler view decodes ~400 bytes per host instead of
~6 kB.

**Written**: `columns_of` is the rule (from a record's entries);
`host_columns` builds the header of `crr.projections.record.body.host_record`
(a host's steady state without entry objects; `tests/projections/test_record_encoding.py`
checks it against `columns_of`); `crr.projector.snapshot_writer` sends it.

**Read**: `columns_decoder` (`crr.projections.host_table`: `upsert_record`,
`append_records`).  A record without it (another writer, an older
projector, a host whose columns would exceed `COLUMNS_MAX`) or with one that
does not decode is read from its body, as always.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec

from crr.projections.record.body import encode_sorted, field_names
from crr.projections.record.snapshot import value_entries
from crr.projections.state import ProjectionState, ReporterRecord
from crr.schemas.snapshot import ValueEntry, ValueState

COLUMNS_HEADER: Final = "Crr-Columns"
"""The NATS header of a host record that holds its columns (see the module doc)."""
COLUMNS_MAX: Final = 32 * 1024
"""A host's columns longer than this (bytes of JSON) are not sent as a header: a header
that large would only add to a record that large, and the body says the same."""


def columns_of(host: str, entries: Mapping[str, ValueEntry]) -> dict[str, Any]:
    """The columns (`COLUMNS_HEADER`, before encoding) of a host record with these value
    entries (which carry their `expires_ts` twins).

    `e` is the expiry most entries of `v` share (the first such, on a tie);
    an entry goes in `v` when it expires then and is fresh, or unknown with
    a null value (what `v` says of a null); in `x` otherwise.
    """
    common = Counter(entry.expires_ts for entry in entries.values() if _plain(entry))
    e = common.most_common(1)[0][0] if common else None
    v: dict[str, Any] = {}
    x: dict[str, tuple[Any, str, float | None]] = {}
    for name, entry in entries.items():
        if entry.expires_ts == e and _plain(entry):
            v[name] = entry.value
        else:
            x[name] = (entry.value, entry.state, entry.expires_ts)
    return _assembled(host, e, v, x)


def _assembled(host: str, e: float | None, v: dict[str, Any], x: dict[str, Any],
               ) -> dict[str, Any]:
    """The columns object: `e` and `v` left out when `v` is empty, `x` when it is."""
    out: dict[str, Any] = {"host": host}
    if v:
        out["e"] = e
        out["v"] = v
    if x:
        out["x"] = x
    return out


def _plain(entry: ValueEntry) -> bool:
    """Whether `v` can say what `entry` says (see `columns_of`)."""
    return entry.state == "fresh" or (entry.state == "unknown" and entry.value is None)


def host_columns(state: ProjectionState, host: str) -> str | None:
    """The `COLUMNS_HEADER` value of `host_record(state, host)`, or None when it would be
    longer than `COLUMNS_MAX`.

    `columns_of` the record's entries; a host's steady state (one reporter's one
    report of all its values, none stale: one expiry) is built without entry
    objects.
    """
    rec = state.hosts[host]
    if len(rec.reporters) == 1:
        ((reporter, rs),) = rec.reporters.items()
        uniform = state.plan.uniform_life.get((reporter, "host"))
        if len(rs.batches) == 1 and uniform is not None:
            b = rs.batches[0]
            if not b.stale and b.names:  # (one expiry: every value goes in `v`)
                return _columns_bytes(b"".join((
                    b'{"e":', encode_sorted(b.received_at + uniform), b',"host":',
                    encode_sorted(host), b',"v":', encode_sorted(b.values), b"}")))
        return _columns_bytes(encode_sorted(
            _uniform_columns(host, rs, uniform) if uniform is not None and not any(
                b.stale for b in rs.batches) else columns_of(host, value_entries(state, rec))))
    return _columns_bytes(encode_sorted(columns_of(host, value_entries(state, rec))))


def _uniform_columns(host: str, rs: ReporterRecord, life: float) -> dict[str, Any]:
    """`columns_of(host, value_entries(...))` of a record whose one reporter (of one lifetime
    for all its values) has several batches, none stale (a full report, then partial ones):
    the same dict without an entry object per value.  Entries are met in the order
    `value_entries` makes them (oldest batch first, a name where it was first set), so `e`
    breaks ties alike; none is stale, so each is fresh, or unknown with a null value."""
    entries: dict[str, tuple[Any, float]] = {}
    for b in rs.batches:
        expires = b.received_at + life
        for name, value in zip(b.names, b.vals, strict=True):
            entries[name] = (value, expires)
    e = Counter(at for _, at in entries.values()).most_common(1)[0][0] if entries else None
    v: dict[str, Any] = {}
    x: dict[str, tuple[Any, str, float]] = {}
    for name, (value, at) in entries.items():
        if at == e:
            v[name] = value
        else:
            x[name] = (value, "unknown" if value is None else "fresh", at)
    return _assembled(host, e, v, x)


def _columns_bytes(data: bytes) -> str | None:
    if not data.isascii():  # (rare) JSON's \u escapes: header values stay ASCII, which every
        # NATS client reads alike (nats-py's email-based parsing makes others `Header` objects)
        data = json.dumps(msgspec.json.decode(data), ensure_ascii=True,
                          separators=(",", ":")).encode()
    return data.decode() if len(data) <= COLUMNS_MAX else None


def columns_decoder(names: Sequence[str]) -> msgspec.json.Decoder[Any]:
    """A decoder of `COLUMNS_HEADER` values for the resources `names`.

    It gives a Struct with `host`, `e` (inf when absent), `v` (a Struct with
    one field per name, read by `lean_fields(len(names))`; `msgspec.UNSET`
    where the header has no value of that name in `v`) and `x` (name ->
    (value, state, expires_ts), or None).  Names not in `names` are skipped
    in `v` (not in `x`: callers look up their own).
    """
    fields = field_names(len(names))
    values = msgspec.defstruct(
        "ColumnValues", [(f, Any, msgspec.UNSET) for f in fields],
        rename=dict(zip(fields, names, strict=True)), frozen=True, gc=False, kw_only=True)
    record = msgspec.defstruct(
        "ColumnsRecord",
        [("host", str), ("e", float, math.inf),
         ("v", values, msgspec.field(default_factory=values)),
         ("x", dict[str, tuple[Any, ValueState, float]] | None, None)],
        frozen=True, gc=False, kw_only=True)
    return msgspec.json.Decoder(record)
