"""Given/when/then cases for the pure fold (docs/contract.md, "Subjects and streams", "Payloads",
"`resources.yaml`")."""

from __future__ import annotations

import json

import msgspec
import pytest

from crr.projections.fold import Changes, apply, expire, fold, next_deadline
from crr.projections.record.snapshot import cluster_snapshot, host_names
from crr.projections.state import ProjectionState
from crr.schemas.catalog import Catalog
from crr.schemas.catalog_loader import load_catalog_text
from crr.schemas.codec import encode
from crr.schemas.subjects import DEADLETTER, event_subject
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
    snap,
)


def given_catalog() -> ProjectionState:
    """A state that has the test catalog (seq 1, at T0)."""
    state = ProjectionState()
    ch = apply(state, catalog_env(1, T0))
    assert ch.catalog
    assert ch.deadletter is None
    return state


# -- values -------------------------------------------------------------------


def test_valid_report_sets_fresh_values() -> None:
    """A valid report makes its values fresh with times derived from the receive time."""
    state = given_catalog()
    ch = apply(state, report_env(2, T0 + 1, "scratch", "n1",
                                 {"scratch_free": 812.5, "scratch_total": 1000}))
    assert ch == Changes(hosts=frozenset({"n1"}))
    v = snap(state, "n1").values["scratch_free"]
    assert (v.value, v.state, v.reporter) == (812.5, "fresh", "scratch")
    assert v.received_at == "2027-01-15T08:00:01.000Z"
    assert v.expires_at == "2027-01-15T08:00:16.000Z"  # interval 10 s + grace 5 s
    assert snap(state, "n1").values["scratch_total"].value == 1000
    assert snap(state, "n1").as_of.seq == 2
    assert snap(state, "n1").reporters["scratch"].state == "ok"


def test_invalid_value_keeps_previous() -> None:
    """An out-of-bounds value is rejected and the previous valid one stays."""
    state = given_catalog()
    apply(state, report_env(2, T0 + 1, "scratch", "n1", {"scratch_free": 10.0}))
    ch = apply(state, report_env(3, T0 + 2, "scratch", "n1",
                                 {"scratch_free": -1.0, "scratch_total": 50}))
    assert ch.deadletter is None
    s = snap(state, "n1")
    assert s.values["scratch_free"].value == 10.0
    assert s.values["scratch_free"].received_at == "2027-01-15T08:00:01.000Z"
    assert s.values["scratch_total"].value == 50
    rs = s.reporters["scratch"]
    assert (rs.state, rs.rejected) == ("rejecting", 1)
    assert rs.rejections == ["scratch_free: -1 is below the minimum 0"]


def test_wrong_kind_values_are_rejected_individually() -> None:
    """Bools for numbers, numbers for bools, over-long strings are each rejected with a reason."""
    state = given_catalog()
    apply(state, report_env(2, T0 + 1, "site", "n1", {"site_ok": 1, "site_state": "x" * 9}))
    apply(state, report_env(3, T0 + 1, "scratch", "n1", {"scratch_free": True}))
    s = snap(state, "n1")
    assert s.values == {}
    assert s.reporters["site"].rejections == [
        "site_ok: expected true or false, got 1",
        "site_state: string of 9 characters exceeds max_length 8",
    ]
    assert s.reporters["scratch"].rejections == ["scratch_free: expected a finite number, got true"]


def test_resource_of_another_reporter_rejected() -> None:
    """A value of a resource owned by another reporter is rejected; the rest applies."""
    state = given_catalog()
    apply(state, report_env(2, T0 + 1, "scratch", "n1",
                            {"site_ok": True, "nope": 1, "scratch_free": 3}))
    s = snap(state, "n1")
    assert set(s.values) == {"scratch_free"}
    assert s.reporters["scratch"].rejected == 2
    assert s.reporters["scratch"].rejections == [
        "site_ok: belongs to reporter 'site', not 'scratch'",
        "nope: not a resource in the catalog",
    ]


