"""The deadline heap (`crr.projections.deadlines`): what goes on it, when, for whom.

Pure core (no server).  Given a state, when an entry or a record's deadlines are pushed,
then the heap holds exactly what will come due, in order.
"""

from __future__ import annotations

import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from crr.projections.deadlines import (
    new_reporter,
    overdue_deadlines,
    push,
    push_record,
    rebuild_heap,
    reporter_of,
)
from crr.projections.fold import fold
from crr.projections.state import Batch, ProjectionState
from tests.support.fold import T0, catalog_env, report_env


def _catalogued() -> ProjectionState:
    return fold([catalog_env(1, T0)])


def _entries(state: ProjectionState) -> list[tuple[float, str | None, str, bool]]:
    """(due, host, reporter, has a batch) of every entry, in the order they come due."""
    return [(e.due, e.host, e.reporter, e.batch is not None)
            for e in sorted(state.heap)]


@settings(max_examples=60, deadline=None)
@given(dues=st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=40))
def test_push_keeps_the_heap_ordered_by_due_then_push_order(dues: list[float]) -> None:
    """Whatever the order of the pushes, entries come off the heap by due time, and
    entries due at the same time in the order they were pushed (`counter`)."""
    state = ProjectionState()
    for i, due in enumerate(dues):
        push(state, due, f"h{i}", "r", None)
    assert state.counter == len(dues)
    popped = [heapq.heappop(state.heap) for _ in dues]
    assert [(e.due, e.counter) for e in popped] == sorted(
        (due, i + 1) for i, due in enumerate(dues))


def test_push_names_the_batch_whose_values_come_due() -> None:
    """An entry carries the batch it settles (None: silence, inventory, overdue)."""
    state = ProjectionState()
    batch = Batch(("a",), (1,), "obs", T0, frozenset({"a"}))
    push(state, T0 + 5, "n1", "scratch", batch)
    push(state, T0 + 3, None, "flexlm", None)
    first, second = heapq.heappop(state.heap), heapq.heappop(state.heap)
    assert (first.due, first.host, first.reporter, first.batch) == (T0 + 3, None, "flexlm", None)
    assert (second.due, second.host, second.batch) == (T0 + 5, "n1", batch)


def test_a_new_reporter_is_due_for_each_declared_resource_by_its_lifetime() -> None:
    """Given the catalog (site: site_ok and site_state, 15 s each), when a reporter is
    first seen having set nothing, then one entry comes due at first sight + 15 s (one
    per distinct lifetime), with no batch; with both held, none."""
    state = _catalogued()
    rs = new_reporter(state, "site", "n1", T0 + 1)
    assert rs.first_seen == T0 + 1
    assert _entries(state) == [(T0 + 16, "n1", "site", False)]
    state = _catalogued()
    new_reporter(state, "site", "n1", T0 + 1, {"site_ok", "site_state"})
    assert state.heap == []


def test_a_reporter_that_declares_nothing_has_no_overdue_deadline() -> None:
    """`gpus` owns no resource in the catalog: nothing can be overdue."""
    state = _catalogued()
    rs = reporter_of(state, state.record("n1"), "gpus", "n1", T0)
    assert overdue_deadlines(state, rs, "gpus", "n1") == []
    assert state.heap == []


def test_reporter_of_makes_the_row_once() -> None:
    """The second call finds the row the first made (no second set of deadlines)."""
    state = _catalogued()
    rec = state.record("n1")
    rs = reporter_of(state, rec, "site", "n1", T0)
    pushed = len(state.heap)
    assert reporter_of(state, rec, "site", "n1", T0 + 50) is rs
    assert len(state.heap) == pushed
    assert rs.first_seen == T0


def test_overdue_deadlines_skip_what_is_held_or_already_overdue() -> None:
    """Only declared resources neither held by a batch nor overdue yet are due."""
    state = fold([catalog_env(1, T0), report_env(2, T0, "site", "n1", {"site_ok": True})])
    rs = state.hosts["n1"].reporters["site"]
    assert overdue_deadlines(state, rs, "site", "n1") == [T0 + 15]  # site_state
    rs.overdue = {"site_state"}
    assert overdue_deadlines(state, rs, "site", "n1") == []
    rs.overdue = None
    assert overdue_deadlines(state, rs, "site", "n1", also={"site_state"}) == []


def test_push_record_puts_a_records_every_pending_deadline_and_sets_batch_due() -> None:
    """Given a host with a report (one lifetime: one entry for its batch) and a silence
    deadline, when its deadlines are pushed again on an empty heap, then the heap holds
    the batch's entry (its `due` set to match) and the silence entry."""
    state = fold([catalog_env(1, T0),
                  report_env(2, T0 + 1, "scratch", "n1",
                             {"scratch_free": 1, "scratch_total": 2})])
    rec = state.hosts["n1"]
    batch = rec.reporters["scratch"].batches[0]
    lifetime = state.plan.lifetimes["scratch_free"]
    silence = state.plan.reporter_lifetime("scratch")
    state.heap = []
    batch.due = 0.0
    push_record(state, "n1", rec)
    assert batch.due == T0 + 1 + lifetime
    assert lifetime == silence  # (both entries come due at once: the batch's first)
    assert _entries(state) == [(T0 + 1 + lifetime, "n1", "scratch", True),
                               (T0 + 1 + silence, "n1", "scratch", False)]


def test_push_record_of_a_silent_reporter_with_stale_values_pushes_nothing() -> None:
    """Everything of it already came due: nothing is left to push."""
    state = fold([catalog_env(1, T0),
                  report_env(2, T0 + 1, "scratch", "n1",
                             {"scratch_free": 1, "scratch_total": 2})], now=T0 + 100)
    state.heap = []
    push_record(state, "n1", state.hosts["n1"])
    assert state.heap == []


def test_rebuild_heap_gives_what_the_fold_had_pending() -> None:
    """After a fold, the heap rebuilt from the records comes due at the same times as
    the heap the fold kept: less the entries of overwritten batches (which do nothing),
    and an entry of a batch refreshed in place since at the batch's new `due` (where
    expiry would push it again)."""
    state = fold([catalog_env(1, T0),
                  report_env(2, T0 + 1, "scratch", "n1", {"scratch_free": 1}),
                  report_env(3, T0 + 2, "scratch", "n1", {"scratch_free": 2}),
                  report_env(4, T0 + 3, "site", "n2", {"site_ok": True}),
                  report_env(5, T0 + 4, "flexlm", None, {"matlab_free": 3})])
    live = {(max(e.due, e.batch.due) if e.batch is not None else e.due, e.host, e.reporter)
            for e in state.heap if e.batch is None or not e.batch.dead}
    assert (T0 + 17, "n1", "scratch") in live  # refreshed in place at +2: due at +17
    rebuild_heap(state)
    assert {(e.due, e.host, e.reporter) for e in state.heap} == live
    assert all(e.batch is None or not e.batch.dead for e in state.heap)
