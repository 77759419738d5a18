"""select[] semantics (docs/contract.md, "The `select[]` language"): every form, Kleene logic,
staleness, exclude, cluster scope."""

from __future__ import annotations

import itertools
from typing import Any

import msgspec
import pytest

from crr.projections.host_table import HostTable
from crr.projections.select import compile_select, explain
from crr.schemas.catalog import Catalog
from tests.support.select import (
    CATALOG,
    NOW,
    NULL,
    STALE,
    Expired,
    StaleWas,
    host_snapshot,
    make_table,
)


def sel(expr: str, table: HostTable, now: float = NOW) -> list[str]:
    """select() of `expr`, checked against matches() and explain() for every host."""
    compiled = compile_select(expr, CATALOG)
    got = compiled.select(table, now)
    assert got == sorted(got)
    one_by_one = [h for h in table.hosts() if compiled.matches(table, h, now)]
    assert got == one_by_one, expr
    explained = [h for h in table.hosts() if explain(compiled, table, h, now).selected]
    assert got == explained, expr
    return got


# -- Kleene truth matrix: A = `free > 100`, B = `ok`, each true / false / unknown --------

A_VALUES: dict[str, list[Any]] = {
    "T": [200.0], "F": [50], "U": [NULL, STALE, Expired(200.0), None],
}
B_VALUES: dict[str, list[Any]] = {"T": [True], "F": [False], "U": [NULL, None, StaleWas(True)]}


def _matrix() -> HostTable:
    hosts: dict[str, dict[str, Any]] = {}
    for a, b in itertools.product("TFU", "TFU"):
        for i, (va, vb) in enumerate(itertools.product(A_VALUES[a], B_VALUES[b])):
            values: dict[str, Any] = {}
            if va is not None:
                values["free"] = va
            if vb is not None:
                values["ok"] = vb
            hosts[f"{a}{b}{i}"] = values
    return make_table(hosts)


MATRIX = _matrix()


def _truth_hosts(pairs: set[str]) -> list[str]:
    return sorted(h for h in MATRIX.hosts() if h[:2] in pairs)


KLEENE = [
    ("free > 100 && ok", {"TT"}),
    ("free > 100 and ok", {"TT"}),
    ("free > 100 || ok", {"TT", "TF", "TU", "FT", "UT"}),
    ("free > 100 or ok", {"TT", "TF", "TU", "FT", "UT"}),
    ("!(free > 100 && ok)", {"FT", "FF", "FU", "TF", "UF"}),
    ("not (free > 100 || ok)", {"FF"}),
    ("!(free > 100) && ok", {"FT"}),
    ("!(free > 100) || !ok", {"FT", "FF", "FU", "TF", "UF"}),
    ("free > 100 && !ok", {"TF"}),
    ("(free > 100 || ok) && !(free > 100 && ok)", {"TF", "FT"}),
    ("free > 100 && (ok || true)", {"TT", "TF", "TU"}),
    ("free > 100 || (ok && false)", {"TT", "TF", "TU"}),
    ("(free > 100 && false) || ok", {"TT", "FT", "UT"}),
]


@pytest.mark.parametrize(("expr", "pairs"), KLEENE)
def test_kleene_matrix(expr: str, pairs: set[str]) -> None:
    """&&, ||, ! follow Kleene three-valued logic; only TRUE selects."""
    assert sel(expr, MATRIX) == _truth_hosts(pairs)


def _commute(expr: str) -> str:
    """Swap the operands of the top-level binary logic operator of a KLEENE case."""
    compiled = compile_select(expr, CATALOG)
    tree: Any = compiled.tree
    while not hasattr(tree, "left") or tree.op not in ("and", "or"):
        tree = tree.operand
    left = expr[tree.left.start:tree.left.end]
    right = expr[tree.right.start:tree.right.end]
    word = expr[tree.left.end:tree.right.start]
    swapped = f"({right}){word}({left})"
    return expr[:tree.left.start] + swapped + expr[tree.right.end:]


@pytest.mark.parametrize(("expr", "pairs"), KLEENE)
def test_commuted_selects_same_hosts(expr: str, pairs: set[str]) -> None:
    """a op b and b op a select the same hosts (evaluation is order-independent)."""
    swapped = _commute(expr)
    assert swapped != expr
    assert sel(swapped, MATRIX) == sel(expr, MATRIX) == _truth_hosts(pairs)


