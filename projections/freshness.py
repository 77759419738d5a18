"""The one freshness rule and the one liveness rule every surface applies at `now`.

Pure: no IO, no clock — `now` is an argument.  Every reader of CRR_SNAPSHOT
(`crr hosts`, `crr health`, the REST API and its event stream, the status
page through them, `select[]` and `explain`) derives what it shows through
these functions, so no two surfaces can disagree.

**Freshness of a value** (`value_state`): the projector writes a value
`stale` when its `expires_at` passes — but only while it runs.  A reader
therefore takes the recorded state *and* the clock: a value is `stale` when
the record says so or its `expires_at` ≤ `now` (also a value the reporter
said was null: the projector turns those stale at the same deadline);
before that, `fresh` stays fresh and `unknown` (the reporter said null)
stays unknown — never fresh.  `host_at` / `cluster_at` apply the rule to a
whole record and keep the HostSnapshot shape (docs/contract.md, "Payloads"): an entry that
went stale is written as the projector would have written it (`value`
null, `last_value` kept, `stale_since` = its `expires_at`).

**Freshness at the watermark** (`judge`): no reader judges at the wall clock
itself.  The projector writes its watermark (it had folded every event stored
before it) into every status; a reader judges every value at
`judged_at = min(now, max(watermark, now - outage_hold))` — `watermark_of` the
current layout's statuses — and passes that as the `now` of the functions
here.  While the projector is live and caught up that is `now`; while it is
silent or behind, values keep the state they had at the watermark (fail
static) for up to `outage_hold` (`crr.schemas.catalog.DEFAULT_OUTAGE_HOLD`, 10 min,
unless `resources.yaml` says), then expire again, `outage_hold` late
(docs/contract.md, "Freshness at the watermark").

**Liveness of the projector** (`projector_liveness`): from the status
records of the current layout (one, or one per partition).  `absent`: no
status record at all (no projector ever ran); `silent`: the oldest status's
`last_tick` is more than `silent_after` seconds old, or a partition of the
layout has written none; else `live`.  The projector writes its status at
least once per status interval (1 s by default), so a silent projector is
stopped, stuck or cut off from NATS.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Final, Literal, TypeVar

import msgspec

from crr.projections.record.codes import ABSENT, FRESH, NULL, STALE, Freshness
from crr.schemas.snapshot import (
    ClusterSnapshot,
    HostSnapshot,
    InventoryEntry,
    ProjectorStatus,
    ValueEntry,
    ValueState,
)
from crr.schemas.wire_time import expires_seconds, format_time, seconds_of

DEFAULT_SILENT_AFTER: Final = 15.0
"""Seconds without a projector status after which the projector counts as silent."""

HOLDING_AFTER: Final = 2.5
"""Seconds a watermark may lag `now` before readers say they are holding.  The projector
writes its status every second, so a live, caught-up one lags < ~1.2 s; every surface says
it is holding within 3 s of the last status."""

_CODE_STATES: Final[dict[int, ValueState]] = {FRESH: "fresh", STALE: "stale", NULL: "unknown"}


def value_state(recorded: ValueState, expires_at: float, now: float) -> ValueState:
    """The state of a value at `now`: stale once `expires_at` ≤ `now`, else as recorded."""
    if recorded == "stale" or expires_at <= now:
        return "stale"
    return recorded


def entry_state(entry: ValueEntry | InventoryEntry, now: float) -> ValueState:
    """`value_state` of a snapshot entry (a value or an inventory) at `now`."""
    return value_state(entry.state, seconds_of(entry.expires_ts, entry.expires_at), now)


def freshness_at(code: int, expires: float, now: float) -> Freshness:
    """`value_state` for a `HostTable` state code (`select[]` and `explain` use this)."""
    if code == ABSENT:
        return "never_reported"
    return value_state(_CODE_STATES[code], expires, now)


def entry_at(entry: ValueEntry, now: float) -> ValueEntry:
    """`entry` as it is at `now` (the same object when its state did not change)."""
    if entry.state == "stale" or entry_state(entry, now) != "stale":
        return entry
    return msgspec.structs.replace(entry, value=None, state="stale", last_value=entry.value,
                                   stale_since=entry.expires_at)


def inventory_at(entry: InventoryEntry, now: float) -> InventoryEntry:
    """An inventory entry as it is at `now` (same rule as values)."""
    if entry.state == "stale" or entry_state(entry, now) != "stale":
        return entry
    return msgspec.structs.replace(entry, state="stale", stale_since=entry.expires_at)


_Entry = TypeVar("_Entry", ValueEntry, InventoryEntry)
_Record = TypeVar("_Record", HostSnapshot, ClusterSnapshot)


def _entries_at(entries: dict[str, _Entry], now: float,
                at: Callable[[_Entry, float], _Entry]) -> dict[str, _Entry]:
    """`entries` with `at` applied (the same dict when nothing changed)."""
    out: dict[str, _Entry] | None = None
    for name, entry in entries.items():
        changed = at(entry, now)
        if changed is not entry:
            if out is None:
                out = dict(entries)
            out[name] = changed
    return entries if out is None else out


def _record_at(snap: _Record, now: float) -> _Record:
    values = _entries_at(snap.values, now, entry_at)
    inventory = _entries_at(snap.inventory, now, inventory_at)
    if values is snap.values and inventory is snap.inventory:
        return snap
    return msgspec.structs.replace(snap, values=values, inventory=inventory)


def earliest_expiry(snap: HostSnapshot | ClusterSnapshot) -> float:
    """The first `expires_at` of a value or inventory not yet stale (+inf: none):
    before it, `host_at(snap, now)` is `snap` itself (readers cache this per record)."""
    times = [seconds_of(e.expires_ts, e.expires_at) for e in snap.values.values()
             if e.state != "stale"]
    times += [seconds_of(e.expires_ts, e.expires_at) for e in snap.inventory.values()
              if e.state != "stale"]
    return min(times, default=math.inf)


def host_at(snap: HostSnapshot, now: float) -> HostSnapshot:
    """A host record with every value and inventory as it is at `now` (same shape)."""
    return _record_at(snap, now)


def cluster_at(snap: ClusterSnapshot, now: float) -> ClusterSnapshot:
    """The cluster record as it is at `now` (see `host_at`)."""
    return _record_at(snap, now)


class Judgement(msgspec.Struct, frozen=True, kw_only=True):
    """When a reader judges freshness (`judge`), and whether it is holding."""

    judged_at: float
    """`min(now, max(watermark, now - outage_hold))`: the `now` every freshness rule takes."""
    now: float
    watermark: float | None
    """The projector's watermark (None: no projector status at all)."""
    outage_hold: float
    lag: float | None
    """`now - watermark` (None: no status)."""
    holding: bool
    """The watermark lags by more than `HOLDING_AFTER`, within `outage_hold`: values
    keep the state they had at the watermark."""
    expired: bool
    """The watermark lags by more than `outage_hold`: values expire again, that late."""
    hold_left: float | None
    """Seconds of `outage_hold` left while holding (else None)."""
    detail: str = ""
    """One line for people (empty when neither holding nor expired)."""


