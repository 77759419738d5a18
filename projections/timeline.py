"""A host's values and reporter states over a window, from replay captures (pure).

`replay_timeline` folds a host's stored events (and the catalog's) with
`crr.projections.history.Replay` (the fold `crr replay` runs), with a cut at
the window's start, after every event of the host in the window, and at
its end.  Between two captures nothing but time passes,
so a value captured `fresh` (or `unknown`) stays so until its `expires_at`
and is stale from then on: the same rule the projector's expiry applies.
Adjacent spans with the same state and value are merged.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from crr.projections.envelope import Envelope
from crr.projections.history import Capture, CapturePoint, Happening, Replay
from crr.schemas.snapshot import ReporterStatus, ValueEntry
from crr.schemas.wire_time import seconds_of


class Span(msgspec.Struct, frozen=True, kw_only=True):
    """A stretch of time `[start, end)` (epoch seconds) in one state, with the value shown."""

    start: float
    end: float
    state: str
    value: Any = None
    """The value (fresh), the last value (stale) or null (unknown); for a reporter: its detail."""


class ValueTimeline(msgspec.Struct, frozen=True, kw_only=True):
    """One resource of the host over the window (spans before its first report are absent)."""

    resource: str
    spans: list[Span]
    reports: int = 0
    """Captures at which the value's `received_at` changed (reports that carried it)."""


class ReporterTimeline(msgspec.Struct, frozen=True, kw_only=True):
    """One reporter of the host over the window: its state spans and restarts."""

    reporter: str
    spans: list[Span]
    restarts: int = 0
    """Times its runner turned `restarting` inside the window."""


class HostTimeline(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /v1/hosts/{host}/timeline`: the host's values and reporters over a window."""

    host: str
    since: float
    until: float
    events: int
    """The host's events inside the window."""
    values: list[ValueTimeline]
    reporters: list[ReporterTimeline]
    happenings: list[Happening] = msgspec.field(default_factory=list)
    """Rejected values, failing runs and dead letters inside the window."""
    history_from: float | None = None
    """Set when CRR_EVENTS no longer holds the start of the window: its first event's time."""


def _append(spans: list[Span], start: float, end: float, state: str, value: Any) -> None:
    if end <= start:
        return
    if spans and spans[-1].state == state and spans[-1].value == value \
            and spans[-1].end >= start:
        last = spans[-1]
        spans[-1] = Span(start=last.start, end=end, state=state, value=value)
        return
    spans.append(Span(start=start, end=end, state=state, value=value))


def _value_spans(spans: list[Span], entry: ValueEntry, start: float, end: float) -> None:
    if entry.state == "stale":
        _append(spans, start, end, "stale", entry.last_value)
        return
    expires = seconds_of(entry.expires_ts, entry.expires_at)
    value = entry.value if entry.state == "fresh" else None
    _append(spans, start, min(end, expires), entry.state, value)
    if expires < end:
        _append(spans, max(start, expires), end, "stale", value)


def _reporter_points(points: list[tuple[float, str, Any]], st: ReporterStatus, at: float,
                     before: float) -> None:
    """Record `st` seen at capture time `at` (previous capture at `before`): a new state
    starts at its `since` when that lies in between (the projector stamps `silent` with the
    reporter's deadline, as it stamps `stale`), else at `at`."""
    if points and points[-1][1] == st.state and points[-1][2] == st.detail:
        return
    since = seconds_of(st.since_ts, st.since) if st.since else -math.inf
    start = since if before < since <= at else at
    if points:
        start = max(start, points[-1][0])
    points.append((start, st.state, st.detail))


def host_timeline(host: str, captures: list[Capture], since: float, until: float, *,
                  events: int, happenings: list[Happening] | None = None,
                  history_from: float | None = None) -> HostTimeline:
    """The timeline of `host` from `captures` (in order; the first at `since`, the last at
    `until`); see the module doc."""
    values: dict[str, list[Span]] = {}
    reports: dict[str, int] = {}
    received: dict[str, str] = {}
    points: dict[str, list[tuple[float, str, Any]]] = {}
    restarts: dict[str, int] = {}
    health: dict[str, str | None] = {}
    for i, cap in enumerate(captures):
        start = max(cap.now, since)
        end = until if i + 1 == len(captures) else min(captures[i + 1].now, until)
        snap = cap.hosts.get(host)
        if snap is None:
            continue
        for name, entry in snap.values.items():
            _value_spans(values.setdefault(name, []), entry, start, end)
            if entry.received_at != received.get(name):
                received[name] = entry.received_at
                if cap.now >= since and i > 0:
                    reports[name] = reports.get(name, 0) + 1
        before = captures[i - 1].now if i > 0 else -math.inf
        for name, st in snap.reporters.items():
            _reporter_points(points.setdefault(name, []), st, start, max(before, since))
            if st.health == "restarting" and health.get(name) != "restarting" and i > 0:
                restarts[name] = restarts.get(name, 0) + 1
            health[name] = st.health
    reporters: dict[str, list[Span]] = {}
    for name, pts in points.items():
        spans = reporters[name] = []
        for k, (at, state, detail) in enumerate(pts):
            _append(spans, at, pts[k + 1][0] if k + 1 < len(pts) else until, state, detail)
    return HostTimeline(
        host=host, since=since, until=until, events=events,
        values=[ValueTimeline(resource=n, spans=values[n], reports=reports.get(n, 0))
                for n in sorted(values)],
        reporters=[ReporterTimeline(reporter=n, spans=reporters[n],
                                    restarts=restarts.get(n, 0)) for n in sorted(reporters)],
        happenings=list(happenings or []), history_from=history_from)


def replay_timeline(host: str, events: list[Envelope], since: float, until: float, *,
                    history_from: float | None = None) -> HostTimeline:
    """Fold `events` (the catalog's and `host`'s, in stream order) and take the timeline of
    `host` over `[since, until]`: a cut at `since`, after each of its events inside the
    window, and at `until`."""
    inside = [e for e in events if since < e.received_at <= until
              and ".host." in e.subject]
    cuts = [CapturePoint(time=since), *(CapturePoint(seq=e.seq) for e in inside),
            CapturePoint(time=until)]
    replay = Replay(cuts, hosts=[host], log_window=True)
    for env in events:
        if env.received_at > until:
            break
        replay.feed(env)
    return host_timeline(host, replay.finish(), since, until, events=len(inside),
                         happenings=replay.happenings, history_from=history_from)
