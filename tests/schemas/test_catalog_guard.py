"""`exports.guard`, `exports.settle`, a feature's `{when, settle}` and a drain rule's `for:`/
`resume_after:` in resources.yaml: parsed, defaulted, path-qualified errors, old bytes kept."""

from __future__ import annotations

import msgspec
import pytest

from crr.projections.exports import export_problems
from crr.projections.guard import Limits, Timing
from crr.schemas.catalog import Catalog, limit_of
from crr.schemas.catalog_loader import catalog_from_wire, load_catalog_text
from crr.schemas.codec import encode
from crr.schemas.errors import CatalogError

BASE = """
reporters: {scratch: {type: external, interval: 5s}}
resources:
  fs_healthy: {kind: boolean, reporter: scratch}
  free: {kind: numeric, reporter: scratch}
"""


def load(exports: str) -> Catalog:
    return load_catalog_text(BASE + exports, exports_check=export_problems)


def test_every_field_parses_and_round_trips_the_wire() -> None:
    cat = load("""
exports:
  settle: 10s
  features:
    big: {when: 'free > 500', settle: 1m}
    small: 'free < 10'
  drain:
    - {when: '!fs_healthy', reason: fs, for: 20s, resume_after: 0s}
  guard: {max_drained: 3, max_changed: '25%', window: 10m}
""")
    ex = cat.exports_or_empty()
    assert ex.features == {"big": "free > 500", "small": "free < 10"}
    assert (ex.settle_of("big"), ex.settle_of("small")) == (60.0, 10.0)
    assert (ex.drain[0].hold_for, ex.drain[0].resume_delay) == (20.0, 0.0)
    assert Limits.for_nodes(ex, 2000) == Limits(3, 500, 600.0)
    wire = encode(cat)
    assert b'"for":20.0' in wire
    assert catalog_from_wire(msgspec.json.decode(wire)) == cat
    timing = Timing.of(ex)
    assert (timing.of_drain("fs"), timing.of_resume("fs"), timing.of_feature("big")) == (
        20.0, 0.0, 60.0)


def test_an_old_catalog_keeps_its_bytes_and_gets_the_defaults() -> None:
    """Without the new keys nothing new is encoded (older readers forbid unknown fields);
    the defaults: drain at once, resume after 5m, features at once, 10%/20% per 5m."""
    cat = load("exports:\n  features: {big: 'free > 500'}\n  drain: [{when: '!fs_healthy', "
               "reason: fs}]\n")
    wire = encode(cat)
    for key in (b'"guard"', b'"settle"', b'"feature_settle"', b'"for"', b'"resume_after"'):
        assert key not in wire
    ex = cat.exports_or_empty()
    assert (ex.drain[0].hold_for, ex.drain[0].resume_delay, ex.settle_of("big")) == (
        0.0, 300.0, 0.0)
    assert Limits.for_nodes(ex, 2000) == Limits(200, 400, 300.0)


@pytest.mark.parametrize(("nodes", "limit", "allowed"), [
    (2000, "10%", 200), (20, "10%", 2), (5, "10%", 1), (1, "1%", 1), (20, "100%", 20),
    (20, 7, 7), (20, 0, 0), (19, "10%", 1)])
def test_a_percentage_rounds_down_and_is_at_least_one(nodes: int, limit: int | str,
                                                      allowed: int) -> None:
    assert limit_of(limit, nodes) == allowed


@pytest.mark.parametrize(("snippet", "problem"), [
    ("guard: {max_drained: '120%'}", "exports.guard.max_drained: expected a node count"),
    ("guard: {max_changed: -1}", "exports.guard.max_changed: expected a node count"),
    ("guard: {max_changed: lots}", "exports.guard.max_changed: expected a node count"),
    ("guard: {window: 0s}", "exports.guard.window: must be longer than 0s"),
    ("guard: {windw: 5m}", "exports.guard.windw: unknown field"),
    ("guard: 5", "exports.guard: expected a mapping"),
    ("settle: soon", "exports.settle: expected a duration"),
    ("features: {big: {when: 'free > 1', settle: -1}}",
     "exports.features.big.settle: duration must not be negative"),
    ("features: {big: {settle: 1s}}", "exports.features.big.when: expected a select[]"),
    ("features: {big: {when: 'free > 1', sett: 1s}}", "exports.features.big.sett: unknown"),
    ("features: {big: {when: 'fre > 1'}}", "exports.features.big: unknown resource 'fre'"),
    ("drain: [{when: '!fs_healthy', reason: fs, for: 2x}]",
     "exports.drain[0].for: expected a duration"),
    ("drain: [{when: '!fs_healthy', reason: fs, resume_after: -5}]",
     "exports.drain[0].resume_after: duration must not be negative"),
])
def test_errors_name_their_path(snippet: str, problem: str) -> None:
    with pytest.raises(CatalogError) as exc:
        load(f"exports:\n  {snippet}\n")
    assert any(p.startswith(problem) for p in exc.value.problems), exc.value.problems


def test_zero_is_valid_everywhere() -> None:
    """`0s` means at once, never an error."""
    cat = load("exports:\n  settle: 0s\n  features: {big: {when: 'free > 1', settle: 0s}}\n"
               "  drain: [{when: '!fs_healthy', reason: fs, for: 0s, resume_after: 0s}]\n")
    ex = cat.exports_or_empty()
    assert Timing.of(ex) == Timing(drain_for={"fs": 0.0}, resume_after={"fs": 0.0},
                                   settle={"big": 0.0})
