"""The one freshness rule and the one liveness rule (projections/freshness.py), with properties."""

from __future__ import annotations

import math
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from crr.projections.freshness import (
    cluster_at,
    earliest_expiry,
    freshness_at,
    host_at,
    projector_liveness,
    value_state,
)
from crr.projections.record.codes import ABSENT, FRESH, NULL, STALE, entry_code
from crr.schemas.events import Pool
from crr.schemas.snapshot import (
    AsOf,
    ClusterSnapshot,
    HostSnapshot,
    InventoryEntry,
    ProjectorStatus,
    ValueEntry,
)
from crr.schemas.wire_time import expires_seconds, format_time
from tests.support.select import NOW as SELECT_NOW
from tests.support.select import NULL as NULL_SPEC
from tests.support.select import STALE as STALE_SPEC
from tests.support.select import Expired, make_table

T0 = 1_790_000_000.0
RANK = {"fresh": 0, "unknown": 0, "stale": 1}

states = st.sampled_from(["fresh", "stale", "unknown"])
times = st.floats(min_value=T0 - 1000, max_value=T0 + 1000, allow_nan=False)


@given(states, times, times, times)
def test_value_state_is_monotonic_in_now(recorded: str, expires: float, a: float,
                                         b: float) -> None:
    """Once stale, a value stays stale at every later `now`; it never becomes fresh again."""
    early, late = min(a, b), max(a, b)
    s1 = value_state(recorded, expires, early)  # type: ignore[arg-type]
    s2 = value_state(recorded, expires, late)  # type: ignore[arg-type]
    assert RANK[s1] <= RANK[s2]
    if s1 == "stale":
        assert s2 == "stale"


@given(states, times, times)
def test_never_fresh_past_expires(recorded: str, expires: float, now: float) -> None:
    """At or past `expires_at` a value is stale, whatever the record says; before, as recorded."""
    got = value_state(recorded, expires, now)  # type: ignore[arg-type]
    if now >= expires:
        assert got == "stale"
    else:
        assert got == recorded


def test_freshness_at_codes() -> None:
    """The HostTable codes map onto the same rule; never reported stays never reported."""
    assert freshness_at(ABSENT, math.inf, T0) == "never_reported"
    assert freshness_at(FRESH, T0 + 1, T0) == "fresh"
    assert freshness_at(FRESH, T0, T0) == "stale"
    assert freshness_at(NULL, T0 + 1, T0) == "unknown"
    assert freshness_at(NULL, T0 - 1, T0) == "stale"
    assert freshness_at(STALE, T0 + 1, T0) == "stale"


def _entry(value: float | None, state: str, expires: float) -> ValueEntry:
    return ValueEntry(value=value if state != "stale" else None, state=state,  # type: ignore[arg-type]
                      reporter="r", observed_at=format_time(T0 - 60),
                      received_at=format_time(T0 - 60), expires_at=format_time(expires),
                      last_value=value if state == "stale" else None,
                      stale_since=format_time(expires) if state == "stale" else None)


entries = st.builds(
    _entry, st.one_of(st.none(), st.floats(0, 1e6)), states,
    st.floats(min_value=T0 - 100, max_value=T0 + 100).map(lambda t: round(t, 3)))
snapshots = st.builds(
    lambda values: HostSnapshot(host="n1", as_of=AsOf(seq=1, time=format_time(T0)),
                                values=values),
    st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), entries))


@given(snapshots, times, times)
def test_host_at_applies_the_rule_and_keeps_the_shape(snap: HostSnapshot, a: float,
                                                       b: float) -> None:
    """host_at: each value's state is `value_state`; the record still decodes as a
    HostSnapshot; the same at the same `now` twice; stale values only grow with `now`."""
    early, late = min(a, b), max(a, b)
    at = host_at(snap, early)
    for name, entry in snap.values.items():
        now_state = at.values[name].state
        assert now_state == value_state(entry.state, expires_seconds(entry.expires_at), early)
        if now_state == "stale" and entry.state != "stale":
            assert at.values[name].value is None
            assert at.values[name].last_value == entry.value
            assert at.values[name].stale_since == entry.expires_at
    assert msgspec.json.decode(msgspec.json.encode(at), type=HostSnapshot) == at
    assert host_at(at, early) == at
    if early < earliest_expiry(snap):  # what readers cache: nothing due yet
        assert at is snap
    else:
        assert at != snap
    stale_early = {n for n, e in at.values.items() if e.state == "stale"}
    stale_late = {n for n, e in host_at(snap, late).values.items() if e.state == "stale"}
    assert stale_early <= stale_late