def judge(watermark: float | None, now: float, outage_hold: float) -> Judgement:
    """The one rule (docs/contract.md, "Freshness at the watermark"): readers judge every
    value at `judged_at = min(now, max(watermark, now - outage_hold))`."""
    hold = max(0.0, outage_hold)
    if watermark is None or math.isnan(watermark):
        return Judgement(judged_at=now, now=now, watermark=None, outage_hold=hold, lag=None,
                         holding=False, expired=False, hold_left=None)
    judged_at = min(now, max(watermark, now - hold))
    lag = now - watermark
    expired = lag > hold and lag > HOLDING_AFTER
    holding = HOLDING_AFTER < lag <= hold
    hold_left = hold - lag if holding else None
    detail = ""
    if holding:
        detail = (f"holding: watermark {_when(watermark)}, {lag:.1f} s behind; "
                  f"{hold - lag:.0f} s of outage_hold left")
    elif expired:
        detail = (f"past outage_hold ({hold:g} s): watermark {_when(watermark)}, "
                  f"{lag:.1f} s behind; values judged at now - {hold:g} s")
    return Judgement(judged_at=judged_at, now=now, watermark=watermark, outage_hold=hold,
                     lag=lag, holding=holding, expired=expired, hold_left=hold_left,
                     detail=detail)


def _when(t: float) -> str:
    return format_time(t) if math.isfinite(t) else "unreadable"


def status_watermark(status: ProjectorStatus) -> float:
    """A status's watermark in epoch seconds: `watermark_ts` (or `watermark`), else — an
    older writer — its `last_tick`; -inf if none parses."""
    if status.watermark_ts is not None:
        return status.watermark_ts
    if status.watermark:
        return expires_seconds(status.watermark)
    return expires_seconds(status.last_tick)


