"""Properties of the fold: split-invariance, monotonic expiry, tick-independence (hypothesis)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import crr.projections.fold
import crr.projections.record.snapshot
from crr.projections.envelope import Envelope
from crr.projections.fold import apply, expire, fold
from crr.projections.record.snapshot import cluster_snapshot
from crr.projections.state import HEAP_FLOOR, ProjectionState, compact_heap
from crr.schemas.catalog_loader import load_catalog_text
from crr.schemas.codec import encode
from crr.schemas.subjects import event_subject
from tests.support.fold import (
    CATALOG_OBJ,
    CATALOG_YAML,
    T0,
    catalog_env,
    encoded_hosts,
    health_env,
    inventory_env,
    raw_env,
    report_env,
)

CATALOG_B = load_catalog_text(
    CATALOG_YAML.replace("interval: 20s, max_items: 3", "interval: 5s, max_items: 3")
    .replace("  scratch_total: {kind: numeric, scope: host, reporter: scratch, interval: 10s}\n",
             "")
)
"""A second catalog: datasets lives shorter, scratch_total is gone."""

CATALOG_C = load_catalog_text(
    CATALOG_YAML.replace("scope: host, reporter: datasets,", "scope: host, reporter: site,"))
"""A third: the string set `datasets` is one of `site`'s three resources, so a report of
some of them takes the partial fast path with a set to sort (`ReporterPlan.decoder`)."""

HOSTS = ["n1", "n2", "n3"]
VALUES: dict[str, list[Any]] = {
    "scratch_free": [0, 1.5, 812.5, -1, None, "x", True],
    "scratch_total": [10, 2000.25, None],
    "site_ok": [True, False, None, 1],
    "site_state": ["up", "draining", "way too long", None],
    "datasets": [["c4"], ["imagenet", "c4", "c4"], [], ["a", "b", "c", "d"], None],
    "matlab_free": [3, None],
    "bogus": [1],
}
OWNER = {"scratch_free": "scratch", "scratch_total": "scratch", "site_ok": "site",
         "site_state": "site", "datasets": "datasets", "matlab_free": "flexlm", "bogus": "site"}


@st.composite
def events(draw: st.DrawFn) -> list[Envelope]:
    """A stream: a catalog first (mostly), then reports, health, inventory, garbage, catalogs."""
    out: list[Envelope] = []
    t = T0
    if draw(st.integers(0, 4)):  # mostly; else the events wait for a later catalog
        out.append(catalog_env(1, t))
    n = draw(st.integers(min_value=1, max_value=25))
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.5, 3.0, 7.5, 15.0, 40.0]))
        seq = len(out) + 1
        kind = draw(st.sampled_from(["report"] * 6 + ["health", "inventory", "garbage",
                                                      "catalog"]))
        host = draw(st.sampled_from(HOSTS))
        if kind == "report":
            names = draw(st.lists(st.sampled_from(sorted(VALUES)), min_size=0, max_size=4,
                                  unique=True))
            reporter = draw(st.sampled_from(["scratch", "site", "datasets", "flexlm"]))
            if names:
                reporter = draw(st.sampled_from([OWNER[names[0]], reporter]))
            values = {nm: draw(st.sampled_from(VALUES[nm])) for nm in names}
            where = None if reporter == "flexlm" and draw(st.booleans()) else host
            out.append(report_env(seq, t, reporter, where, values))
        elif kind == "health":
            out.append(health_env(seq, t, draw(st.sampled_from(["scratch", "site"])), host,
                                  draw(st.sampled_from(["ok", "failed", "stopped"]))))
        elif kind == "inventory":
            attr = draw(st.sampled_from([{"int": 80}, {"string": "H100"}, {}]))
            out.append(inventory_env(seq, t, "gpus", host,
                                     [{"name": "gpu0", "attributes": {"a": attr}}],
                                     generation=i))
        elif kind == "garbage":
            out.append(raw_env(seq, t, event_subject("report", "scratch", host), b"{oops"))
        else:
            catalog = draw(st.sampled_from([CATALOG_OBJ, CATALOG_B, CATALOG_C]))
            out.append(catalog_env(seq, t, catalog))
    return out


STEADY: dict[str, list[list[str]]] = {
    "scratch": [["scratch_free"], ["scratch_free", "scratch_total"], ["scratch_total"]],
    "site": [["site_ok"], ["site_ok", "site_state"]],
    "datasets": [["datasets"]],
}
"""What a reporter's reports set, in `steady_events`: the same sets again and again."""