def test_nan_literal_rejected_while_others_apply() -> None:
    """A literal NaN (Python's json.dumps default) is rejected; the other values apply."""
    state = given_catalog()
    data = (b'{"reporter": "scratch", "host": "n1", "boot": "b", "seq": 1, '
            b'"observed_at": "2027-01-15T08:00:00Z", '
            b'"values": {"scratch_free": NaN, "scratch_total": Infinity}}')
    apply(state, report_env(2, T0, "scratch", "n1", {"scratch_total": 7}))
    ch = apply(state, raw_env(3, T0 + 1, event_subject("report", "scratch", "n1"), data))
    assert ch.deadletter is None
    s = snap(state, "n1")
    assert "scratch_free" not in s.values
    assert s.values["scratch_total"].value == 7
    assert s.reporters["scratch"].rejections == [
        "scratch_free: expected a finite number, got NaN",
        "scratch_total: expected a finite number, got Infinity",
    ]


def test_null_makes_value_unknown_and_it_still_expires() -> None:
    """`null` means unknown (value null); it goes stale on its own schedule."""
    state = given_catalog()
    apply(state, report_env(2, T0, "scratch", "n1", {"scratch_free": 5}))
    apply(state, report_env(3, T0 + 1, "scratch", "n1", {"scratch_free": None}))
    v = snap(state, "n1").values["scratch_free"]
    assert (v.value, v.state) == (None, "unknown")
    expire(state, T0 + 16)
    v = snap(state, "n1").values["scratch_free"]
    assert (v.value, v.state, v.last_value) == (None, "stale", None)


def test_string_set_canonicalised() -> None:
    """A string set is stored sorted and de-duplicated; more than max_items distinct is refused."""
    state = given_catalog()
    apply(state, report_env(2, T0, "datasets", "n1", {"datasets": ["c4", "imagenet", "c4"]}))
    assert snap(state, "n1").values["datasets"].value == ["c4", "imagenet"]
    apply(state, report_env(3, T0 + 1, "datasets", "n1", {"datasets": ["a", "b", "c", "d"]}))
    s = snap(state, "n1")
    assert s.values["datasets"].value == ["c4", "imagenet"]
    assert s.reporters["datasets"].rejections == ["datasets: 4 members exceed max_items 3"]
    apply(state, report_env(4, T0 + 2, "datasets", "n1", {"datasets": ["b", 3]}))
    assert snap(state, "n1").reporters["datasets"].rejections == [
        "datasets: expected a list of strings, item 1 is 3"]


def test_report_refreshes_only_its_values() -> None:
    """A value a report omits keeps its old times and expires on its own schedule."""
    state = given_catalog()
    apply(state, report_env(2, T0, "scratch", "n1", {"scratch_free": 1, "scratch_total": 2}))
    apply(state, report_env(3, T0 + 10, "scratch", "n1", {"scratch_free": 3}))
    expire(state, T0 + 15)
    s = snap(state, "n1")
    assert s.values["scratch_free"].state == "fresh"
    assert s.values["scratch_total"].state == "stale"
    assert s.values["scratch_total"].stale_since == "2027-01-15T08:00:15.000Z"


# -- staleness -----------------------------------------------------------------


def test_value_goes_stale_at_deadline_with_injected_now() -> None:
    """At now >= expires_at the value is stale: null, last_value kept, stamped with the deadline."""
    state = given_catalog()
    apply(state, report_env(2, T0, "scratch", "n1", {"scratch_free": 42}))
    assert expire(state, T0 + 14.999) == Changes()
    assert snap(state, "n1").values["scratch_free"].state == "fresh"
    ch = expire(state, T0 + 100)
    assert ch.hosts == frozenset({"n1"})
    v = snap(state, "n1").values["scratch_free"]
    assert (v.value, v.state, v.last_value) == (None, "stale", 42)
    assert v.stale_since == v.expires_at == "2027-01-15T08:00:15.000Z"
    assert snap(state, "n1").as_of.time == "2027-01-15T08:00:15.000Z"


def test_new_report_makes_stale_value_fresh() -> None:
    """A stale value is refreshed by the next report carrying it."""
    state = given_catalog()
    apply(state, report_env(2, T0, "scratch", "n1", {"scratch_free": 1}))
    expire(state, T0 + 20)
    apply(state, report_env(3, T0 + 21, "scratch", "n1", {"scratch_free": 2}))
    v = snap(state, "n1").values["scratch_free"]
    assert (v.value, v.state, v.stale_since, v.last_value) == (2, "fresh", None, None)