# -- every form of the select[] language (docs/contract.md) ----------------------------

HOSTS: dict[str, dict[str, Any]] = {
    "a": {"free": 500, "total": 1000.0, "load": 0.5, "ok": True, "drain": False,
          "os": "rhel9", "arch": "x86_64", "tags": ["gpu", "ib"], "ds": ["imagenet", "c4"],
          "guard": 1.0},
    "b": {"free": 50.0, "total": 100.0, "load": 8.0, "ok": False, "drain": True,
          "os": "LINUX", "arch": "LINUX", "tags": [], "ds": [], "guard": 1.0},
    "c": {"free": NULL, "total": 0.0, "load": STALE, "ok": NULL, "drain": STALE,
          "os": NULL, "arch": STALE, "tags": NULL, "ds": STALE, "guard": STALE},
    "d": {},
    "e": {"free": Expired(900.0), "total": 10.0, "load": 2.0, "ok": Expired(True),
          "os": "ubuntu", "tags": ["ib"], "ds": Expired(["c4"]), "guard": 2.0},
}
CLUSTER: dict[str, Any] = {"lic": 4, "site_up": True, "region": "eu", "models": ["h100"],
                           "cguard": True}
TABLE = make_table(HOSTS, CLUSTER)

FORMS = [
    ("ok && !drain", ["a"]),
    ("ok and not drain", ["a"]),
    ("ok || drain", ["a", "b"]),
    ("ok or drain", ["a", "b"]),
    ("!ok", ["b"]),
    ("not ok", ["b"]),
    ("(ok || drain) && free > 10", ["a", "b"]),
    ("free == 500", ["a"]),
    ("free != 500", ["b"]),
    ("free < 100", ["b"]),
    ("free <= 50", ["b"]),
    ("free > 50", ["a"]),
    ("free >= 50", ["a", "b"]),
    ("free == 5e2", ["a"]),
    ("free == 500.0", ["a"]),
    ("free / total > 0.25", ["a", "b"]),
    ("free * 2 - load >= 999.5", ["a"]),
    ("free + 1 > 501", []),
    ("-free < -100", ["a"]),
    ("free - -10 == 510", ["a"]),
    ("free - total * 2 / 4 + 1 == 1", ["a", "b"]),
    ("(free - total) * 2 == -1000", ["a"]),
    ("1 + 2 * 3 == 7", ["a", "b", "c", "d", "e"]),
    ("free / 0 > 1", []),
    ("!(free / 0 > 1)", []),
    ("free / 0 > 1 || ok", ["a"]),
    ("total / total == 1", ["a", "b", "e"]),
    ("defined(free)", ["a", "b"]),
    ("!defined(free)", ["c", "d", "e"]),
    ("defined(os)", ["a", "b", "e"]),
    ('tags has "ib"', ["a", "e"]),
    ('!(tags has "ib")', ["b"]),
    ('tags has_any ["gpu", "x"]', ["a"]),
    ('tags has_any ["x", "ib"]', ["a", "e"]),
    ("tags has_any []", []),
    ('tags has_all ["gpu", "ib"]', ["a"]),
    ("tags has_all []", ["a", "b", "e"]),
    ("count(tags) == 0", ["b"]),
    ("count(tags) >= 1", ["a", "e"]),
    ("ok", ["a"]),
    ("ok == true", ["a"]),
    ("ok == false", ["b"]),
    ("ok != true", ["b"]),
    ("drain == ok", []),
    ("drain != ok", ["a", "b"]),
    ("os == 'rhel9'", ["a"]),
    ('os == "rhel9"', ["a"]),
    ("os == LINUX", ["b"]),
    ("os != LINUX", ["a", "e"]),
    ("os == arch", ["b"]),
    ("os != arch", ["a"]),
    ("os < 's'", ["b", "a"]),
    ("os >= 'rhel9'", ["a", "e"]),
    ("'s' > os", ["a", "b"]),
    ("arch > os", ["a"]),
    ("true", ["a", "b", "c", "d", "e"]),
    ("false", []),
    ("select[free > 100]", ["a"]),
    ("lic > 3", ["a", "b", "c", "d", "e"]),
    ("lic > 3 && free > 100", ["a"]),
    ("site_up && ok", ["a"]),
    ("region == eu", ["a", "b", "c", "d", "e"]),
    ("os == region", []),
    ("models has 'h100' && os == LINUX", ["b"]),
    ("count(models) == 1 && !ok", ["b"]),
]