@st.composite
def steady_events(draw: st.DrawFn) -> list[Envelope]:
    """Reporters re-setting the same values, report after report, at times around their
    lifetimes (receive times going backwards now and then), among health events and
    catalog changes: the reports a batch is refreshed in place for, and its edges."""
    out = [catalog_env(1, T0)]
    t = T0
    for _ in range(draw(st.integers(min_value=1, max_value=40))):
        t += draw(st.sampled_from([0.0, 0.5, 3.0, 7.5, 14.9, 15.0, 16.0, 40.0, -1.0, -1.0]))
        seq = len(out) + 1
        host = draw(st.sampled_from(HOSTS[:2]))
        kind = draw(st.sampled_from(["report"] * 8 + ["health", "catalog"]))
        if kind == "report":
            reporter = draw(st.sampled_from(sorted(STEADY)))
            names = draw(st.sampled_from(STEADY[reporter]))
            values = {nm: draw(st.sampled_from(VALUES[nm][:2])) for nm in names}
            out.append(report_env(seq, t, reporter, host, values))
        elif kind == "health":
            out.append(health_env(seq, t, draw(st.sampled_from(["scratch", "site"])), host,
                                  draw(st.sampled_from(["ok", "failed"]))))
        else:
            out.append(catalog_env(seq, t, draw(st.sampled_from([CATALOG_OBJ, CATALOG_B,
                                                                  CATALOG_C]))))
    return out


def snapshot_bytes(state: ProjectionState) -> tuple[dict[str, bytes], bytes]:
    """Everything a reader could see, encoded."""
    return encoded_hosts(state), encode(cluster_snapshot(state))


def stale_set(state: ProjectionState) -> set[tuple[str, str]]:
    """(host, resource) pairs whose value is stale."""
    out = set()
    for h in state.hosts:
        for name, v in crr.projections.record.snapshot.host_snapshot(state, h).values.items():
            if v.state == "stale":
                out.add((h, name))
    return out


SETTINGS = settings(max_examples=60, deadline=None)


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@SETTINGS
@given(evs=events(), cut=st.integers(min_value=0, max_value=30), extra=st.floats(0, 100))
def test_concatenation_equals_two_steps(evs: list[Envelope], cut: int, extra: float) -> None:
    """fold(a + b) encodes byte-identically to fold(b) over fold(a)."""
    now = evs[-1].received_at + extra
    whole = fold(evs, now=now)
    split = fold(evs[cut:], now=now, state=fold(evs[:cut]))
    assert snapshot_bytes(whole) == snapshot_bytes(split)


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@SETTINGS
@given(evs=events(), data=st.data())
def test_intermediate_expiry_does_not_change_result(evs: list[Envelope], data: Any) -> None:
    """expire at arbitrary non-decreasing times between events leaves the final snapshot alone."""
    now = evs[-1].received_at + data.draw(st.floats(0, 100))
    reference = fold(evs, now=now)
    state = ProjectionState()
    last = T0
    for env in evs:
        for _ in range(data.draw(st.integers(0, 2))):
            last = data.draw(st.floats(last, max(last, env.received_at)))
            expire(state, last)
        apply(state, env)
        last = max(last, env.received_at)
    expire(state, now)
    assert snapshot_bytes(state) == snapshot_bytes(reference)


@SETTINGS
@given(evs=events(), steps=st.lists(st.floats(0, 60), min_size=1, max_size=6))
def test_expiry_is_monotonic(evs: list[Envelope], steps: list[float]) -> None:
    """Without new events the set of stale values only grows, and stale stays stale."""
    state = fold(evs)
    now = evs[-1].received_at
    seen = stale_set(state)
    for step in steps:
        now += step
        expire(state, now)
        current = stale_set(state)
        assert seen <= current
        seen = current


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@SETTINGS
@given(evs=st.one_of(events(), steady_events()), extra=st.floats(0, 100))
def test_fast_path_agrees_with_value_by_value_path(evs: list[Envelope], extra: float) -> None:
    """The fast validation (one typed decode) stores the same as checking each value on its
    own (`ProjectionState.typed_validation` off): the same bytes, batches and deadline."""
    now = evs[-1].received_at + extra
    fast = fold(evs, now=now)
    slow = fold(evs, now=now, state=ProjectionState(typed_validation=False))
    assert snapshot_bytes(fast) == snapshot_bytes(slow)
    assert _batches_and_overdue(fast) == _batches_and_overdue(slow)
    assert crr.projections.fold.next_deadline(fast) == crr.projections.fold.next_deadline(slow)


