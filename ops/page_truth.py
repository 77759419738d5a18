"""The status page's one seam to the freshness and liveness rules (values and projector at now).

Every page endpoint (`ops/page_api.py`) shows a host record as it is at
`now` and the projector's liveness through these two functions only, so
the page agrees with every other surface.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

from projections.host_table import expires_seconds
from schemas.snapshot import HostSnapshot, ProjectorStatus, ValueEntry

DEFAULT_SILENT_AFTER = 15.0


def _entry_at(entry: ValueEntry, now: float) -> ValueEntry:
    if entry.state == "stale" or expires_seconds(entry.expires_at) > now:
        return entry
    return msgspec.structs.replace(entry, value=None, state="stale", last_value=entry.value,
                                   stale_since=entry.expires_at)


def host_now(snap: HostSnapshot, now: float) -> HostSnapshot:
    """`snap` with every value as it is at `now` (a value past `expires_at` is stale)."""
    values = {k: _entry_at(v, now) for k, v in snap.values.items()}
    if all(values[k] is v for k, v in snap.values.items()):
        return snap
    return msgspec.structs.replace(snap, values=values)


class Liveness(msgspec.Struct, frozen=True, kw_only=True):
    """The projector's liveness at `now` (the shape of i15's ProjectorLiveness)."""

    state: Literal["live", "silent", "absent"]
    last_status_age: float | None
    lag: int | None
    silent_after: float
    detail: str = ""


def liveness(statuses: list[ProjectorStatus], now: float,
             silent_after: float = DEFAULT_SILENT_AFTER) -> Liveness:
    """Live, silent (oldest status older than `silent_after`) or absent (no status)."""
    if not statuses:
        return Liveness(state="absent", last_status_age=None, lag=None,
                        silent_after=silent_after, detail="absent: no projector status")
    ages = [now - expires_seconds(st.last_tick) for st in statuses]
    age = max(0.0, *ages)
    lag = sum(st.lag for st in statuses)
    state: Literal["live", "silent"] = "silent" if age > silent_after else "live"
    shown = "never" if math.isinf(age) else f"{age:.1f} s ago"
    return Liveness(state=state, last_status_age=None if math.isinf(age) else age, lag=lag,
                    silent_after=silent_after,
                    detail=f"{state}: last status {shown}, lag {lag}")
