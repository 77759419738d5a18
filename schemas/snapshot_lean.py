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
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

import msgspec

from schemas.snapshot import ValueState


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
