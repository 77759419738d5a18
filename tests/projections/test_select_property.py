"""Property: the columnar evaluator agrees with the row-wise reference interpreter.

Random well-typed expressions (LSF bare words like `RHEL4.6` and `XeonE5-2650`
included) over random hosts whose values are fresh,
null, stale, expired by `now`, of the wrong kind or never reported; hosts
are also removed and re-added so rows get reused.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crr.projections.host_table import HostTable
from crr.projections.select import compile_select, explain
from crr.projections.select.reference import Env, evaluate, excluded_by
from tests.support.select import (
    CATALOG,
    NOW,
    NULL,
    STALE,
    Expired,
    StaleWas,
    cluster_snapshot,
    host_snapshot,
)

NUMERIC = [n for n, s in CATALOG.resources.items() if s.kind == "numeric"]
BOOLEAN = [n for n, s in CATALOG.resources.items() if s.kind == "boolean"]
STRING = [n for n, s in CATALOG.resources.items() if s.kind == "string"]
SETS = [n for n, s in CATALOG.resources.items() if s.kind == "string_set"]
WORDS = ["a", "b", "LINUX", "rhel9", "", "RHEL4.6", "1.3.29", "XeonE5-2650"]
BARE = ["LINUX", "rhel9", "RHEL4.6", "1.3.29", "XeonE5-2650", "x-1", "7"]
"""LSF bare words: string literals on the right of a string resource."""
MEMBERS = ["a", "b", "c"]

numbers = st.sampled_from([0, 1, 2, 2.5, -1, 100, 1e300, 0.1])


def _value(kind: str) -> st.SearchStrategy[Any]:
    if kind == "numeric":
        plain: st.SearchStrategy[Any] = numbers
    elif kind == "boolean":
        plain = st.booleans()
    elif kind == "string":
        plain = st.sampled_from(WORDS)
    else:
        plain = st.lists(st.sampled_from(MEMBERS), max_size=3)
    wrong = st.sampled_from(["x", 3, True, ["a", 1]])
    return st.one_of(
        plain, plain, plain,
        st.just(NULL), st.just(STALE), plain.map(StaleWas), plain.map(Expired), wrong,
    )


def _values(names: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Values for a random subset of `names` (the rest are never reported)."""
    return st.fixed_dictionaries(
        {}, optional={n: _value(CATALOG.resources[n].kind) for n in names},
    )


HOST_NAMES = [n for n, s in CATALOG.resources.items() if s.scope == "host"]
CLUSTER_NAMES = [n for n, s in CATALOG.resources.items() if s.scope == "cluster"]


def _quote(word: str) -> str:
    return f"'{word}'" if len(word) % 2 else f'"{word}"'


@st.composite
def num_expr(draw: st.DrawFn, depth: int) -> str:
    """A numeric expression."""
    choice = draw(st.integers(0, 5 if depth > 0 else 2))
    if choice == 0:
        return draw(st.sampled_from(NUMERIC))
    if choice == 1:
        return str(draw(numbers))
    if choice == 2:
        return f"count({draw(st.sampled_from(SETS))})"
    if choice == 3:
        return f"-{draw(num_expr(depth - 1))}"
    if choice == 4:
        return f"({draw(num_expr(depth - 1))})"
    op = draw(st.sampled_from(["+", "-", "*", "/"]))
    return f"{draw(num_expr(depth - 1))} {op} {draw(num_expr(depth - 1))}"


@st.composite
def str_expr(draw: st.DrawFn) -> str:
    """A string operand (resource or quoted literal)."""
    if draw(st.booleans()):
        return draw(st.sampled_from(STRING))
    return _quote(draw(st.sampled_from(WORDS)))


