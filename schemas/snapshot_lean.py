"""The scheduler's lean reading of a host record: only what `select[]` columns need.

A `HostSnapshot` record (DESIGN §4) carries, per value, its reporter, three
timestamps, the last value and more; per host also the inventory and the
reporter statuses.  The scheduler view's columns need only each value's
`state`, `value` and expiry, of the catalog's host resources.  A
`lean_decoder` for those names decodes just that — msgspec skips every
other field without building objects for it — and nothing of it is kept:
the columns take what they need and the record's bytes stay for
`get()`/explain, which decode the full `HostSnapshot` on demand.

Expiry: the numeric epoch-seconds twin `expires_ts` (DESIGN §4: "entries
may carry numeric epoch-seconds twins of their times") when the record has
one; otherwise the RFC 3339 `expires_at` string is parsed (records written
before the twins existed).  The twin is optional here, so old and new
records decode alike.

These are read-only views of the wire type, never encoded: a writer always
writes the full `HostSnapshot`.

The columns header (`COLUMNS_HEADER`, an addition to DESIGN §4): the
projector sends each host record with a NATS header holding just those
columns in compact JSON, `{"e": E, "host": H, "v": {name: value}, "x":
{name: [value, state, expires_ts]}}`: `v` has the values whose state is
"fresh" (or "unknown", as null) and whose `expires_ts` is `e`, `x` every
other value (stale ones; other expiries); `e` and `x` are left out when
empty (`columns_of` is the rule).  It is derived from the record's own
entries and says nothing the body does not; the scheduler view decodes
~400 bytes per host instead of ~6 kB (`columns_decoder`).  A record
without it (another writer, an older projector, a host whose columns would
exceed `COLUMNS_MAX`) or with one that does not decode is read from its
body, as always.
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

import msgspec

from schemas.snapshot import ValueEntry, ValueState


class LeanEntry(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One value entry as the columns see it (see the module doc).

    `gc=False`: one is built per value of every decoded record and dropped
    right after; none may join the long-lived object graph the cyclic
    collector scans.
    """

    value: Any
    state: ValueState
    expires_at: str
    expires_ts: float | None = None
    """Epoch seconds of `expires_at` (absent in records written before the twins)."""


class TwinEntry(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """`LeanEntry` for records that carry the `expires_ts` twin (every record the projector
    writes now): the twin is required and `expires_at` is skipped unread, so a decode builds
    no string per value.  A record without twins fails this decode (ValidationError) and is
    read with `LeanEntry` instead; `state` is a Literal, so it is one of the Literal's own
    strings, not a new one."""

    value: Any
    state: ValueState
    expires_ts: float


ABSENT: Final = LeanEntry(value=None, state="absent",  # type: ignore[arg-type]  # a sentinel
                          expires_at="", expires_ts=math.inf)
"""What a lean record holds for a resource it has no value of (compare with `is`)."""


class LeanRecord(Protocol):
    """A host record decoded by a `lean_decoder`: its name and one entry per column."""

    host: str
    values: Any
    """A Struct with one `LeanEntry` field per resource the decoder was built for (`ABSENT`
    where the record has no value); `lean_entries` reads them all in that order."""


COLUMNS_HEADER: Final = "Crr-Columns"
"""The NATS header of a host record that holds its columns (see the module doc)."""
COLUMNS_MAX: Final = 32 * 1024
"""A host's columns longer than this (bytes of JSON) are not sent as a header: a header
that large would only add to a record that large, and the body says the same."""


def lean_fields(count: int) -> list[Callable[[Any], Any]]:
    """Getters of each resource's entry in a `lean_decoder`'s values, in the order of its
    names (`count` of them)."""
    return [operator.attrgetter(f) for f in _fields(count)]


def _fields(count: int) -> list[str]:
    return [f"v{i}" for i in range(count)]


def lean_decoder(names: Sequence[str], entry: type[LeanEntry | TwinEntry] = LeanEntry,
                 ) -> tuple[msgspec.json.Decoder[Any], Callable[[Any], Any]]:
    """A decoder of host records that reads only the values of `names` (as `entry`), and its
    reader.

    Every resource is a field of one Struct (renamed to its wire name), so a
    record decodes to one object per value and no dict; values of other
    names are skipped unread.  The reader (`operator.attrgetter` of all the
    fields) gives a record's entries as a tuple in the order of `names`.
    """
    fields = _fields(len(names))
    values = msgspec.defstruct(
        "LeanValues", [(f, entry, ABSENT) for f in fields],
        rename=dict(zip(fields, names, strict=True)), frozen=True, gc=False, kw_only=True)
    record = msgspec.defstruct(
        "LeanRecord", [("host", str), ("values", values, msgspec.field(default_factory=values))],
        frozen=True, gc=False, kw_only=True)
    if len(fields) == 1:
        one = operator.attrgetter(fields[0])
        return msgspec.json.Decoder(record), lambda v: (one(v),)
    getter = operator.attrgetter(*fields) if fields else (lambda _v: ())
    return msgspec.json.Decoder(record), getter


def columns_decoder(names: Sequence[str]) -> msgspec.json.Decoder[Any]:
    """A decoder of `COLUMNS_HEADER` values for the resources `names`.

    It gives a Struct with `host`, `e` (inf when absent), `v` (a Struct with
    one field per name, read by `lean_fields(len(names))`; `msgspec.UNSET`
    where the header has no value of that name in `v`) and `x` (name ->
    (value, state, expires_ts), or None).  Names not in `names` are skipped
    in `v` (not in `x`: callers look up their own).
    """
    fields = _fields(len(names))
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
