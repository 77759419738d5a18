"""`exports:` in resources.yaml and the planning core (`crr.projections.exports`).

Given a catalog with exports, when it is loaded, then bad expressions, bad
feature names and unknown values are all reported at once with their paths;
and the plan of a host agrees with `select[]` (a feature holds iff `crr
select` selects the host), stale values included, on random expressions.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crr.projections.exports import (
    CompiledExports,
    NodeWant,
    compile_exports,
    export_problems,
    plan_host,
    plan_table,
)
from crr.projections.host_table import HostTable
from crr.projections.select import compile_select
from crr.schemas.catalog import Catalog, DrainRule, Exports
from crr.schemas.catalog_loader import catalog_from_wire, load_catalog_text
from crr.schemas.codec import encode
from crr.schemas.errors import CatalogError
from crr.schemas.target_names import feature_name_problems
from tests.projections.test_select_property import bool_expr, tables
from tests.support.select import CATALOG, NOW, STALE, host_snapshot

YAML = """
resources:
  scratch_free: {kind: numeric, reporter: s, interval: 30s}
  datasets: {kind: string_set, reporter: s, on_stale: exclude}
  fs_healthy: {kind: boolean, reporter: s}
  fs_type: {kind: string, reporter: s}
reporters:
  s: {type: external, interval: 30s}
exports:
  features:
    imagenet_cached: 'datasets has "imagenet"'
    big_scratch: 'scratch_free > 500 && defined(scratch_free)'
  drain:
    - when: '!fs_healthy'
      reason: 'scratch file system unhealthy'
  values: [scratch_free, datasets, fs_type]
"""


def _load(text: str) -> Catalog:
    return load_catalog_text(text, exports_check=export_problems)


def _errors(text: str) -> list[str]:
    with pytest.raises(CatalogError) as info:
        _load(text)
    return info.value.problems


def test_valid_exports_load_and_round_trip_the_wire() -> None:
    """The issue's example loads; encoded and validated again (the projector's path) it is equal."""
    catalog = _load(YAML)
    exports = catalog.exports_or_empty()
    assert sorted(exports.features) == ["big_scratch", "imagenet_cached"]
    assert exports.drain == [DrainRule(when="!fs_healthy", reason="scratch file system unhealthy")]
    assert catalog_from_wire(msgspec.json.decode(encode(catalog))) == catalog


def test_catalog_without_exports_encodes_without_the_field() -> None:
    """A catalog with no exports stays readable by readers from before they existed."""
    catalog = _load(YAML.split("exports:", maxsplit=1)[0])
    assert b"exports" not in encode(catalog)


def test_every_export_error_at_once_with_its_path_and_token() -> None:
    """Bad expressions (pointing at the token), names and values are reported together."""
    bad = YAML.replace("'scratch_free > 500 && defined(scratch_free)'", "'scratch_fre > 500'")
    bad = bad.replace("'!fs_healthy'", "'datasets > 3'")
    bad = bad.replace("values: [scratch_free,", "values: [nope, scratch_free,")
    bad = bad.replace("    imagenet_cached:", "    \"bad name\": fs_healthy\n    imagenet_cached:")
    problems = _errors(bad)
    assert any(p.startswith("exports.features.big_scratch: unknown resource 'scratch_fre'; "
                            "did you mean 'scratch_free'? (at column 1:") for p in problems)
    assert any(p.startswith("exports.drain[0].when: '>' cannot compare the string_set "
                            "datasets") for p in problems)
    assert any(p.startswith("exports.values[0]: no resource named 'nope'") for p in problems)
    assert any(p.startswith("exports.features.bad name: Slurm:") for p in problems)
    assert any(p.startswith("exports.features.bad name: HTCondor:") for p in problems)


def test_resource_errors_and_export_errors_come_together() -> None:
    """A bad resource does not hide the export errors (all errors at once)."""
    bad = YAML.replace("kind: string, reporter: s", "kind: strng, reporter: s")
    bad = bad.replace("'datasets has \"imagenet\"'", "'datasets has'")
    problems = _errors(bad)
    assert any(p.startswith("resources.fs_type.kind:") for p in problems)
    assert any(p.startswith("exports.features.imagenet_cached:") for p in problems)


def test_error_column_points_at_the_token() -> None:
    """The arrow in the message sits right before the offending token."""
    bad = YAML.replace("'datasets has \"imagenet\"'", "'fs_healthy && scratch_free'")
    problem = next(p for p in _errors(bad) if p.startswith("exports.features.imagenet_cached"))
    assert problem.endswith("(at column 15: fs_healthy && \u2192scratch_free)")


@pytest.mark.parametrize(("name", "target"), [
    ("a,b", "Slurm"), ("a b", "Slurm"), ("a|b", "Slurm"), ("x!", "Slurm"), ("a*", "Slurm"),
    ("a(b)", "Slurm"), ("a[1]", "Slurm"), ("a&b", "Slurm"),
    ("ends_", "NFD"), ("x" * 60, "NFD"), ("a:b", "NFD"), ("a/b", "NFD"),
    ("a-b", "HTCondor"), ("a.b", "HTCondor"),
])
def test_feature_names_a_target_rejects(name: str, target: str) -> None:
    """Each target's rule is named in the error (Slurm syntax, NFD label name, ClassAd name)."""
    problems = feature_name_problems(name)
    assert any(p.startswith(f"{target}:") for p in problems), problems
    assert any(p.startswith(f"exports.features.{name}: {target}:")
               for p in _errors(YAML.replace("    big_scratch:", f"    '{name}': ok\n"
                                             "    big_scratch:")))


