"""The watermark rule (`judge`, `watermark_of`: projections/freshness.py), with properties.

Readers judge every value at `judged_at = min(now, max(watermark, now - outage_hold))`
(docs/contract.md, "Freshness at the watermark").
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from crr.projections.fold import expire, fold
from crr.projections.freshness import (
    HOLDING_AFTER,
    host_at,
    judge,
    value_state,
    watermark_of,
)
from crr.projections.record.snapshot import host_snapshot
from crr.schemas.snapshot import ProjectorStatus
from crr.schemas.wire_time import format_time
from tests.support.fold import catalog_env, report_env

T0 = 1_790_000_000.0

times = st.floats(min_value=T0 - 10_000, max_value=T0 + 10_000, allow_nan=False)
holds = st.floats(min_value=0.0, max_value=3600.0, allow_nan=False)
steps = st.floats(min_value=0.0, max_value=5000.0, allow_nan=False)


@given(times, times, holds)
def test_judged_at_is_never_after_now(watermark: float, now: float, hold: float) -> None:
    j = judge(watermark, now, hold)
    assert j.judged_at <= now
    assert j.judged_at >= now - hold  # never more than outage_hold back
    assert not (j.holding and j.expired)


@given(times, steps, steps, holds)
def test_frozen_while_the_watermark_is_frozen_within_the_hold(
        watermark: float, a: float, b: float, hold: float) -> None:
    """The projector silent: two readers' clocks within `outage_hold` of the watermark
    judge at the very same time, the watermark (values keep their state: fail static)."""
    lo, hi = sorted((a, b))
    if hi > hold:
        return
    first, later = judge(watermark, watermark + lo, hold), judge(watermark, watermark + hi, hold)
    assert first.judged_at == later.judged_at == watermark


@given(times, holds)
def test_equals_now_when_caught_up(now: float, hold: float) -> None:
    j = judge(now, now, hold)
    assert j.judged_at == now
    assert (j.holding, j.expired, j.detail) == (False, False, "")


@given(times, steps, steps, holds)
def test_monotonic_in_now(watermark: float, a: float, b: float, hold: float) -> None:
    lo, hi = sorted((a, b))
    assert judge(watermark, watermark + lo, hold).judged_at <= judge(
        watermark, watermark + hi, hold).judged_at


@given(times, holds)
def test_no_status_judges_at_now(now: float, hold: float) -> None:
    j = judge(None, now, hold)
    assert (j.judged_at, j.holding, j.expired, j.lag) == (now, False, False, None)


def test_holding_then_past_the_hold_says_so() -> None:
    wm = T0
    live = judge(wm, wm + 1.0, 600.0)
    assert not live.holding
    assert live.judged_at == wm
    held = judge(wm, wm + HOLDING_AFTER + 11.7, 600.0)
    assert held.holding
    assert held.hold_left is not None
    assert held.detail == (f"holding: watermark {format_time(wm)}, 14.2 s behind; "
                           "586 s of outage_hold left")
    past = judge(wm, wm + 700.0, 600.0)
    assert past.expired
    assert not past.holding
    assert past.judged_at == wm + 100.0
    assert past.detail.startswith("past outage_hold (600 s)")
    # outage_hold 0: the old behaviour, judged at now.
    assert judge(wm, wm + 30.0, 0.0).judged_at == wm + 30.0


def _status(**kw: object) -> ProjectorStatus:
    return msgspec.convert({"last_seq": 1, "stream_last_seq": 1, "lag": 0,
                            "last_tick": format_time(T0), "started_at": format_time(T0 - 60),
                            **kw}, ProjectorStatus)


def test_watermark_of_takes_the_minimum_and_an_older_writers_tick() -> None:
    assert watermark_of([]) is None
    one = _status(watermark=format_time(T0 - 5), watermark_ts=T0 - 5)
    assert watermark_of([one]) == T0 - 5
    older = _status(last_tick=format_time(T0 - 9))  # no watermark: its last_tick counts
    assert watermark_of([one, older]) == T0 - 9
    text_only = _status(watermark=format_time(T0 - 3))
    assert watermark_of([text_only]) == T0 - 3


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@given(st.lists(st.floats(min_value=0.0, max_value=50.0), min_size=1, max_size=8),
       st.floats(min_value=0.0, max_value=120.0))
def test_judged_at_the_watermark_equals_the_fold_without_an_outage(
        gaps: list[float], silence: float) -> None:
    """A host reporting every few seconds: a reader judging the record the projector wrote
    at its watermark W, at any `now` within `outage_hold` of W, sees exactly what the
    projector itself wrote at W — and once the projector has caught up to `now`, exactly the
    no-outage fold at `now`."""
    envs = [catalog_env(seq=1, t=T0 - 1)]
    t = T0
    for i, gap in enumerate(gaps):
        t += gap
        envs.append(report_env(i + 2, t, "scratch", "n1", {"scratch_free": float(i),
                                                              "scratch_total": 100.0}))
    state = fold(envs)
    watermark = t
    expire(state, watermark)
    written = host_snapshot(state, "n1")
    now = watermark + silence
    judged = judge(watermark, now, 600.0).judged_at
    assert host_at(written, judged) == written  # fail static: as written at W
    caught_up = fold(envs)
    expire(caught_up, now)
    after = host_snapshot(caught_up, "n1")
    assert host_at(after, judge(now, now, 600.0).judged_at) == after
    entry = after.values["scratch_free"]
    assert value_state(entry.state, entry.expires_ts or 0.0, now) == entry.state
