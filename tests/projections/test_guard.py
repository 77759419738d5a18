"""The bridge guard and settling (crr.projections.guard): given/when/then and properties."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from crr.projections.exports import NodeWant
from crr.projections.guard import UNLIMITED, Gate, GateResult, Limits, Timing

NODES = [f"n{i:02d}" for i in range(20)]


def want(drain: str | None = None, *features: str) -> NodeWant:
    return NodeWant(features=frozenset(features), drain=drain)


def all_want(drain: str | None, nodes: list[str] = NODES) -> dict[str, NodeWant]:
    return {n: want(drain) for n in nodes}


def test_mass_drain_trips_applies_oldest_first_and_says_the_numbers() -> None:
    """20 nodes go bad, limit 2: the two whose condition began first drain, 18 are held."""
    gate = Gate()
    gate.step(all_want(None), 0.0, Timing(), Limits(2, 100, 300.0))
    raw = all_want(None)
    raw["n07"] = want("fs")
    gate.step(raw, 1.0, Timing(default_for=5.0), Limits(2, 100, 300.0))  # n07 pending first
    res = gate.step(all_want("fs"), 3.0, Timing(default_for=5.0), Limits(2, 100, 300.0))
    assert not res.applied
    assert len(res.pending) == 20
    res = gate.step(all_want("fs"), 6.0, Timing(default_for=5.0), Limits(2, 100, 300.0))
    assert [c.node for c in res.applied] == ["n07"]  # the only one due yet
    res = gate.step(all_want("fs"), 8.0, Timing(default_for=5.0), Limits(2, 100, 300.0))
    drained = sorted(n for n, w in res.wants.items() if w.drain)
    assert drained == ["n00", "n07"]
    assert len(res.held) == 18
    (trip,) = res.trips
    assert trip.describe(300.0) == "20 of 20 nodes would drain; limit 2 (18 held)"


def test_a_tripped_guard_stays_held_until_release_once() -> None:
    """Held changes stay held step after step; a once-release applies them, then the guard is
    back (a later change that does not fit is held again)."""
    gate, lim = Gate(), Limits(2, 100, 300.0)
    gate.step(all_want(None), 0.0, Timing(), lim)
    gate.step(all_want("fs", NODES[:19]), 1.0, Timing(), lim)
    res = gate.step(all_want("fs", NODES[:19]), 2.0, Timing(), lim)
    assert not res.applied
    assert len(res.held) == 17
    assert res.trips
    assert gate.release(2.5)
    res = gate.step(all_want("fs", NODES[:19]), 3.0, Timing(), lim)
    assert res.released
    assert len(res.applied) == 17
    assert not res.trips
    assert sum(1 for w in res.wants.values() if w.drain) == 19
    res = gate.step(all_want("fs"), 4.0, Timing(), lim)
    assert len(res.held) == 1
    assert res.trips
    assert not Gate().release(1.0)  # nothing held: a once-release does nothing


def test_a_trip_ends_when_the_change_fits_again() -> None:
    """When most nodes recover before anyone releases, the rest fits and is applied."""
    gate, lim = Gate(), Limits(2, 100, 300.0)
    gate.step(all_want(None), 0.0, Timing(), lim)
    res = gate.step(all_want("fs"), 1.0, Timing(), lim)
    assert len(res.held) == 18
    raw = all_want(None)
    raw["n05"] = want("fs")
    res = gate.step(raw, 2.0, Timing(), lim)
    assert not res.trips
    assert not res.held


def test_release_for_suspends_the_guard_for_that_long() -> None:
    gate, lim = Gate(), Limits(1, 1, 300.0)
    gate.step(all_want(None), 0.0, Timing(), lim)
    gate.release(0.0, for_seconds=10.0)
    res = gate.step(all_want("fs"), 5.0, Timing(), lim)
    assert len(res.applied) == 20
    assert not res.trips
    res = gate.step({n: want("fs", "a") for n in NODES}, 11.0, Timing(), lim)
    assert len(res.held) == 19
    assert res.trips[0].kind == "features"


def test_feature_changes_count_nodes_within_the_window() -> None:
    """max_changed 3 per 60 s: 3 nodes change, the rest waits for the window (tripped, it
    applies none until all fit)."""
    gate, lim = Gate(), Limits(100, 3, 60.0)
    gate.step(all_want(None), 0.0, Timing(), lim)
    res = gate.step({n: want(None, "a") for n in NODES[:5]} | all_want(None, NODES[5:]),
                    1.0, Timing(), lim)
    assert len(res.applied) == 3
    assert len(res.held) == 2
    assert res.trips[0].describe(60.0) == ("5 of 20 nodes would change features within 60s; "
                                           "limit 3 (2 held)")
    res = gate.step({n: want(None, "a") for n in NODES[:5]} | all_want(None, NODES[5:]),
                    62.0, Timing(), lim)
    assert len(res.applied) == 2
    assert not res.trips


def test_pending_changes_say_when_and_unless() -> None:
    gate = Gate()
    gate.step(all_want(None), 0.0, Timing(), UNLIMITED)
    raw = all_want(None)
    raw["n03"] = want("fs", "a")
    res = gate.step(raw, 10.0, Timing(default_for=20.0, default_settle=5.0), UNLIMITED)
    lines = sorted(c.describe(10.0) for c in res.pending)
    assert lines == ["n03 drains (fs) in 20s unless the rule clears",
                     "n03 features -> a in 5s unless the value goes back"]


def test_the_baseline_keeps_the_targets_drains_and_the_wanted_features() -> None:
    """Starting a bridge is no mass change: its first step shows what it finds."""
    gate = Gate()
    raw = {n: want(None, "a") for n in NODES}
    res = gate.step(raw, 0.0, Timing(default_resume_after=60.0), Limits(1, 1, 60.0),
                    shown_drains={"n01": "fs"})
    assert res.wants["n01"].drain == "fs"
    assert not res.applied
    assert not res.held
    assert all(w.features == {"a"} for w in res.wants.values())
    assert [c.kind for c in res.pending] == ["resume"]


# -- properties ------------------------------------------------------------------------

steps = st.lists(st.tuples(st.floats(0.1, 30.0), st.sets(st.sampled_from(NODES[:8])),
                           st.sets(st.sampled_from(NODES[:8]))), min_size=1, max_size=40)
timings = st.builds(Timing, default_for=st.sampled_from([0.0, 2.0, 10.0]),
                    default_resume_after=st.sampled_from([0.0, 5.0, 30.0]),
                    default_settle=st.sampled_from([0.0, 3.0]))


def run(seq: list[tuple[float, set[str], set[str]]], timing: Timing, lim: Limits,
        ) -> list[tuple[float, GateResult]]:
    gate, t, out = Gate(), 0.0, []
    out.append((t, gate.step(all_want(None, NODES[:8]), t, timing, lim)))
    for dt, bad, tagged in seq:
        t += dt
        raw = {n: want("fs" if n in bad else None, *(("a",) if n in tagged else ()))
               for n in NODES[:8]}
        out.append((t, gate.step(raw, t, timing, lim)))
    return out


@settings(max_examples=80, deadline=None)
@given(steps, timings, st.integers(0, 8), st.integers(0, 8), st.sampled_from([5.0, 60.0]))
def test_never_more_than_the_limits(seq: list[tuple[float, set[str], set[str]]],
                                    timing: Timing, max_drained: int, max_changed: int,
                                    window: float) -> None:
    """At no step more than max_drained nodes are drained, and in no window more than
    max_changed nodes have had their features changed."""
    lim = Limits(max_drained, max_changed, window)
    changes: list[tuple[float, str]] = []
    for t, res in run(seq, timing, lim):
        assert sum(1 for w in res.wants.values() if w.drain) <= max_drained
        changes += [(t, c.node) for c in res.applied if c.kind == "features"]
        assert len({n for at, n in changes if at > t - window}) <= max_changed


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0.5, 20.0), min_size=1, max_size=60),
       st.sampled_from([0.0, 1.0, 3.0]), st.sampled_from([5.0, 30.0, 60.0]))
def test_an_oscillating_value_drains_and_resumes_at_most_once_per_resume_after(
        gaps: list[float], hold: float, resume_after: float) -> None:
    """Whatever the rhythm of the flips, two resumes (and two drains) of a node are at
    least resume_after apart."""
    gate, t, bad = Gate(), 0.0, False
    timing = Timing(default_for=hold, default_resume_after=resume_after)
    gate.step({"n": want(None)}, t, timing, UNLIMITED)
    drains: list[float] = []
    resumes: list[float] = []
    for gap in gaps:
        t += gap
        bad = not bad
        res = gate.step({"n": want("fs" if bad else None)}, t, timing, UNLIMITED)
        drains += [t for c in res.applied if c.kind == "drain"]
        resumes += [t for c in res.applied if c.kind == "resume"]
    for a, b in itertools.pairwise(resumes):
        assert b - a >= resume_after
    for a, b in itertools.pairwise(drains):
        assert b - a >= resume_after


@settings(max_examples=80, deadline=None)
@given(steps, timings)
def test_limits_not_hit_give_the_unguarded_result(
        seq: list[tuple[float, set[str], set[str]]], timing: Timing) -> None:
    """With limits no step can reach (8 nodes, limits 8), the guard changes nothing."""
    guarded = run(seq, timing, Limits(8, 8, 60.0))
    free = run(seq, timing, UNLIMITED)
    for (_, a), (_, b) in zip(guarded, free, strict=True):
        assert a.wants == b.wants
        assert not a.held
        assert not a.trips


@settings(max_examples=100, deadline=None)
@given(steps)
def test_no_delays_and_no_limits_show_the_raw_wants(
        seq: list[tuple[float, set[str], set[str]]]) -> None:
    """0s everywhere means at once: every step shows exactly what crr wants."""
    t = 0.0
    for (dt, bad, tagged), (_, res) in zip(seq, run(seq, Timing(), UNLIMITED)[1:],
                                           strict=True):
        t += dt
        assert res.wants == {n: want("fs" if n in bad else None,
                                     *(("a",) if n in tagged else ())) for n in NODES[:8]}
