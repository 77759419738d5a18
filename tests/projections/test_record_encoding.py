"""The projector's record encoder (`host_record`, `cluster_record`) writes exactly the bytes of
`encode(host_snapshot(...))`, which replay, `crr hosts` and the golden samples use; its
columns header (`host_columns`) is `columns_of` the record's entries."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crr.producers.simulator import Faults, Fleet, sim_catalog
from crr.projections.envelope import Envelope
from crr.projections.fold import apply, expire
from crr.projections.record.body import cluster_record, host_record
from crr.projections.record.columns import columns_of, host_columns
from crr.projections.record.snapshot import cluster_snapshot, host_snapshot
from crr.projections.state import ProjectionState
from crr.schemas.codec import encode
from crr.schemas.subjects import CATALOG
from tests.projections.test_fold_properties import events
from tests.support.fold import T0, catalog_env, report_env


def assert_records_match(state: ProjectionState) -> None:
    """Every host record and the cluster record, both ways, byte for byte; every host's
    columns header is `columns_of` its record's entries."""
    for host in state.hosts:
        snapshot = host_snapshot(state, host)
        assert host_record(state, host) == encode(snapshot), host
        columns = host_columns(state, host)
        assert columns is not None
        assert columns.isascii(), columns  # (non-ASCII as JSON escapes)
        assert msgspec.json.decode(columns) == msgspec.json.decode(
            encode(columns_of(host, snapshot.values))), host
    assert cluster_record(state) == encode(cluster_snapshot(state))


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@settings(max_examples=150, deadline=None)
@given(evs=events(), data=st.data())
def test_records_match_the_structs_after_any_events(evs: list[Envelope], data: Any) -> None:
    """Fresh, unknown, stale and partly shadowed values, inventories, catalog changes: the
    fast encoder agrees with the Structs' encoding at every step (expiry interleaved)."""
    state = ProjectionState()
    for env in evs:
        apply(state, env)
        if data.draw(st.booleans()):
            expire(state, env.received_at + data.draw(st.sampled_from([0.0, 9.0, 30.0, 90.0])))
        assert_records_match(state)


def test_values_that_look_like_the_stand_in_are_encoded_as_themselves() -> None:
    """A string value equal to the encoder's stand-in, odd characters and floats of every
    form encode as the Structs do (the stand-in only marks where a value goes)."""
    state = ProjectionState()
    apply(state, catalog_env(1, T0))
    odd = ["\x00crr:value\x00", "\"quoted\" \\ back", "ünï\u2028", ""]
    for k, text in enumerate(odd):
        apply(state, report_env(2 + k, T0 + k, "site", "n1",
                                {"site_state": text, "site_ok": k % 2 == 0}))
        assert_records_match(state)
    for k, number in enumerate([0.1, 1e16, 1e-7, 123456789.125, -0.0, 5]):
        apply(state, report_env(10 + k, T0 + 10 + k, "scratch", "n1", {"scratch_free": number}))
        assert_records_match(state)


def test_full_reports_of_the_simulated_fleet() -> None:
    """The steady state the projector's fast path serves: 20-value reports of every value of
    a reporter (numbers, booleans, strings, string sets), some hosts later stale."""
    catalog = sim_catalog(20, 10.0)
    fleet = Fleet(catalog, 30, seed=3, faults=Faults.parse("silent=0.2,invalid=0.1"))
    state = ProjectionState()
    apply(state, Envelope(seq=1, subject=CATALOG, received_at=T0, data=encode(catalog)))
    seq = 1
    for rnd in range(3):
        for i in range(len(fleet)):
            for subject, payload, _ in fleet.events(i, "2026-12-02T14:00:00.000Z"):
                seq += 1
                apply(state, Envelope(seq=seq, subject=subject, data=payload,
                                      received_at=T0 + rnd * 12.0 + i * 0.1))
        expire(state, T0 + rnd * 12.0 + 8.0)
        assert_records_match(state)