def test_partial_fast_path_agrees_on_a_set_to_sort() -> None:
    """A report of some of a reporter's resources (`ReporterPlan.decoder`) with a set to
    sort and de-duplicate, beside one with an invalid value and one of the whole set:
    the same bytes as the value-by-value path, and the set stored sorted."""
    evs = [catalog_env(1, T0, CATALOG_C),
           report_env(2, T0 + 1, "site", "n1", {"datasets": ["imagenet", "c4", "c4"]}),
           report_env(3, T0 + 2, "site", "n2", {"site_ok": True, "datasets": ["b", "a"]}),
           report_env(4, T0 + 3, "site", "n3", {"site_ok": 1, "datasets": ["z"]}),
           report_env(5, T0 + 4, "site", "n3", {"site_state": "up", "bogus": 1})]
    fast = fold(evs, now=T0 + 5)
    slow = fold(evs, now=T0 + 5, state=ProjectionState(typed_validation=False))
    assert snapshot_bytes(fast) == snapshot_bytes(slow)
    assert b'"value":["c4","imagenet"]' in snapshot_bytes(fast)[0]["n1"]


def _batches_and_overdue(state: ProjectionState) -> dict[tuple[str, str], Any]:
    """Per host and reporter: its live batches' names and times, and what is overdue (what
    the bytes may not show yet: a batch kept that a newer one shadows, an overdue name
    set since)."""
    return {(h, r): ([(sorted(b.keyset), b.received_at) for b in rs.batches],
                     sorted(rs.overdue or ()))
            for h, rec in state.hosts.items() for r, rs in rec.reporters.items()}


def test_partial_after_other_values_agrees_at_every_step() -> None:
    """A partial report of other values than its reporter's last one takes its own batch
    and deadline in the steady state (`crr.projections.reports.store`): after a
    full report, after another partial one, re-setting an older batch whole (which is
    dropped), and setting a resource overdue by then.  After every event and expiry: the
    same bytes and next deadline as the value-by-value path."""
    scratch: list[dict[str, Any]] = [
        {"scratch_free": 1, "scratch_total": 10}, {"scratch_free": 2}, {"scratch_total": 20},
        {"scratch_free": 3}, {"scratch_free": 4, "scratch_total": 30}, {"scratch_total": 40},
        {"scratch_free": 5}]
    evs = [catalog_env(1, T0)]
    for i, values in enumerate(scratch):
        evs.append(report_env(len(evs) + 1, T0 + 1 + 2 * i, "scratch", "n1", values))
    # site_state unreported until 16 s after the first report: overdue at 15 s (the
    # reporter, heard at 10 s, is not silent)
    for at, values in ((0, {"site_ok": True}), (10, {"site_ok": True}),
                       (16, {"site_state": "up"}), (20, {"site_ok": False})):
        evs.append(report_env(len(evs) + 1, T0 + 30 + at, "site", "n2", values))
    # the same value again, received before the first (the server's clock stepped back):
    # not refreshed in place, its batch replaced
    for when in (50.0, 49.0):
        evs.append(report_env(len(evs) + 1, T0 + when, "scratch", "n3", {"scratch_free": when}))
    fast, slow = ProjectionState(), ProjectionState(typed_validation=False)
    for env in evs:
        apply(fast, env)
        apply(slow, env)
        expire(fast, env.received_at + 0.5)
        expire(slow, env.received_at + 0.5)
        assert snapshot_bytes(fast) == snapshot_bytes(slow), env.seq
        assert _batches_and_overdue(fast) == _batches_and_overdue(slow), env.seq
        assert crr.projections.fold.next_deadline(fast) == crr.projections.fold.next_deadline(
            slow), env.seq
    for now in (T0 + 60, T0 + 100):
        expire(fast, now)
        expire(slow, now)
        assert snapshot_bytes(fast) == snapshot_bytes(slow)


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@SETTINGS
@given(evs=events(), extra=st.floats(0, 100))
def test_heap_compaction_changes_nothing(evs: list[Envelope], extra: float) -> None:
    """Dropping the dead batches' deadline entries after every event (`compact_heap`) gives
    the same bytes, at every step, as leaving them for expiry to skip."""
    lazy, compacted = ProjectionState(), ProjectionState()
    lazy.heap_limit = 1 << 62  # never compacted
    for env in evs:
        apply(lazy, env)
        apply(compacted, env)
        compact_heap(compacted)
        assert snapshot_bytes(compacted) == snapshot_bytes(lazy)
    now = evs[-1].received_at + extra
    expire(lazy, now)
    expire(compacted, now)
    assert snapshot_bytes(compacted) == snapshot_bytes(lazy)
    assert all(e.batch is None or not e.batch.dead for e in compacted.heap)


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@SETTINGS
@given(evs=st.one_of(steady_events(), events()), extra=st.floats(0, 100),
       ticks=st.lists(st.sampled_from([None, None, 0.5, 1.0, 14.5]), min_size=40,
                      max_size=40))
