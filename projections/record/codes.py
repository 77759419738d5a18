"""The state codes of a value in the host table's columns, and an entry's code.

`ABSENT` never reported, `FRESH`, `STALE`, `NULL` (the reporter said null or
the value is not of the resource's kind): what a column's `state` array
holds per row (`crr.projections.host_table`), and what `crr.projections.freshness`
turns into a `Freshness` at `now`.  `entry_code` is the rule from a snapshot
entry (a full `ValueEntry` or its lean decode) to (code, expiry, value).
"""

from __future__ import annotations

import math
from typing import Any, Final, Literal

from crr.projections.record.body import LeanEntry
from crr.projections.validation import normalize
from crr.schemas.catalog import Kind
from crr.schemas.snapshot import ValueEntry
from crr.schemas.wire_time import seconds_of

ABSENT: Final = 0
FRESH: Final = 1
STALE: Final = 2
NULL: Final = 3

Freshness = Literal["fresh", "stale", "unknown", "never_reported"]
"""A value's state at `now` as `select[]` and `explain` say it (`freshness_at`)."""

STATE_CODES: Final = {"fresh": FRESH, "stale": STALE}
"""A full entry's recorded state -> its code (anything else: NULL)."""
LEAN_CODES: Final = {"fresh": FRESH, "stale": STALE, "unknown": NULL, "absent": ABSENT}
"""A lean entry's recorded state -> its code (`absent`: the `ABSENT_ENTRY` sentinel)."""

Entry = ValueEntry | LeanEntry
"""What the columns read of a value: a full entry or its lean decode."""

_PLAIN: Final[dict[type, Kind]] = {float: "numeric", bool: "boolean", str: "string"}
"""Value types `normalize` returns unchanged for their kind (a float only when finite)."""


def entry_expiry(entry: Entry) -> float:
    """Epoch seconds an entry expires at: its `expires_ts` twin, else its parsed `expires_at`."""
    return seconds_of(entry.expires_ts, entry.expires_at)


def entry_code(kind: Kind, entry: Entry | None) -> tuple[int, float, Any]:
    """(state code, expires_at seconds, normalized value) of one snapshot entry."""
    if entry is None:
        return ABSENT, math.inf, None
    return _coded(kind, entry, entry_expiry(entry))


def _coded(kind: Kind, entry: Entry, expires: float) -> tuple[int, float, Any]:
    """`entry_code` once the expiry is known."""
    state = entry.state
    if state == "stale":
        return STALE, expires, None
    if state != "fresh":
        return NULL, expires, None
    value = entry.value
    plain = _PLAIN.get(type(value))  # the usual values: `normalize` would return them as is
    if plain == kind and (plain != "numeric" or math.isfinite(value)):
        return FRESH, expires, value
    value = normalize(kind, value)
    if value is None:
        return NULL, expires, None
    return FRESH, expires, value
