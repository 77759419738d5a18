"""A catalog change must not bring back a value that a later report overwrote.

Found by the chaos run (`tests/system/test_chaos.py`, seed 27): `r_free` 91.4 (a full
report), then 827.8 (a partial report), then a catalog lowering `r_free`'s max
to 500 — the snapshot showed 91.4 again.  The full report's batch is kept for
the values the partial report omitted, with its overwritten `r_free` inside;
`_recatalog` drops the current 827.8 and the shadowed 91.4 resurfaces.  A
restored projector (whose records hold only current values) did not do it, so
`crr replay --verify` differed from a restored live snapshot too (seed 5 on R3).
Now `_recatalog` drops shadowed names from older batches first.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crr.projections.fold import fold
from crr.projections.record.snapshot import host_snapshot
from crr.schemas.catalog_loader import load_catalog_text
from tests.support.fold import CATALOG_OBJ, CATALOG_YAML, T0, catalog_env, report_env

TIGHT = load_catalog_text(CATALOG_YAML.replace(
    "interval: 10s, min: 0}", "interval: 10s, min: 0, max: 500}", 1))


def test_catalog_drop_does_not_resurrect_an_overwritten_value() -> None:
    """91.4, then 827.8 (partial), then max 500: scratch_free is gone, not 91.4 again;
    scratch_total (only in the first report) stays."""
    assert TIGHT != CATALOG_OBJ
    state = fold([
        catalog_env(1, T0),
        report_env(2, T0 + 1, "scratch", "n1", {"scratch_free": 91.4, "scratch_total": 1e3}),
        report_env(3, T0 + 2, "scratch", "n1", {"scratch_free": 827.8}),
        catalog_env(4, T0 + 3, TIGHT),
    ])
    values = host_snapshot(state, "n1").values
    assert values["scratch_total"].value == 1e3
    assert "scratch_free" not in values, values["scratch_free"]


REPORTS = st.lists(st.fixed_dictionaries({}, optional={
    "scratch_free": st.sampled_from([10.0, 91.4, 499.0, 600.0, 827.8]),
    "scratch_total": st.sampled_from([1e3, 2e3, 9e3])}), min_size=1, max_size=12)


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@settings(max_examples=200, deadline=None)
@given(reports=REPORTS)
def test_after_a_catalog_change_each_value_is_its_last_report_or_gone(
        reports: list[dict[str, float]]) -> None:
    """Any run of full and partial reports, then a catalog with `max: 500`: every value is
    the one its last report carried if that still validates, else absent — never an
    older one (a plain-dict oracle, independent of the fold's batches)."""
    envs = [catalog_env(1, T0)]
    last: dict[str, float] = {}
    for i, values in enumerate(reports):
        envs.append(report_env(2 + i, T0 + 1 + i * 0.01, "scratch", "n1", values))
        last.update(values)
    envs.append(catalog_env(2 + len(reports), T0 + 1, TIGHT))
    state = fold(envs)
    want = {n: v for n, v in last.items() if not (n == "scratch_free" and v > 500)}
    got = ({n: e.value for n, e in host_snapshot(state, "n1").values.items()}
           if "n1" in state.hosts else {})
    assert got == want