def test_next_deadline_and_expire_from_apply() -> None:
    """next_deadline says when expiry is due; apply runs expiry up to its own time first."""
    state = given_catalog()
    assert next_deadline(state) is None
    apply(state, report_env(2, T0, "scratch", "n1", {"scratch_free": 1}))
    assert next_deadline(state) == T0 + 15
    ch = apply(state, report_env(3, T0 + 30, "site", "n2", {"site_ok": True}))
    assert ch.hosts == frozenset({"n1", "n2"})
    assert snap(state, "n1").values["scratch_free"].state == "stale"
    assert snap(state, "n1").as_of.seq == 2  # expiry happened before event 3


def test_silent_reporter() -> None:
    """A reporter with no report within its lifetime is silent, since the deadline."""
    state = given_catalog()
    apply(state, report_env(2, T0, "scratch", "n1", {"scratch_free": 1}))
    expire(state, T0 + 40)
    rs = snap(state, "n1").reporters["scratch"]
    assert (rs.state, rs.since) == ("silent", "2027-01-15T08:00:15.000Z")
    apply(state, report_env(3, T0 + 41, "scratch", "n1", {"scratch_free": 1}))
    assert snap(state, "n1").reporters["scratch"].state == "ok"


def test_rejecting_then_ok() -> None:
    """`rejecting` lasts while the last report had rejections; a clean report clears it."""
    state = given_catalog()
    apply(state, report_env(2, T0, "scratch", "n1", {"scratch_free": "lots"}))
    rs = snap(state, "n1").reporters["scratch"]
    assert (rs.state, rs.rejected) == ("rejecting", 1)
    apply(state, report_env(3, T0 + 1, "scratch", "n1", {"scratch_free": 1}))
    rs = snap(state, "n1").reporters["scratch"]
    assert (rs.state, rs.rejected, rs.rejections) == ("ok", 0, [])
    assert rs.since == "2027-01-15T08:00:01.000Z"


def test_rejections_capped_at_ten_reasons() -> None:
    """`rejected` counts every rejected value, `rejections` keeps at most ten reasons."""
    state = given_catalog()
    apply(state, report_env(2, T0, "scratch", "n1", {f"x{i}": i for i in range(25)}))
    rs = snap(state, "n1").reporters["scratch"]
    assert rs.rejected == 25
    assert len(rs.rejections) == 10


# -- health and inventory ---------------------------------------------------------


def test_health_failure_wins_over_own_findings() -> None:
    """A failing Health state wins over silent/rejecting; ok Health lets them show again."""
    state = given_catalog()
    apply(state, report_env(2, T0, "scratch", "n1", {"scratch_free": -5}))
    apply(state, health_env(3, T0 + 1, "scratch", "n1", "failed", detail="exit 3: df", exit_code=3))
    rs = snap(state, "n1").reporters["scratch"]
    assert (rs.state, rs.health, rs.detail, rs.exit_code, rs.boot) == (
        "failed", "failed", "exit 3: df", 3, "b1")
    assert rs.since == "2027-01-15T08:00:01.000Z"
    apply(state, health_env(4, T0 + 2, "scratch", "n1", "ok"))
    rs = snap(state, "n1").reporters["scratch"]
    assert (rs.state, rs.health) == ("rejecting", "ok")


def test_inventory_fresh_then_stale_and_invalid_kept() -> None:
    """An inventory is stored with freshness; a malformed one is rejected and the old one kept."""
    state = given_catalog()
    good = [{"name": "gpu0", "attributes": {"model": {"string": "H100"}, "mem": {"int": 80}},
             "capacity": {"memory": {"value": "80Gi"}}}]
    apply(state, inventory_env(2, T0, "gpus", "n1", good))
    inv = snap(state, "n1").inventory["gpus"]
    assert (inv.state, inv.pool.generation, inv.devices[0].name) == ("fresh", 1, "gpu0")
    bad = [{"name": "gpu0", "attributes": {"model": {"string": "H100", "int": 1}}}]
    apply(state, inventory_env(3, T0 + 1, "gpus", "n1", bad, generation=2))
    s = snap(state, "n1")
    assert s.inventory["gpus"].pool.generation == 1
    assert s.reporters["gpus"].state == "rejecting"
    assert "exactly one of int, bool, string, version" in s.reporters["gpus"].rejections[0]
    expire(state, T0 + 15)
    inv = snap(state, "n1").inventory["gpus"]
    assert (inv.state, inv.stale_since) == ("stale", "2027-01-15T08:00:15.000Z")


