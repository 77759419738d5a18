"""The pure timeline (projections/timeline.py) against `crr replay`'s own cut at any instant."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from crr.projections.envelope import Envelope
from crr.projections.history import CapturePoint, Replay
from crr.projections.timeline import HostTimeline, replay_timeline
from crr.schemas.codec import encode
from crr.schemas.subjects import CATALOG, event_subject
from tests.support.projector import FAST_CATALOG

BASE = 1_800_000_000.0
HOST = "node1"


def events(reports: list[tuple[float, Any]]) -> list[Envelope]:
    """The catalog, then `blinker` (interval 200 ms) reports of `blink` at BASE + offset."""
    out = [Envelope(seq=1, subject=CATALOG, received_at=BASE - 1, data=encode(FAST_CATALOG))]
    for i, (offset, value) in enumerate(sorted(reports, key=lambda r: r[0])):
        body = {"reporter": "blinker", "host": HOST, "boot": "b", "seq": i + 1,
                "observed_at": "2027-01-15T08:00:00.000Z", "values": {"blink": value}}
        out.append(Envelope(seq=i + 2, subject=event_subject("report", "blinker", HOST),
                            received_at=BASE + offset, data=json.dumps(body).encode()))
    return out


def at(envs: list[Envelope], t: float) -> tuple[str, Any] | None:
    """(state, value or last value) of blink as `crr replay --at t` gives it."""
    replay = Replay([CapturePoint(time=t)], hosts=[HOST])
    for env in envs:
        replay.feed(env)
    snap = replay.finish()[0].hosts.get(HOST)
    entry = snap.values.get("blink") if snap is not None else None
    if entry is None:
        return None
    return entry.state, entry.last_value if entry.state == "stale" else entry.value


def shown(tl: HostTimeline, t: float) -> tuple[str, Any] | None:
    lanes = [v for v in tl.values if v.resource == "blink"]
    for span in lanes[0].spans if lanes else []:
        if span.start <= t < span.end:
            return span.state, span.value
    return None


offsets = st.lists(st.tuples(st.floats(0, 5, allow_nan=False).map(lambda f: round(f, 3)),
                             st.one_of(st.none(), st.integers(0, 9).map(float))),
                   max_size=8, unique_by=lambda r: r[0])


@settings(max_examples=60, deadline=None)
@given(offsets, st.floats(-1, 3), st.floats(0.1, 4))
def test_every_instant_agrees_with_a_replay_cut(reports: list[tuple[float, Any]],
                                                start: float, length: float) -> None:
    """At the middle of every span, and at every report, the timeline shows what a replay
    cut at that instant gives; spans are ordered, disjoint and inside the window."""
    envs = events(reports)
    since, until = BASE + start, BASE + start + length
    tl = replay_timeline(HOST, envs, since, until)
    for lane in tl.values:
        for a, b in zip(lane.spans, lane.spans[1:], strict=False):
            assert a.end <= b.start
        for span in lane.spans:
            assert since <= span.start < span.end <= until
    probes = [(s.start + s.end) / 2 for v in tl.values for s in v.spans]
    probes += [BASE + o + 0.0005 for o, _ in reports if since < BASE + o + 0.0005 < until]
    for t in probes:
        expected = at(envs, t)
        got = shown(tl, t)
        if expected is None:
            assert got is None
        else:
            assert got == expected, (t - BASE, got, expected)
    assert tl.events == sum(1 for o, _ in reports if since < BASE + o <= until)
