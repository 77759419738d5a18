"""Expiry (`crr.projections.expiry`): what came due by `now` turns stale, overdue or silent.

Pure core (no server).  Given a folded state, when expiry runs at `now`, then exactly what
came due is settled, each stamped with its own deadline (never with `now`).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crr.projections.changes import Acc
from crr.projections.envelope import Envelope
from crr.projections.expiry import expire_due, push_refreshed
from crr.projections.fold import apply, expire, fold, next_deadline
from crr.projections.state import ProjectionState
from tests.projections.test_fold_properties import events, snapshot_bytes
from tests.support.fold import T0, catalog_env, health_env, report_env, snap

SCRATCH = {"scratch_free": 1, "scratch_total": 2}
"""Every resource of `scratch` (lifetime 15 s; the reporter is silent 15 s after it)."""


def _scratch_at(t: float) -> ProjectionState:
    return fold([catalog_env(1, T0), report_env(2, t, "scratch", "n1", SCRATCH)])


def test_nothing_changes_before_the_deadline() -> None:
    """Given values due at +16, when expiry runs at +15.9, then nothing is settled."""
    state = _scratch_at(T0 + 1)
    before = snapshot_bytes(state)
    changes = expire(state, T0 + 15.9)
    assert (changes.hosts, changes.cluster) == (frozenset(), False)
    assert snapshot_bytes(state) == before


def test_values_go_stale_stamped_with_their_deadline_not_with_now() -> None:
    """Given values due at +16, when expiry runs late (+40), then they are stale since +16,
    the reporter silent since +16, the record's time is +16, and the host changed."""
    state = _scratch_at(T0 + 1)
    changes = expire(state, T0 + 40)
    assert changes.hosts == frozenset({"n1"})
    s = snap(state, "n1")
    assert {n: (v.state, v.expires_ts, v.last_value) for n, v in s.values.items()} == {
        "scratch_free": ("stale", T0 + 16, 1), "scratch_total": ("stale", T0 + 16, 2)}
    rs = s.reporters["scratch"]
    assert (rs.state, rs.silent, rs.since_ts) == ("silent", True, T0 + 16)
    assert s.as_of.ts == T0 + 16
    assert rs.missing == ["scratch_free", "scratch_total"]


def test_a_report_in_time_keeps_the_values_fresh() -> None:
    """A report before the deadline moves it: expiry at the old deadline settles nothing."""
    state = _scratch_at(T0 + 1)
    apply(state, report_env(3, T0 + 10, "scratch", "n1", SCRATCH))
    assert not expire(state, T0 + 16).hosts
    assert {v.state for v in snap(state, "n1").values.values()} == {"fresh"}
    assert next_deadline(state) == T0 + 25
    assert expire(state, T0 + 25).hosts == frozenset({"n1"})


def test_a_declared_resource_never_reported_goes_overdue_at_first_sight_plus_lifetime() -> None:
    """Given site reporting site_ok only (every 10 s), when site_state was never reported
    by first sight + 15 s, then it is missing from then on (and site_ok stays fresh)."""
    state = fold([catalog_env(1, T0),
                  report_env(2, T0, "site", "n1", {"site_ok": True}),
                  report_env(3, T0 + 10, "site", "n1", {"site_ok": True})])
    assert snap(state, "n1").reporters["site"].missing == []
    changes = expire(state, T0 + 15)
    assert changes.hosts == frozenset({"n1"})
    s = snap(state, "n1")
    assert s.reporters["site"].missing == ["site_state"]
    assert s.values["site_ok"].state == "fresh"
    assert s.as_of.ts == T0 + 15


def test_silence_under_a_lifecycle_health_state_is_not_a_change() -> None:
    """A reporter whose health says `failed` goes silent unseen: its state stays `failed`."""
    state = fold([catalog_env(1, T0),
                  health_env(2, T0, "gpus", "n1", "failed", detail="boom", exit_code=1)])
    expire(state, T0 + 100)
    rs = snap(state, "n1").reporters["gpus"]
    assert (rs.state, rs.silent) == ("failed", True)


def test_an_entry_of_an_overwritten_batch_settles_nothing() -> None:
    """Given a batch overwritten by a report with another lifetime's entry, when the old
    entry comes due, then the newer values stay fresh."""
    state = fold([catalog_env(1, T0),
                  report_env(2, T0, "scratch", "n1", {"scratch_free": 1}),
                  report_env(3, T0 + 5, "scratch", "n1", SCRATCH)])
    old = [e for e in state.heap if e.batch is not None and e.batch.dead]
    assert old  # the first report's entry, its batch dead
    acc = Acc()
    expire_due(state, T0 + 15, acc)
    assert {v.state for v in snap(state, "n1").values.values()} == {"fresh"}
    assert not acc.result().hosts


def test_the_entry_of_a_batch_refreshed_in_place_goes_back_at_its_new_time() -> None:
    """Given a batch refreshed in place (its entry still at the old time), when the top
    of the heap is tidied (`push_refreshed`, as `next_deadline` does), then the entry
    sits at the batch's new `due`; expiry at the old time settles nothing."""
    state = _scratch_at(T0 + 1)
    apply(state, report_env(3, T0 + 4, "scratch", "n1", SCRATCH))
    batch = state.hosts["n1"].reporters["scratch"].batches[0]
    assert batch.due == T0 + 19
    assert (state.heap[0].due, state.heap[0].batch) == (T0 + 16, batch)
    push_refreshed(state)
    assert (state.heap[0].due, state.heap[0].batch) == (T0 + 19, batch)
    acc = Acc()
    expire_due(state, T0 + 16, acc)
    assert not acc.result().hosts
    expire_due(state, T0 + 19, acc)
    assert acc.result().hosts == frozenset({"n1"})
    assert snap(state, "n1").values["scratch_free"].stale_since == "2027-01-15T08:00:19.000Z"


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@settings(max_examples=60, deadline=None)
@given(evs=events(),
       steps=st.lists(st.floats(0, 30, allow_nan=False), min_size=1, max_size=8))
def test_how_often_expiry_runs_changes_nothing(evs: list[Envelope], steps: list[float]) -> None:
    """Expiry at any number of times between the last event and `now` gives the bytes of
    one expiry at `now` (each change is stamped with its own deadline)."""
    once = fold(evs)
    often = fold(evs)
    now = evs[-1].received_at
    for step in steps:
        now += step
        expire(often, now)
    expire(once, now)
    assert snapshot_bytes(often) == snapshot_bytes(once)


@settings(max_examples=60, deadline=None)
@given(evs=events(), extra=st.floats(0, 100, allow_nan=False))
def test_after_expiry_nothing_is_due_by_now(evs: list[Envelope], extra: float) -> None:
    """Once expiry ran at `now`, the next deadline is later than `now` (or there is none),
    and a second expiry at `now` changes nothing."""
    state = fold(evs)
    now = evs[-1].received_at + extra
    expire(state, now)
    due = next_deadline(state)
    assert due is None or due > now
    again = expire(state, now)
    assert (again.hosts, again.cluster) == (frozenset(), False)