def test_cluster_values_on_cluster_subject() -> None:
    """Cluster-scope values go to the cluster record."""
    state = given_catalog()
    ch = apply(state, report_env(2, T0, "flexlm", None, {"matlab_free": 12}))
    assert ch == Changes(cluster=True)
    assert cluster_snapshot(state).values["matlab_free"].value == 12
    assert host_names(state) == []


# -- dead letters ----------------------------------------------------------------------


def test_subject_payload_mismatch_dead_lettered() -> None:
    """A payload whose host or reporter disagrees with the subject is dead-lettered."""
    state = given_catalog()
    env = report_env(2, T0, "scratch", "n1", {"scratch_free": 1}, payload={"host": "n2"})
    ch = apply(state, env)
    assert ch.deadletter is not None
    assert "subject says" in ch.deadletter
    assert state.hosts == {}
    assert state.seq == 2
    ch = apply(state, report_env(3, T0, "scratch", "n1", {"scratch_free": 1},
                                 payload={"reporter": "site"}))
    assert ch.deadletter is not None
    assert state.hosts == {}


def test_wrong_scope_value_rejected_and_all_wrong_dead_lettered() -> None:
    """A host value on a cluster subject is rejected; a report of only such values is dead."""
    state = given_catalog()
    ch = apply(state, report_env(2, T0, "flexlm", "n1", {"matlab_free": 1}))
    assert ch.deadletter is not None
    assert "scope" in ch.deadletter
    assert state.hosts == {}
    cat = load_catalog_text(CATALOG_YAML.replace(
        "scope: host, reporter: scratch, interval: 10s, min: 0",
        "scope: host, reporter: flexlm, interval: 10s, min: 0"))
    apply(state, catalog_env(3, T0, cat))
    apply(state, report_env(4, T0, "flexlm", None, {"matlab_free": 1, "scratch_free": 2}))
    c = cluster_snapshot(state)
    assert set(c.values) == {"matlab_free"}
    assert c.reporters["flexlm"].rejections == [
        "scratch_free: a host-scope resource cannot be reported on a cluster subject"]


def test_garbage_bytes_dead_lettered() -> None:
    """Undecodable payloads and missing required fields are dead-lettered, never raised."""
    state = given_catalog()
    subject = event_subject("report", "scratch", "n1")
    for i, data in enumerate([b"\xff\xfe garbage", b"{}", b"[1,2]", b"",
                              b'{"reporter": "scratch", "host": "n1"}']):
        ch = apply(state, raw_env(10 + i, T0, subject, data))
        assert ch.deadletter is not None, data
    ch = apply(state, raw_env(20, T0, event_subject("health", "scratch", "n1"), b'{"x": 1}'))
    assert ch.deadletter is not None
    assert "state" in ch.deadletter or "reporter" in ch.deadletter
    assert state.hosts == {}
    assert state.seq == 20


def test_unknown_subject_dead_lettered_and_deadletter_subject_skipped() -> None:
    """Subjects outside docs/contract.md, "Subjects and streams" are dead-lettered;
    crr.v1.deadletter is skipped silently."""
    state = given_catalog()
    assert apply(state, raw_env(2, T0, "crr.v1.report.rack.x.y", b"{}")).deadletter is not None
    assert apply(state, raw_env(3, T0, "other.thing", b"{}")).deadletter is not None
    assert apply(state, raw_env(4, T0, DEADLETTER, b"whatever")) == Changes()


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
def test_huge_report_handled() -> None:
    """A ~10 MB payload is decoded and its values refused, or dead-lettered: never a crash."""
    state = given_catalog()
    big_values = {f"r{i:07d}": i for i in range(700_000)}
    env = report_env(2, T0, "scratch", "n1", {"scratch_free": 1, **big_values})
    assert len(env.data) > 10_000_000
    ch = apply(state, env)
    assert ch.deadletter is None
    rs = snap(state, "n1").reporters["scratch"]
    assert rs.rejected == 700_000
    assert len(rs.rejections) == 10
    assert snap(state, "n1").values["scratch_free"].value == 1
    huge = raw_env(3, T0, event_subject("report", "scratch", "n1"), b"[" * 10_000_000)
    assert apply(state, huge).deadletter is not None
    long_string = report_env(4, T0, "site", "n1", {"site_state": "x" * 10_000_000})
    apply(state, long_string)
    assert len(encode(snap(state, "n1"))) < 10_000