def test_host_at_returns_the_same_record_when_nothing_expired() -> None:
    """No copy when every value is still fresh (the common case on a live cluster)."""
    snap = HostSnapshot(host="n1", as_of=AsOf(seq=1, time=format_time(T0)),
                        values={"a": _entry(1.0, "fresh", T0 + 10)})
    assert host_at(snap, T0) is snap
    assert host_at(snap, T0 + 10).values["a"].state == "stale"


def test_inventory_and_cluster_follow_the_same_rule() -> None:
    """Inventory entries and the cluster record go stale at their expires_at too."""
    inv = InventoryEntry(pool=Pool(name="n1/gpus", generation=1), devices=[], state="fresh",
                         reporter="gpus", observed_at=format_time(T0),
                         received_at=format_time(T0), expires_at=format_time(T0 + 5))
    snap = HostSnapshot(host="n1", as_of=AsOf(seq=1, time=format_time(T0)),
                        inventory={"gpus": inv})
    assert host_at(snap, T0 + 4).inventory["gpus"].state == "fresh"
    later = host_at(snap, T0 + 5).inventory["gpus"]
    assert (later.state, later.stale_since) == ("stale", inv.expires_at)
    cluster = ClusterSnapshot(as_of=AsOf(seq=1, time=format_time(T0)),
                              values={"lic": _entry(3.0, "fresh", T0 + 1)})
    assert cluster_at(cluster, T0).values["lic"].state == "fresh"
    assert cluster_at(cluster, T0 + 2).values["lic"].state == "stale"


def _status(tick: float, *, lag: int = 0, partition: int | None = None,
            partitions: int | None = None) -> ProjectorStatus:
    return ProjectorStatus(last_seq=10, stream_last_seq=10 + lag, lag=lag,
                           last_tick=format_time(tick), started_at=format_time(T0 - 100),
                           partition=partition, partitions=partitions)


@given(st.lists(st.floats(0, 100), min_size=1, max_size=4), st.floats(0, 200),
       st.floats(0, 200), st.floats(0.5, 30))
def test_liveness_is_monotonic_in_now(ages: list[float], a: float, b: float,
                                      threshold: float) -> None:
    """Once silent, still silent later; the status age grows with `now`."""
    n = len(ages)
    statuses = [_status(T0 - age, partition=k if n > 1 else None, partitions=n if n > 1 else None)
                for k, age in enumerate(ages)]
    early, late = T0 + min(a, b), T0 + max(a, b)
    l1 = projector_liveness(statuses, early, threshold)
    l2 = projector_liveness(statuses, late, threshold)
    assert l1.last_status_age is not None
    assert l2.last_status_age is not None
    assert l1.last_status_age <= l2.last_status_age
    if l1.state == "silent":
        assert l2.state == "silent"
    assert (l1.state == "silent") == (l1.last_status_age > threshold)


def test_liveness_cases() -> None:
    """absent without a status; live with a recent one; silent with an old one or a missing
    partition; lag is summed over partitions."""
    absent = projector_liveness([], T0, 15)
    assert (absent.state, absent.last_status_age, absent.lag) == ("absent", None, None)
    live = projector_liveness([_status(T0 - 1, lag=3)], T0, 15)
    assert (live.state, live.lag) == ("live", 3)
    assert live.detail == "live: last status 1.0 s ago, lag 3"
    old = projector_liveness([_status(T0 - 20)], T0, 15)
    assert old.state == "silent"
    assert old.detail.startswith("silent: last status 20.0 s ago")
    parts = [_status(T0, lag=1, partition=0, partitions=3),
             _status(T0, lag=2, partition=2, partitions=3)]
    missing = projector_liveness(parts, T0, 15)
    assert (missing.state, missing.lag, missing.expected) == ("silent", 3, 3)
    assert "1 of 3 partition(s)" in missing.detail


value_specs = st.one_of(st.floats(0, 100), st.just(NULL_SPEC), st.just(STALE_SPEC),
                        st.floats(0, 100).map(Expired))


@given(st.dictionaries(st.sampled_from(["n1", "n2", "n3"]), value_specs, min_size=1),
       st.floats(-120, 120))
def test_select_columns_and_host_at_agree_with_the_rule(values: dict[str, Any],
                                                        offset: float) -> None:
    """The numpy columns `select[]` evaluates (`Column.known`/`stale`) and the records every
    other surface shows (`host_at`) give each value the state `freshness_at` gives it."""
    now = SELECT_NOW + offset
    table = make_table({h: {"free": v} for h, v in values.items()})
    col = table.column("free")
    assert col is not None
    for host in values:
        row = table.row_of(host)
        snap = table.get(host)
        assert row is not None
        assert snap is not None
        code, expires, _ = entry_code("numeric", snap.values["free"])
        rule = freshness_at(code, expires, now)
        assert bool(col.known(now)[row]) == (rule == "fresh")
        assert bool(col.stale(now)[row]) == (rule == "stale")
        assert host_at(snap, now).values["free"].state == rule
