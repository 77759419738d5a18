"""The snapshot is the checkpoint: state -> records -> restored state goes on identically.

Pure core (no server): `crr.projections.checkpoint` against `crr.projections.fold`.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crr.projections.checkpoint import (
    CheckpointError,
    Deferred,
    Lazy,
    decode_record,
    earliest_due,
    record_of,
    restore,
)
from crr.projections.envelope import Envelope
from crr.projections.fold import apply, expire, fold, next_deadline
from crr.projections.record.snapshot import cluster_snapshot, host_snapshot
from crr.projections.state import ProjectionState
from crr.schemas.catalog_loader import catalog_from_wire
from crr.schemas.codec import encode
from crr.schemas.events import Forget
from crr.schemas.snapshot_views import CheckpointRecord
from crr.schemas.subjects import forget_subject
from tests.projections.test_fold_properties import events, snapshot_bytes
from tests.support.fold import CATALOG_OBJ, T0, catalog_env, health_env, report_env

JITTER = 0.000123456789
"""Added to every receive time: server timestamps have sub-millisecond digits that the
RFC 3339 strings round away, so a restore from the strings alone would drift."""


def jittered(evs: list[Envelope]) -> list[Envelope]:
    """The same events with receive times that are not whole milliseconds."""
    return [msgspec.structs.replace(e, received_at=e.received_at + JITTER) for e in evs]


def restarted(state: ProjectionState, now: float,
              lazy: Lazy | None = None, *, bounded: bool = False) -> ProjectionState:
    """What a restarted projector holds: the state restored from its own encoded records,
    as the previous one left them after its last flush (expired at `now`).  With `lazy`,
    the host records go there, to be placed when needed (as the projector does).
    `bounded`: as from a status of checkpoint format 2, the records are not read: each
    waits until the state's next deadline at the cut (the status's `next_due_ts`)."""
    expire(state, now)
    bound = next_deadline(state)
    if state.catalog is None:
        return state  # no checkpoint without a catalog: the projector rebuilds from events
    hosts = {h: encode(host_snapshot(state, h)) for h in state.hosts}
    catalog = catalog_from_wire(msgspec.json.decode(encode(state.catalog)))
    cluster = decode_record(encode(cluster_snapshot(state)))
    if lazy is None:
        return restore(catalog, state.catalog_seq, state.seq,
                       [*map(decode_record, hosts.values()), cluster])
    again = restore(catalog, state.catalog_seq, state.seq, [cluster])
    if bounded:
        for name, data in hosts.items():
            lazy.add(name, data, math.inf if bound is None else bound, exact=False)
        return again
    for data in hosts.values():
        host, _, due = earliest_due(again, data)
        assert host is not None
        lazy.add(host, data, due)
    return again


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@settings(max_examples=80, deadline=None)
@given(evs=events(), data=st.data())
def test_restarts_anywhere_give_the_same_bytes(evs: list[Envelope], data: Any) -> None:
    """Any event sequence with restarts inserted anywhere encodes byte-identically to the
    same sequence folded without a restart (at the end and after more expiry)."""
    evs = jittered(evs)
    now = evs[-1].received_at + data.draw(st.floats(0, 100))
    reference = fold(evs, now=now)
    restarts = set(data.draw(st.lists(st.integers(0, len(evs)), max_size=4)))
    state = ProjectionState()
    for i, env in enumerate(evs):
        if i in restarts and i > 0:
            state = restarted(state, evs[i - 1].received_at)
        apply(state, env)
    if len(evs) in restarts:
        state = restarted(state, evs[-1].received_at)
    expire(state, now)
    assert snapshot_bytes(state) == snapshot_bytes(reference)


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@pytest.mark.parametrize("bounded", [False, True])
@settings(max_examples=80, deadline=None)
@given(evs=events(), data=st.data())
def test_lazy_restarts_anywhere_give_the_same_bytes(evs: list[Envelope], data: Any,
                                                    bounded: bool) -> None:
    """The same with host records placed only when needed (before an event of the host or
    a catalog, by their first deadline): the bytes are those of a fold without restarts.
    `bounded`: the records are not read at restart at all, only bounded by the state's
    next deadline (what the status's `next_due_ts` says), and some are `refine`d
    between events (as the projector does after it is ready)."""
    evs = jittered(evs)
    now = evs[-1].received_at + data.draw(st.floats(0, 100))
    reference = fold(evs, now=now)
    restarts = set(data.draw(st.lists(st.integers(1, len(evs)), max_size=4)))
    state = ProjectionState()
    lazy = Lazy()
    for i, env in enumerate(evs):
        if i in restarts:
            lazy.everything(state)  # what the previous life had not placed yet is in it
            if bounded:
                lazy = Lazy(upto=state.seq)
            state = restarted(state, evs[i - 1].received_at, lazy, bounded=bounded)
        if bounded:
            lazy.refine(state, data.draw(st.integers(0, 2)))
        lazy.before(state, env.subject, env.received_at)
        apply(state, env)
    lazy.due(state, now)
    expire(state, now)
    lazy.everything(state)
    assert snapshot_bytes(state) == snapshot_bytes(reference)


def test_a_bounded_record_is_read_only_when_its_bound_comes() -> None:
    """A record added with a bound waits untouched until it; then its own first deadline
    is read and it waits on for that (or is placed if due)."""
    t = T0 + JITTER
    state = fold([catalog_env(1, t),
                  report_env(2, t + 1, "scratch", "n1", {"scratch_free": 5})])
    data = encode(host_snapshot(state, "n1"))
    _, _, first = earliest_due(state, data)
    lazy = Lazy(upto=state.seq)
    again = restarted(state, t + 2)  # the catalog and cluster only: hosts go to `lazy`
    again.hosts.clear()
    lazy.add("n1", data, t + 3, exact=False)
    lazy.due(again, t + 2.5)
    assert "n1" not in again.hosts
    assert lazy.next_due == t + 3
    lazy.due(again, t + 3)  # the bound: read, not due yet
    assert "n1" not in again.hosts
    assert lazy.next_due == first
    lazy.due(again, first)
    assert "n1" in again.hosts
    assert len(lazy) == 0
    # Refined beforehand: the bound's entry is a left-over, the record waits for its own.
    lazy = Lazy(upto=state.seq)
    again.hosts.clear()
    lazy.add("n1", data, t + 3, exact=False)
    assert lazy.unrefined == 1
    lazy.refine(again, 10)
    assert lazy.unrefined == 0
    lazy.due(again, t + 3)
    assert "n1" not in again.hosts
    assert lazy.next_due == first
    lazy.due(again, first)
    assert "n1" in again.hosts
    assert len(lazy) == 0


def test_a_stale_value_does_not_hide_a_declared_resource_still_to_come_due() -> None:
    """Given a silent reporter whose one value is stale (so in `missing` too), one of its
    resources overdue, and one it was given by a catalog change, never reported and not
    due yet; when its record's first deadline is read, then it is that resource's (first
    sight + its lifetime), and a lazy record placed then goes overdue as a fold would.

    (The flake of `test_lazy_restarts_anywhere_give_the_same_bytes`: the stale value was
    counted twice, so nothing seemed left to come due, and the record was placed only
    after the reference fold had marked `datasets` overdue.)"""
    resources = dict(CATALOG_OBJ.resources)
    resources["datasets"] = msgspec.structs.replace(resources["datasets"], reporter="site")
    moved = msgspec.structs.replace(CATALOG_OBJ, resources=resources)
    evs = [catalog_env(1, T0), report_env(2, T0, "site", "n1", {"site_ok": True}),
           catalog_env(3, T0 + 15, moved)]  # site is silent and site_ok stale at +15
    state = fold(evs, now=T0 + 20)
    data = encode(host_snapshot(state, "n1"))
    site = decode_record(data).reporters["site"]
    assert (site.silent, site.missing) == (True, ["site_ok", "site_state"])
    _, _, due = earliest_due(state, data)
    assert due == T0 + 30  # datasets: first sight + its 30 s lifetime
    reference = fold(evs, now=T0 + 40)
    lazy = Lazy()
    again = restarted(state, T0 + 20, lazy)
    lazy.due(again, T0 + 40)
    expire(again, T0 + 40)
    assert "datasets" in host_snapshot(again, "n1").reporters["site"].missing
    assert snapshot_bytes(again) == snapshot_bytes(reference)


@pytest.mark.parametrize(("host", "upto", "says"), [("n2", 2, "names host 'n1'"),
                                                     ("n1", 1, "reflects seq 2")])
def test_a_lazy_record_of_another_host_or_past_the_status_is_refused(
        host: str, upto: int, says: str) -> None:
    """Placing checks what was not read at start: the record's host and `as_of`."""
    t = T0 + JITTER
    state = fold([catalog_env(1, t),
                  report_env(2, t + 1, "scratch", "n1", {"scratch_free": 5})])
    lazy = Lazy(upto=upto)
    lazy.add(host, encode(host_snapshot(state, "n1")), t, exact=False)
    with pytest.raises(CheckpointError, match=says):
        lazy.everything(ProjectionState())


def test_partial_reports_survive_a_restart() -> None:
    """The issue's case: `datasets` reported once, then reports of other values on the
    same subject; after a restore both are still fresh, with their own deadlines."""
    t = T0 + JITTER
    evs = [catalog_env(1, t),
           report_env(2, t + 1, "scratch", "n1", {"scratch_free": 5, "scratch_total": 9}),
           report_env(3, t + 4, "scratch", "n1", {"scratch_free": 6})]
    state = fold(evs)
    before = encode(host_snapshot(state, "n1"))
    again = restarted(state, t + 4)
    assert encode(host_snapshot(again, "n1")) == before
    free = host_snapshot(again, "n1").values
    assert (free["scratch_total"].state, free["scratch_total"].value) == ("fresh", 9)
    assert free["scratch_total"].expires_ts == t + 1 + 15
    expire(again, t + 1 + 15)
    expire(state, t + 1 + 15)
    assert encode(host_snapshot(again, "n1")) == encode(host_snapshot(state, "n1"))
    assert host_snapshot(again, "n1").values["scratch_total"].state == "stale"
    assert host_snapshot(again, "n1").values["scratch_free"].state == "fresh"


def test_rejected_total_counts_across_reports_and_restarts() -> None:
    """`rejected` is the last report's; `rejected_total` adds up, also over a restore."""
    evs = [catalog_env(1, T0),
           report_env(2, T0 + 1, "scratch", "n1", {"scratch_free": -1}),
           report_env(3, T0 + 2, "scratch", "n1", {"scratch_free": "x", "scratch_total": "y"})]
    state = restarted(fold(evs), T0 + 2)
    apply(state, report_env(4, T0 + 3, "scratch", "n1", {"scratch_free": 1}))
    rs = host_snapshot(state, "n1").reporters["scratch"]
    assert (rs.rejected, rs.rejected_total, rs.state) == (0, 3, "ok")


def test_missing_lists_resources_an_ok_reporter_never_reports() -> None:
    """A reporter that keeps reporting one of its two resources says `ok`, and after the
    other's interval + grace lists it in `missing`; reporting it clears the list."""
    evs = [catalog_env(1, T0), report_env(2, T0 + 1, "scratch", "n1", {"scratch_free": 5})]
    state = fold(evs)
    assert host_snapshot(state, "n1").reporters["scratch"].missing == []
    apply(state, report_env(3, T0 + 10, "scratch", "n1", {"scratch_free": 5}))
    ch = expire(state, T0 + 16.5)
    rs = host_snapshot(state, "n1").reporters["scratch"]
    assert (rs.state, rs.missing) == ("ok", ["scratch_total"])
    assert ch.hosts == frozenset({"n1"})
    assert host_snapshot(state, "n1").as_of.ts == T0 + 1 + 15  # stamped with the deadline
    apply(state, report_env(4, T0 + 17, "scratch", "n1", {"scratch_total": 5}))
    assert host_snapshot(state, "n1").reporters["scratch"].missing == []


def test_missing_lists_stale_values_and_a_health_only_reporter() -> None:
    """A value gone stale is missing; a reporter seen only through Health misses all."""
    evs = [catalog_env(1, T0), health_env(2, T0, "site", "n1", "ok"),
           report_env(3, T0 + 1, "scratch", "n1", {"scratch_free": 5, "scratch_total": 1}),
           report_env(4, T0 + 12, "scratch", "n1", {"scratch_free": 5})]
    state = fold(evs, now=T0 + 17)
    reporters = host_snapshot(state, "n1").reporters
    assert reporters["scratch"].missing == ["scratch_total"]
    assert reporters["site"].missing == ["site_ok", "site_state"]


def test_records_of_an_older_writer_are_refused() -> None:
    """A record without the checkpoint fields cannot be restored (the caller rebuilds)."""
    state = fold([catalog_env(1, T0), report_env(2, T0, "scratch", "n1", {"scratch_free": 1})])
    snap = host_snapshot(state, "n1")
    old = msgspec.structs.replace(snap, as_of=msgspec.structs.replace(snap.as_of, ts=None))
    with pytest.raises(CheckpointError, match="older writer"):
        record_of(decode_record(encode(old)))


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@settings(max_examples=80, deadline=None)
@given(evs=events(), data=st.data())
def test_records_newer_than_the_status_are_not_applied_twice(
        evs: list[Envelope], data: Any) -> None:
    """A kill after some records of a later flush were written but before its status:
    the restore starts from the status (after event i) with those newer records (of
    the state after event j) placed as the fold passes them; the bytes at the end are
    those of a fold that never stopped."""
    evs = jittered(evs)
    now = evs[-1].received_at + data.draw(st.floats(0, 100))
    reference = fold(evs, now=now)
    i = data.draw(st.integers(1, len(evs)))
    j = data.draw(st.integers(i, len(evs)))
    at_status = fold(evs[:i], now=evs[i - 1].received_at)
    if at_status.catalog is None:
        return  # nothing to restore from: the projector rebuilds
    later = fold(evs[:j], now=evs[j - 1].received_at)
    written = set(data.draw(st.lists(st.sampled_from([None, *sorted(later.hosts)]),
                                     unique=True)))

    def record(state: ProjectionState, host: str | None) -> CheckpointRecord:
        snap = cluster_snapshot(state) if host is None else host_snapshot(state, host)
        return decode_record(encode(snap))

    seq = at_status.seq
    now_records, newer = [], []
    for host in [None, *sorted(set(at_status.hosts) | set(later.hosts))]:
        if host in written and record(later, host).as_of.seq > seq:
            newer.append((host, record(later, host)))
        elif host is None or host in at_status.hosts:
            now_records.append(record(at_status, host))
    catalog = catalog_from_wire(msgspec.json.decode(encode(at_status.catalog)))
    state = restore(catalog, at_status.catalog_seq, seq, now_records)
    deferred = Deferred(newer)
    for env in evs[i:]:
        deferred.place_before(state, env.seq)
        apply(state, env)
    deferred.place_rest(state)
    expire(state, now)
    assert snapshot_bytes(state) == snapshot_bytes(reference)


def test_a_forget_after_a_lazy_restore_drops_the_waiting_record() -> None:
    """`crr hosts forget` right after a restart: the host's record still waits in `Lazy`
    (its first deadline is far off), and the forget instruction must place it first —
    else the fold drops nothing and the record comes back when placed later."""
    t = T0 + JITTER
    state = fold([catalog_env(1, t),
                  report_env(2, t + 1, "scratch", "n1", {"scratch_free": 5}),
                  report_env(3, t + 1, "scratch", "n2", {"scratch_free": 7})])
    lazy = Lazy()
    again = restarted(state, t + 2, lazy)
    assert "n1" not in again.hosts  # nothing placed yet
    assert len(lazy) == 2
    body = encode(Forget(host="n1", requested_at="2026-12-02T14:00:00.000Z"))
    forget = Envelope(seq=4, subject=forget_subject("n1"), received_at=t + 3, data=body)
    lazy.before(again, forget.subject, forget.received_at)
    apply(again, forget)
    lazy.everything(again)
    assert sorted(again.hosts) == ["n2"]