@pytest.mark.parametrize(("expr", "hosts"), FORMS)
def test_forms(expr: str, hosts: list[str]) -> None:
    """Each form of docs/contract.md, "The `select[]` language" selects the expected hosts."""
    assert sel(expr, TABLE) == sorted(hosts)


@pytest.mark.parametrize(
    "expr",
    ["os != 'zzz'", "!(os == 'zzz')", "ok != true", "!ok", "free != 1", "!(free > 1e9)",
     "!(tags has 'nope')", "drain != true", "not drain", "arch != 'x'"],
)
def test_unknown_never_matches_negation(expr: str) -> None:
    """An unknown value (null, stale, expired, never reported) never matches != or !."""
    got = sel(expr, TABLE)
    assert "c" not in got
    assert "d" not in got


def test_empty_set_is_known() -> None:
    """An empty string set is known: !(s has "x") is true and count(s) is 0 for it."""
    assert "b" in sel('!(tags has "x")', TABLE)
    assert "b" in sel('tags has_all [] && !(tags has_any ["x"])', TABLE)
    assert sel("count(tags) == 0", TABLE) == ["b"]


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        # c: ds reported stale; e: ds expired by `now`, which counts as stale too.
        ("ds has 'c4' || ok", ["a"]),
        ("!(ds has 'x') || true", ["a", "b", "d"]),
        ("!defined(ds)", ["d"]),
        ("true || count(ds) > 0", ["a", "b", "d"]),
        # c: guard reported stale; e's guard is fresh (its expired ds is not named).
        ("guard > 0 || true", ["a", "b", "d", "e"]),
        ("!(guard > 1e9)", ["a", "b", "e"]),
    ],
)
def test_exclude_overrides_logic(expr: str, expected: list[str]) -> None:
    """A stale value of an on_stale: exclude resource named anywhere excludes the host, even
    where the rest of the expression would be true whatever its value; a never-reported one
    (d) is unknown, not excluded."""
    assert sel(expr, TABLE) == expected


def test_exclude_only_when_named() -> None:
    """Exclusion applies only to expressions that name the resource."""
    assert "c" in sel("true", TABLE)
    assert sel("!(tags has 'x') || true", TABLE) == ["a", "b", "c", "d", "e"]


def test_never_reported_exclude_resource_is_unknown_not_excluded() -> None:
    """A never-reported exclude resource is unknown, not stale: `|| true` still selects."""
    assert "d" in sel("count(ds) > 0 || true", TABLE)


def test_cluster_exclude() -> None:
    """A stale cluster-scope exclude resource excludes every host from expressions naming it."""
    table = make_table({"a": {"ok": True}, "b": {"ok": False}}, {"cguard": STALE, "lic": 1})
    assert sel("cguard || ok", table) == []
    assert sel("lic > 0 || ok", table) == ["a", "b"]


def test_cluster_values_shared_and_host_copies_ignored() -> None:
    """Cluster-scope values are the same on every host; a host's own copy is ignored."""
    table = make_table({"a": {"lic": 100}, "b": {}}, {"lic": 2})
    assert sel("lic == 2", table) == ["a", "b"]
    assert sel("lic == 100", table) == []
    unknown = make_table({"a": {}, "b": {}}, {"lic": NULL})
    assert sel("lic > 0 || lic <= 0", unknown) == []
    assert sel("!defined(lic)", unknown) == ["a", "b"]
    no_cluster = make_table({"a": {}})
    assert sel("defined(lic)", no_cluster) == []


def test_now_turns_values_stale() -> None:
    """Values turn stale once now passes expires_at, even if the snapshot says fresh."""
    table = make_table({"a": {"free": 500.0, "ds": ["x"]}})
    assert sel("free > 1", table, NOW) == ["a"]
    assert sel("free > 1", table, NOW + 44) == []
    assert sel("!(ds has 'y') || true", table, NOW + 44) == []