# -- catalog ---------------------------------------------------------------------------


def test_events_before_catalog_are_pending_then_applied() -> None:
    """Events before any catalog wait (latest per subject) and apply, in order, with it."""
    state = ProjectionState()
    assert apply(state, report_env(1, T0, "scratch", "n1", {"scratch_free": 1})) == Changes()
    apply(state, report_env(2, T0 + 1, "scratch", "n1", {"scratch_free": 2}))
    apply(state, health_env(3, T0 + 1, "site", "n2", "ok"))
    assert state.hosts == {}
    assert apply(state, report_env(4, T0, "scratch", "n1", {}, payload={"host": "zz"})).deadletter
    ch = apply(state, catalog_env(5, T0 + 2))
    assert ch == Changes(hosts=frozenset({"n1", "n2"}), catalog=True)
    s = snap(state, "n1")
    assert s.values["scratch_free"].value == 2
    assert s.values["scratch_free"].received_at == "2027-01-15T08:00:01.000Z"
    assert s.as_of.seq == 5
    assert snap(state, "n2").reporters["site"].health == "ok"
    assert state.pending == {}


def test_invalid_catalog_dead_lettered_previous_kept() -> None:
    """An invalid catalog is dead-lettered with its problems and the active one stays."""
    state = given_catalog()
    bad = json.loads(encode(CATALOG_OBJ))
    bad["resources"]["scratch_free"]["kind"] = "bogus"
    bad["resources"]["datasets"]["reporter"] = "nobody"
    ch = apply(state, raw_env(2, T0, "crr.v1.catalog", json.dumps(bad).encode()))
    assert ch.deadletter is not None
    assert "resources.scratch_free.kind" in ch.deadletter
    assert "resources.datasets.reporter" in ch.deadletter
    assert state.catalog == CATALOG_OBJ
    assert apply(state, raw_env(3, T0, "crr.v1.catalog", b"{nope")).deadletter is not None


def test_catalog_change_drops_undeclared_and_recomputes_expiry() -> None:
    """Dropped resources vanish, kept values' expires_at follows the new lifetime."""
    state = given_catalog()
    apply(state, report_env(2, T0, "scratch", "n1", {"scratch_free": 1, "scratch_total": 2}))
    apply(state, report_env(3, T0, "site", "n2", {"site_ok": True}))
    doc = json.loads(encode(CATALOG_OBJ))
    del doc["resources"]["scratch_total"]
    doc["resources"]["scratch_free"]["interval"] = 60.0
    cat = msgspec.convert(doc, Catalog)
    ch = apply(state, catalog_env(4, T0 + 1, cat))
    assert ch.catalog
    assert ch.hosts == frozenset({"n1"})
    s = snap(state, "n1")
    assert set(s.values) == {"scratch_free"}
    assert s.values["scratch_free"].expires_at == "2027-01-15T08:01:30.000Z"
    assert s.as_of.seq == 4
    expire(state, T0 + 80)
    assert snap(state, "n1").values["scratch_free"].state == "fresh"
    assert snap(state, "n2").values["site_ok"].state == "stale"
    assert apply(state, catalog_env(5, T0 + 81, cat)) == Changes()


def test_fold_convenience_equals_apply_loop() -> None:
    """fold() is apply over the events then expire at now."""
    envs = [catalog_env(1, T0), report_env(2, T0, "scratch", "n1", {"scratch_free": 1})]
    state = ProjectionState()
    for e in envs:
        apply(state, e)
    expire(state, T0 + 50)
    assert encoded_hosts(fold(envs, now=T0 + 50)) == encoded_hosts(state)