def watermark_of(statuses: Sequence[ProjectorStatus]) -> float | None:
    """The watermark of the current layout's statuses (one, or one per partition): the
    minimum (None: no status).  A partition of the layout that wrote none is not counted
    here: `projector_liveness` says it is silent."""
    if not statuses:
        return None
    return min(status_watermark(st) for st in statuses)


LivenessState = Literal["live", "silent", "absent", "rebuilding"]


class ProjectorLiveness(msgspec.Struct, frozen=True, kw_only=True):
    """Whether the projector(s) behind a snapshot are alive at `now`, and how far behind."""

    state: LivenessState
    last_status_age: float | None
    """Seconds since the oldest current status's `last_tick` (None: no status)."""
    lag: int | None
    """Events stored but not yet applied, summed over the partitions (None: no status)."""
    silent_after: float
    """The threshold (seconds) past which a status counts as silent."""
    partitions: int = 0
    """Status records of the current layout seen."""
    expected: int | None = None
    """Status records the current layout has (None: unknown)."""
    detail: str = ""
    """One line for people: `live: last status 0.4 s ago, lag 0`."""


def status_age(status: ProjectorStatus, now: float) -> float:
    """Seconds since `status` was written (its `last_tick`); +inf if that does not parse."""
    tick = expires_seconds(status.last_tick)
    return math.inf if tick == -math.inf else max(0.0, now - tick)


def projector_liveness(
    statuses: Sequence[ProjectorStatus], now: float, silent_after: float = DEFAULT_SILENT_AFTER,
) -> ProjectorLiveness:
    """The projector's liveness at `now` from the current layout's status records
    (`Coverage.current`: one, or one per partition of the same N)."""
    expected = None
    if statuses:
        first = statuses[0]
        expected = 1 if first.partition is None else first.partitions
    if not statuses:
        return ProjectorLiveness(
            state="absent", last_status_age=None, lag=None, silent_after=silent_after,
            expected=expected,
            detail="absent: no projector status in the snapshot (is a projector running?)")
    age = max(status_age(st, now) for st in statuses)
    lag = sum(st.lag for st in statuses)
    missing = (expected or len(statuses)) - len(statuses)
    shown = "never" if math.isinf(age) else f"{age:.1f} s ago"
    facts = f"last status {shown}, lag {lag}"
    if age > silent_after:
        state: LivenessState = "silent"
        detail = f"silent: {facts} (silent after {silent_after:g} s)"
    elif missing > 0:
        state = "silent"
        detail = f"silent: {missing} of {expected} partition(s) wrote no status; {facts}"
    elif building := [st for st in statuses if st.phase == "rebuilding"]:
        # Its records are not written yet: what readers see is the previous snapshot.
        state = "rebuilding"
        detail = f"rebuilding: {_rebuild_facts(building)}; {facts}"
    else:
        state = "live"
        detail = f"live: {facts}"
    return ProjectorLiveness(state=state, last_status_age=None if math.isinf(age) else age,
                             lag=lag, silent_after=silent_after, partitions=len(statuses),
                             expected=expected, detail=detail)


def _rebuild_facts(statuses: Sequence[ProjectorStatus]) -> str:
    """`folded 1.2M of 2.0M events (60%), 150k/s, ETA 0:05` over rebuilding partitions."""
    folded = sum(st.progress.folded for st in statuses if st.progress is not None)
    total = sum(st.progress.to_fold for st in statuses if st.progress is not None)
    rate = sum(st.progress.rate for st in statuses if st.progress is not None)
    etas = [st.progress.eta_s for st in statuses
            if st.progress is not None and st.progress.eta_s is not None]
    pct = f" ({100 * folded / total:.0f}%)" if total else ""
    eta = f", ETA {format_eta(max(etas))}" if etas else ""
    who = "" if len(statuses) == 1 and statuses[0].partition is None else (
        f"{len(statuses)} partition(s) "
    )
    return (f"{who}folded {folded} of {total} retained event(s){pct}, {rate:.0f}/s{eta} "
            "(readers see the previous snapshot until it is done)")


def format_eta(seconds: float) -> str:
    """`m:ss`, or `h:mm:ss` from an hour on (progress bars, rebuild ETAs)."""
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
    return f"{s // 60}:{s % 60:02d}"
