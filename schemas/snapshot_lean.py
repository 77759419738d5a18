"""The scheduler's lean reading of a host record: only what `select[]` columns need.

A `HostSnapshot` record (DESIGN §4) carries, per value, its reporter, three
timestamps, the last value and more; per host also the inventory and the
reporter statuses.  The scheduler view's columns need only each value's
`state`, `value` and expiry.  `LeanHost` decodes just those — msgspec skips
every other field without building objects for it — and nothing of it is
kept: the columns take what they need and the record's bytes stay for
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

from typing import Any

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


class LeanHost(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A host record's name and values, nothing else (see the module doc)."""

    host: str
    values: dict[str, LeanEntry] = msgspec.field(default_factory=dict)


LEAN_HOST_DECODER: msgspec.json.Decoder[LeanHost] = msgspec.json.Decoder(LeanHost)
"""Built once, reused by every reader of host records."""