def test_refresh_in_place_changes_nothing(evs: list[Envelope], extra: float,
                                          ticks: list[float | None]) -> None:
    """A report re-setting what its reporter's last report set refreshes that batch in
    place (no new heap entry; the old one, come due early, goes back at the new time):
    at every step, after expiry between events (`ticks`) and at the end, the same bytes
    and the same next deadline as a new batch with an entry of its own for every report."""
    fresh, refreshed = ProjectionState(refresh_in_place=False), ProjectionState()
    for env, tick in zip(evs, ticks + [None] * len(evs), strict=False):
        apply(fresh, env)
        apply(refreshed, env)
        if tick is not None:
            expire(fresh, env.received_at + tick)
            expire(refreshed, env.received_at + tick)
        assert snapshot_bytes(refreshed) == snapshot_bytes(fresh)
        assert crr.projections.fold.next_deadline(refreshed) == crr.projections.fold.next_deadline(
            fresh)
    now = max(e.received_at for e in evs) + extra
    expire(fresh, now)
    expire(refreshed, now)
    assert snapshot_bytes(refreshed) == snapshot_bytes(fresh)
    assert (crr.projections.fold.next_deadline(refreshed)
            == crr.projections.fold.next_deadline(fresh))


def _missing_by_the_rule(state: ProjectionState, rs: Any, reporter: str) -> list[str]:
    """`missing` as its rule says it, without the shortcut: each declared resource whose
    newest batch holds it stale, or that no batch holds and is overdue."""
    current: dict[str, bool] = {}
    for b in rs.batches:
        for name in b.keyset:
            current[name] = b.stale is not None and name in b.stale
    overdue = rs.overdue or set()
    return sorted(n for n in state.plan.declared(reporter, "host")
                  if current.get(n, False) or (n not in current and n in overdue))


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@SETTINGS
@given(evs=st.one_of(steady_events(), events()),
       ticks=st.lists(st.sampled_from([None, None, 0.5, 14.5, 40.0]), min_size=40,
                      max_size=40))
def test_missing_takes_its_shortcut_only_where_the_rule_says_nothing(
        evs: list[Envelope], ticks: list[float | None]) -> None:
    """`missing` answers [] at once when nothing is stale or overdue (a steady state, partial
    reports or not): after every event and expiry, the same list as the rule."""
    state = ProjectionState()
    for env, tick in zip(evs, ticks + [None] * len(evs), strict=False):
        apply(state, env)
        if tick is not None:
            expire(state, env.received_at + tick)
        for rec in state.hosts.values():
            for reporter, rs in rec.reporters.items():
                assert crr.projections.record.snapshot.missing(state, rs, reporter, "host") == (
                    _missing_by_the_rule(state, rs, reporter)), reporter


def test_refresh_when_receive_time_goes_backwards() -> None:
    """A report received before the one it re-sets (the server's clock stepped back) is
    due earlier than that report's heap entry: it is not refreshed in place (its entry
    would come due late), and its value turns stale on time."""
    evs = [catalog_env(1, T0),
           report_env(2, T0 + 10, "scratch", "n1", {"scratch_free": 1}),
           report_env(3, T0 + 9, "scratch", "n1", {"scratch_free": 2})]
    state = fold(evs)
    assert crr.projections.fold.next_deadline(state) == T0 + 24
    fold([], now=T0 + 24, state=state)
    assert ("n1", "scratch_free") in stale_set(state)


def test_heap_stays_bounded_under_frequent_reports() -> None:
    """Values reported far more often than they live (10k reports 1 ms apart; they live
    longer than the 10 s they take).  Reports that re-set what the last one set refresh
    its batch in place: no heap entry per report, compacted or not.  Reports alternating
    between all of a reporter's values and some of them leave a dead entry every other
    report; the heap keeps the live entries, not those, as lazy deletion alone does."""
    same = fold([catalog_env(1, T0)])
    same.heap_limit = 1 << 62  # never compacted
    for i in range(10_000):
        apply(same, report_env(i + 2, T0 + i / 1000, "scratch", "n1", {"scratch_free": i}))
    assert len(same.heap) <= 3  # the batch's entry, the silence's, the overdue total's
    lazy, state = fold([catalog_env(1, T0)]), fold([catalog_env(1, T0)])
    lazy.heap_limit = 1 << 62
    for i in range(10_000):
        values: dict[str, Any] = {"scratch_free": i}
        if i % 2 == 0:
            values["scratch_total"] = 2000
        env = report_env(i + 2, T0 + i / 1000, "scratch", "n1", values)
        apply(lazy, env)
        apply(state, env)
    assert len(lazy.heap) > 4_000
    assert len(state.heap) <= HEAP_FLOOR
    assert sum(1 for e in state.heap if e.batch is not None and not e.batch.dead) == 2
    assert snapshot_bytes(state) == snapshot_bytes(lazy)
