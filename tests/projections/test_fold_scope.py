"""A reporter publishing on a scope the catalog gives it no resource of is refused before
storage (docs/contract.md): the fold dead-letters the event with the reason, and no row
is made (it would go `silent` and mark the host failing).  The rule is
`Catalog.scope_problem`, checked here against a reference on random catalogs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from crr.projections.fold import Changes, apply
from crr.projections.state import ProjectionState
from crr.schemas.catalog import Catalog, ReporterSpec, ResourceSpec
from tests.support.fold import T0, catalog_env, health_env, inventory_env, report_env


def given_catalog() -> ProjectionState:
    """A state that has the test catalog (flexlm: cluster-scope only; scratch: host only)."""
    state = ProjectionState()
    apply(state, catalog_env(1, T0))
    return state


CLUSTER_ONLY = ("reporter 'flexlm' owns cluster-scope resources only (matlab_free): its "
                "reports name no host (got host 'nodeA')")


def test_a_cluster_scope_reporter_with_a_host_is_dead_lettered_and_makes_no_row() -> None:
    """`submit(host="nodeA")` of a cluster-scope reporter: report, health and inventory alike
    are refused with the reason; nodeA gets no record."""
    state = given_catalog()
    for seq, env in enumerate([report_env(2, T0, "flexlm", "nodeA", {}),
                               report_env(3, T0, "flexlm", "nodeA", {"matlab_free": 3}),
                               health_env(4, T0, "flexlm", "nodeA", "ok"),
                               inventory_env(5, T0, "flexlm", "nodeA", [])], start=2):
        assert apply(state, env) == Changes(deadletter=CLUSTER_ONLY), seq
    assert "nodeA" not in state.hosts


def test_a_host_scope_reporter_without_a_host_is_dead_lettered() -> None:
    """The other way round: a host-scope reporter on a cluster subject."""
    state = given_catalog()
    ch = apply(state, health_env(2, T0, "scratch", None, "ok"))
    assert ch.deadletter == ("reporter 'scratch' owns host-scope resources only (scratch_free, "
                             "scratch_total): each of its reports names its host")
    assert "scratch" not in state.cluster.reporters


def test_reporters_owning_no_resource_or_the_right_scope_are_not_judged() -> None:
    """A bridge's health (reporter `bridge-nfd`, owning nothing) and a right-scope report
    are applied as before."""
    state = given_catalog()
    assert apply(state, health_env(2, T0, "bridge-nfd", "n1", "ok")).deadletter is None
    assert apply(state, report_env(3, T0, "flexlm", None, {"matlab_free": 3})).deadletter is None
    assert apply(state, health_env(4, T0, "gpus", "n1", "ok")).deadletter is None
    assert "bridge-nfd" in state.hosts["n1"].reporters


SCOPES = st.sampled_from(["host", "cluster"])


@given(owned=st.lists(SCOPES, max_size=4), host=st.sampled_from([None, "n1"]))
def test_scope_problem_matches_the_rule(owned: list[str], host: str | None) -> None:
    """Refused iff the reporter owns resources and none of the event's scope."""
    catalog = Catalog(
        resources={f"r{i}": ResourceSpec(kind="numeric", scope=s, reporter="x")  # type: ignore[arg-type]
                   for i, s in enumerate(owned)},
        reporters={"x": ReporterSpec(type="external")})
    scope = "cluster" if host is None else "host"
    expected = bool(owned) and scope not in owned
    assert (catalog.scope_problem("x", host) is not None) is expected
