"""`crr demo`'s simulated hosts report values that hang together (issue 40: sim02 showed
`scratch_free 953.9` with `scratch_total 707.6`, and `site_ok true` beside `site_state
drain`), over many ticks, for any seed, with the demo's own catalog."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from crr.producers.simulator import reports, simulated_hosts
from crr.schemas.catalog_loader import load_catalog
from crr.schemas.codec import decode
from crr.schemas.events import Report
from tests.support.cli import ROOT

CATALOG = load_catalog(ROOT / "ops" / "examples" / "resources.yaml")
REPORTERS = sorted({r.reporter for r in CATALOG.resources.values() if r.scope == "host"})
TICKS = 250


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**32))
def test_simulated_values_are_consistent_over_many_ticks(seed: int) -> None:
    """Each tick: free never exceeds total, the total never changes, every number is
    within its catalog bounds, and `site_ok` is true exactly when `site_state` is ok."""
    hosts = simulated_hosts([f"sim{i:02d}" for i in range(1, 6)], seed)
    totals: dict[str, float] = {}
    seen_states: set[str] = set()
    for tick in range(TICKS):
        last: dict[str, dict[str, object]] = {}
        at = f"2026-12-07T00:00:{tick % 60:02d}Z"
        for _, payload, _ in reports(hosts, CATALOG, REPORTERS, at):
            event = decode(payload, Report)
            assert event.host is not None
            last.setdefault(event.host, {}).update(event.values)
        for host, values in last.items():
            free, total = values["scratch_free"], values["scratch_total"]
            assert isinstance(free, float)
            assert isinstance(total, float)
            assert 0 <= free <= total, (host, tick, free, total)
            assert totals.setdefault(host, total) == total
            assert values["site_ok"] is (values["site_state"] == "ok"), (host, values)
            seen_states.add(str(values["site_state"]))
            for name, value in values.items():
                spec = CATALOG.resources[name]
                if spec.kind == "numeric":
                    assert isinstance(value, float)
                    assert spec.min is None or value >= spec.min
                    assert spec.max is None or value <= spec.max