@st.composite
def bool_expr(draw: st.DrawFn, depth: int) -> str:
    """A condition."""
    leaves = 8
    choice = draw(st.integers(0, leaves + 3 if depth > 0 else leaves - 1))
    cmp = st.sampled_from(["==", "!=", "<", "<=", ">", ">="])
    if choice == 0:
        return draw(st.sampled_from(BOOLEAN))
    if choice == 1:
        return draw(st.sampled_from(["true", "false"]))
    if choice == 2:
        return f"{draw(num_expr(min(depth, 2)))} {draw(cmp)} {draw(num_expr(min(depth, 2)))}"
    if choice == 3:
        left = draw(st.sampled_from(STRING))
        right = draw(st.one_of(str_expr(), st.sampled_from(BARE)))
        return f"{left} {draw(cmp)} {right}"
    if choice == 4:
        return f"{draw(str_expr())} {draw(cmp)} {draw(str_expr())}"
    if choice == 5:
        eq = draw(st.sampled_from(["==", "!="]))
        lit = draw(st.sampled_from(["true", "false"]))
        return f"{draw(st.sampled_from(BOOLEAN))} {eq} {draw(st.sampled_from([*BOOLEAN, lit]))}"
    if choice == 6:
        s = draw(st.sampled_from(SETS))
        op = draw(st.sampled_from(["has", "has_any", "has_all"]))
        if op == "has":
            return f"{s} has {_quote(draw(st.sampled_from(MEMBERS)))}"
        items = draw(st.lists(st.sampled_from([*MEMBERS, "zz"]), max_size=3))
        return f"{s} {op} [{', '.join(_quote(m) for m in items)}]"
    if choice == 7:
        return f"defined({draw(st.sampled_from(list(CATALOG.resources)))})"
    if choice == 8:
        word = draw(st.sampled_from(["!", "not ", "! "]))
        return f"{word}({draw(bool_expr(depth - 1))})"
    if choice == 9:
        return f"({draw(bool_expr(depth - 1))})"
    op = draw(st.sampled_from(["&&", "||", "and", "or"]))
    return f"{draw(bool_expr(depth - 1))} {op} {draw(bool_expr(depth - 1))}"


@st.composite
def tables(draw: st.DrawFn) -> HostTable:
    """A HostTable with random hosts, some removed and re-added, and random cluster values."""
    table = HostTable(CATALOG)
    count = draw(st.integers(0, 12))
    for i in range(count):
        table.upsert(host_snapshot(f"h{i:02d}", draw(_values(HOST_NAMES))))
    for i in draw(st.lists(st.integers(0, max(count - 1, 0)), max_size=3)):
        table.remove(f"h{i:02d}")
    for i in draw(st.lists(st.integers(0, 15), max_size=3)):
        table.upsert(host_snapshot(f"h{i:02d}", draw(_values(HOST_NAMES))))
    if draw(st.booleans()):
        table.set_cluster(cluster_snapshot(draw(_values(CLUSTER_NAMES))))
    return table


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expr=bool_expr(3), table=tables(), dt=st.sampled_from([0.0, 0.0, 30.0, 50.0, -100.0]))
def test_columnar_agrees_with_reference(expr: str, table: HostTable, dt: float) -> None:
    """select() (numpy) equals the per-host reference interpreter on every host."""
    compiled = compile_select(expr, CATALOG)
    now = NOW + dt
    expected = []
    for host in table.hosts():
        env = Env(table, host, now)
        if not excluded_by(compiled.tree, env) and evaluate(compiled.tree, env) is True:
            expected.append(host)
    assert compiled.select(table, now) == expected


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=bool_expr(2), b=bool_expr(2), table=tables(),
       op=st.sampled_from(["&&", "||", "and", "or"]))
def test_commutative(a: str, b: str, table: HostTable, op: str) -> None:
    """(a) op (b) and (b) op (a) select the same hosts; explain agrees with select."""
    left = compile_select(f"({a}) {op} ({b})", CATALOG)
    right = compile_select(f"({b}) {op} ({a})", CATALOG)
    got = left.select(table, NOW)
    assert got == right.select(table, NOW)
    assert got == [h for h in table.hosts() if explain(left, table, h, NOW).selected]


@settings(max_examples=50, deadline=None)
@given(expr=bool_expr(3))
def test_wrapped_equals_bare(expr: str) -> None:
    """`select[EXPR]` compiles to the same tree as `EXPR`, shifted by the wrapper."""
    bare = compile_select(expr, CATALOG)
    wrapped = compile_select(f"select[{expr}]", CATALOG)
    assert bare.resources == wrapped.resources
    assert type(bare.tree) is type(wrapped.tree)
    assert wrapped.tree.start == bare.tree.start + len("select[")


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expr=bool_expr(3), table=tables(),
       sections=st.lists(st.sampled_from(["rusage[mem=(100):duration=10]", "order[-ut]",
                                          "span[hosts=1]", "same[model]", "cu[maxcus=2]",
                                          "affinity[core(2,same=socket)*4]"]), max_size=3))
def test_other_sections_do_not_change_the_selection(expr: str, table: HostTable,
                                                    sections: list[str]) -> None:
    """A whole requirement string selects what its select section alone selects."""
    bare = compile_select(expr, CATALOG)
    whole = compile_select(f"select [{expr}] {' '.join(sections)}", CATALOG)
    assert [s.text for s in whole.ignored_sections] == sections
    assert whole.select(table, NOW) == bare.select(table, NOW)