def test_catalog_change_makes_mismatched_resources_unknown() -> None:
    """After a catalog change, a resource gone or of another kind is never reported."""
    compiled = compile_select("free > 1 || os == 'x'", CATALOG)
    table = make_table({"a": {"free": 5.0, "os": "x"}})
    assert compiled.select(table, NOW) == ["a"]
    changed = Catalog(resources={**CATALOG.resources,
                                 "free": CATALOG.resources["os"]},
                      reporters=CATALOG.reporters)
    table.set_catalog(changed)
    assert compiled.select(table, NOW) == ["a"]
    assert compile_select("free > 1", CATALOG).select(table, NOW) == []
    assert not compile_select("free > 1", CATALOG).matches(table, "a", NOW)


def test_matches_unknown_host() -> None:
    """matches() is false for a host not in the table, even for `true`."""
    assert not compile_select("true", CATALOG).matches(TABLE, "zz", NOW)


def test_resources() -> None:
    """CompiledSelect.resources names every resource the expression uses."""
    compiled = compile_select("free > 1 && defined(os) && count(ds) > lic", CATALOG)
    assert compiled.resources == {"free", "os", "ds", "lic"}
    assert compile_select("true", CATALOG).resources == frozenset()


def test_removed_host_not_selected() -> None:
    """A removed host is never selected and its row is reused cleanly."""
    table = make_table({"a": {"ok": True}, "b": {"ok": True}})
    table.remove("a")
    assert sel("ok", table) == ["b"]
    table.upsert(host_snapshot("c", {}))
    assert sel("ok", table) == ["b"]
    assert sel("true", table) == ["b", "c"]


# -- explain ------------------------------------------------------------------------------


def test_explain_names_stale_exclude() -> None:
    """A host excluded by a stale on_stale: exclude resource says so, naming it."""
    compiled = compile_select("free > 100 && ds has 'c4'", CATALOG)
    ex = explain(compiled, TABLE, "c", NOW)
    assert not ex.selected
    assert ex.verdict == "excluded: ds is stale and on_stale: exclude"
    assert ex.excluded_by == ["ds"]
    text = ex.render()
    assert "excluded: ds is stale and on_stale: exclude" in text
    assert "ds" in text
    assert "stale since" in text
    assert "unknown (reporter said null)" in text  # free on host c
    decoded = msgspec.json.decode(msgspec.json.encode(ex))
    assert decoded["verdict"] == ex.verdict
    by_name = {r["name"]: r for r in decoded["resources"]}
    assert by_name["ds"]["freshness"] == "stale"
    assert by_name["free"]["freshness"] == "unknown"


def test_explain_unknown_value_names_it() -> None:
    """A host that fails because a value is unknown names the value and its freshness."""
    compiled = compile_select("ok && load < 4", CATALOG)
    ex = explain(compiled, TABLE, "c", NOW)
    assert ex.truth == "unknown"
    assert "ok is unknown (reporter said null)" in ex.verdict
    assert "load is stale since" in ex.verdict
    d = explain(compiled, TABLE, "d", NOW)
    assert "ok was never reported" in d.verdict
    assert "never reported" in d.render()


def test_explain_terms_truth() -> None:
    """Every sub-expression carries its truth; the tree mirrors the expression."""
    compiled = compile_select("free > 100 || ok", CATALOG)
    ex = explain(compiled, TABLE, "b", NOW)
    assert ex.verdict == "not selected: the expression is false"
    assert ex.tree is not None
    assert ex.tree.truth == "false"
    assert [t.text for t in ex.tree.terms] == ["free > 100", "ok"]
    assert ex.tree.terms[0].terms[0].value == 50.0
    a = explain(compiled, TABLE, "a", NOW)
    assert a.selected
    assert a.verdict == "selected"
    assert "selected" in a.render()


def test_explain_expired_value() -> None:
    """A value expired by `now` shows as stale since its expires_at, with its last value."""
    compiled = compile_select("free > 1", CATALOG)
    ex = explain(compiled, TABLE, "e", NOW)
    res = ex.resources[0]
    assert res.freshness == "stale"
    assert res.last_value == 900.0
    assert res.stale_since == res.expires_at


def test_explain_host_not_in_table() -> None:
    """Explaining a host the table does not know says so."""
    ex = explain(compile_select("true", CATALOG), TABLE, "zz", NOW)
    assert not ex.selected
    assert ex.verdict == "not selected: host zz is not in the table"