@pytest.mark.parametrize("name", ["imagenet_cached", "gpu_ok", "A1", "x" * 59, "_a1"])
def test_feature_names_every_target_accepts(name: str) -> None:
    """Letters, digits and '_' (not at the end for NFD's crr- prefix... '_a1' ends in a digit)."""
    assert feature_name_problems(name) == []


def test_unknown_export_field_is_an_error() -> None:
    """Operator input forbids unknown fields (a typo must not be silently ignored)."""
    problems = _errors(YAML.replace("  values:", "  valuse: [x]\n  values:"))
    assert any(p.startswith("exports.valuse: unknown field") for p in problems)


def test_whole_requirement_string_is_not_an_export() -> None:
    """An export is a condition: `rusage[...]` etc. are the scheduler's."""
    bad = YAML.replace("'datasets has \"imagenet\"'", "'select[fs_healthy] rusage[mem=1]'")
    assert any(p.startswith("exports.features.imagenet_cached: an export is a select[] "
                            "condition") for p in _errors(bad))


# -- the plan -----------------------------------------------------------------------------


def _exports(features: dict[str, str], drain: list[tuple[str, str]] | None = None,
             values: list[str] | None = None) -> CompiledExports:
    exports = Exports(features=features,
                      drain=[DrainRule(when=w, reason=r) for w, r in drain or []],
                      values=values or [])
    return compile_exports(msgspec.structs.replace(CATALOG, exports=exports))


def test_plan_given_when_then() -> None:
    """Features true only when TRUE, the first drain rule's reason, values with their state."""
    exports = _exports({"big": "free > 10", "linux": "os == LINUX", "unk": "load > 1"},
                       drain=[("!ok", "first"), ("free > 0", "second")],
                       values=["free", "tags", "load", "ds"])
    snap = host_snapshot("h1", {"free": 20, "os": "LINUX", "ok": False, "tags": ["a"],
                                "ds": STALE})
    want = plan_host(exports, snap, None, NOW)
    assert want.features == frozenset({"big", "linux"})
    assert want.drain == "first"
    assert want.values["free"].value == 20
    assert want.values["free"].state == "fresh"
    assert want.values["load"].state == "never_reported"
    assert want.values["load"].value is None
    assert want.values["ds"].state == "stale"
    assert want.values["ds"].value is None
    assert want.expires_at == NOW + 44  # the fresh values' expiry (support: received + 45 s)


def test_plan_of_an_absent_host_has_nothing() -> None:
    """A forgotten (or never reported) host: no features, no drain, unknown values."""
    want = plan_host(_exports({"t": "true"}, values=["free"]), None, None, NOW)
    assert want == NodeWant(features=frozenset(), drain=None, values=want.values)
    assert want.values["free"].state == "never_reported"


def test_expiry_changes_the_plan() -> None:
    """At `expires_at` the value is stale: the feature goes (on_stale unknown)."""
    exports = _exports({"big": "free > 10"})
    snap = host_snapshot("h1", {"free": 20})
    before = plan_host(exports, snap, None, NOW)
    assert before.features == {"big"}
    assert before.expires_at is not None
    after = plan_host(exports, snap, None, before.expires_at)
    assert after.features == frozenset()
    assert after.expires_at is None


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expr=bool_expr(3), table=tables(), dt=st.sampled_from([0.0, 30.0, 50.0, -100.0]))
def test_feature_holds_iff_select_selects(expr: str, table: HostTable, dt: float) -> None:
    """For every host: feature `f` holds (and the drain rule fires) iff select[expr] selects it,
    planned from the host's own record plus the cluster record (a per-host door) and from
    the whole table (a whole-cluster door)."""
    exports = _exports({"f": expr}, drain=[(expr, "why")])
    now = NOW + dt
    selected = set(compile_select(expr, CATALOG).select(table, now))
    whole = plan_table(exports, table, now)
    for host in table.hosts():
        want = plan_host(exports, table.get(host), table.cluster(), now)
        assert ("f" in want.features) == (host in selected)
        assert (want.drain == "why") == (host in selected)
        assert whole[host].features == want.features
        assert whole[host].expires_at == want.expires_at


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expr=bool_expr(3), table=tables(), frac=st.floats(0.0, 0.999))
def test_nothing_changes_before_expires_at(expr: str, table: HostTable, frac: float) -> None:
    """Between `now` and `expires_at` the plan stays the same: waking at expiry is enough."""
    exports = _exports({"f": expr}, values=["free", "ds"])
    for host in table.hosts():
        want = plan_host(exports, table.get(host), table.cluster(), NOW)
        later = NOW + 3600.0 if want.expires_at is None else (
            NOW + (want.expires_at - NOW) * frac)
        assert plan_host(exports, table.get(host), table.cluster(), later).same_as(want)
