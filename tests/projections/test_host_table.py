"""HostTable: the columnar cached snapshot the scheduler evaluates select[] over."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crr.projections.host_table import HostTable
from crr.projections.host_table.bulk_values import MAX_KNOWN_SETS, string_set, string_sets
from crr.projections.host_table.column import MAX_MEMBER_COLUMNS
from crr.projections.record.codes import ABSENT, FRESH, NULL, STALE
from crr.projections.validation import normalize
from crr.schemas.catalog import Catalog
from crr.schemas.codec import encode
from crr.schemas.snapshot import AsOf, HostSnapshot, ValueEntry
from crr.schemas.wire_time import format_time
from tests.schemas.test_wire_time import WIRE_TIMES as _TIMES
from tests.support.select import (
    CATALOG,
    NOW,
    Expired,
    cluster_snapshot,
    host_snapshot,
    make_table,
)
from tests.support.select import NULL as NULL_VALUE
from tests.support.select import STALE as STALE_VALUE


def test_empty_table() -> None:
    """A new table has no hosts, no cluster snapshot and answers get() with None."""
    table = HostTable(CATALOG)
    assert len(table) == 0
    assert table.hosts() == []
    assert table.get("n1") is None
    assert table.cluster() is None


def test_upsert_get_hosts_sorted() -> None:
    """Upserted hosts come back sorted, and get() returns the stored snapshot."""
    table = HostTable(CATALOG)
    snaps = {h: host_snapshot(h, {"free": float(i)}) for i, h in enumerate(["b", "c", "a"])}
    for snap in snaps.values():
        table.upsert(snap)
    assert table.hosts() == ["a", "b", "c"]
    assert len(table) == 3
    assert table.get("c") is snaps["c"]
    assert "a" in table


def test_upsert_replaces_and_clears_omitted_values() -> None:
    """A second upsert of a host replaces its values; values it omits become never reported."""
    table = make_table({"n1": {"free": 10.0, "os": "rhel9"}})
    table.upsert(host_snapshot("n1", {"free": 20.0}))
    col = table.column("free")
    os_col = table.column("os")
    assert col is not None
    assert os_col is not None
    row = table.row_of("n1")
    assert row is not None
    assert col.values[row] == 20.0
    assert os_col.state[row] == ABSENT
    assert len(table) == 1


def test_remove_frees_and_reuses_rows() -> None:
    """remove() forgets a host; its row is reused by the next new host with clean columns."""
    table = make_table({"n1": {"free": 1.0, "tags": ["x"]}, "n2": {"free": 2.0}})
    table.column("tags").member("x")  # type: ignore[union-attr]
    row = table.row_of("n1")
    table.remove("n1")
    table.remove("missing")
    assert table.hosts() == ["n2"]
    assert table.get("n1") is None
    table.upsert(host_snapshot("n3", {}))
    assert table.row_of("n3") == row
    tags = table.column("tags")
    assert tags is not None
    assert row is not None
    assert not tags.member("x")[row]
    assert tags.state[row] == ABSENT


def test_growth_keeps_values() -> None:
    """Growing past the initial capacity keeps every value and member column."""
    table = HostTable(CATALOG)
    table.upsert(host_snapshot("h0000", {"tags": ["x"]}))
    tags = table.column("tags")
    assert tags is not None
    tags.member("x")
    for i in range(1, 300):
        table.upsert(host_snapshot(f"h{i:04d}", {"free": float(i), "tags": ["x"] if i % 2 else []}))
    assert len(table) == 300
    assert table.capacity >= 300
    free = table.column("free")
    assert free is not None
    rows = table.sorted_rows()
    assert list(free.values[rows][1:4]) == [1.0, 2.0, 3.0]
    member = tags.member("x")[rows]
    assert member[0]
    assert list(member[1:5]) == [True, False, True, False]


def test_state_codes() -> None:
    """Fresh, null, stale, wrong-kind and never-reported values get their state codes."""
    table = make_table({
        "n1": {"free": 1.0, "ok": NULL_VALUE, "os": STALE_VALUE, "total": "not a number"},
    })
    row = table.row_of("n1")
    assert row is not None
    codes = {n: int(table.column(n).state[row])  # type: ignore[union-attr]
             for n in ("free", "ok", "os", "total", "load")}
    assert codes == {"free": FRESH, "ok": NULL, "os": STALE, "total": NULL, "load": ABSENT}


def test_expiry_at_now_is_stale() -> None:
    """A value whose expires_at ≤ now is stale even if the snapshot says fresh."""
    table = make_table({"n1": {"free": Expired(5.0), "load": 1.0}})
    free = table.column("free")
    load = table.column("load")
    assert free is not None
    assert load is not None
    row = table.row_of("n1")
    assert row is not None
    assert not free.known(NOW)[row]
    assert free.stale(NOW)[row]
    assert load.known(NOW)[row]
    assert not load.known(NOW + 44)[row]  # expires_at == now counts as expired


def test_cluster_values() -> None:
    """Cluster-scope values come from the ClusterSnapshot, not from host snapshots."""
    table = make_table({"n1": {"lic": 99.0}}, cluster={"lic": 3.0, "site_up": NULL_VALUE})
    assert table.column("lic") is None
    lic = table.cluster_value("lic")
    assert lic is not None
    assert lic.value == 3.0
    assert lic.known(NOW)
    site = table.cluster_value("site_up")
    assert site is not None
    assert not site.known(NOW)
    assert table.cluster_value("region") is None
    assert table.cluster() is not None


def test_set_catalog_rebuilds_columns() -> None:
    """set_catalog rebuilds columns from the stored snapshots; dropped resources vanish."""
    table = make_table({"n1": {"free": 1.0, "os": "a"}}, cluster={"lic": 2.0})
    smaller = Catalog(resources={"os": CATALOG.resources["os"]}, reporters=CATALOG.reporters)
    table.set_catalog(smaller)
    assert table.column("free") is None
    assert table.cluster_value("lic") is None
    table.set_catalog(CATALOG)
    free = table.column("free")
    assert free is not None
    assert free.values[table.row_of("n1")] == 1.0
    assert table.cluster_value("lic") is not None


def test_table_without_catalog_keeps_snapshots() -> None:
    """A table without a catalog stores snapshots; columns appear once a catalog is set."""
    table = HostTable()
    table.upsert(host_snapshot("n1", {"free": 1.0}))
    assert table.column("free") is None
    table.set_catalog(CATALOG)
    assert table.column("free") is not None


def test_member_columns_follow_upserts() -> None:
    """A member column is maintained by upserts that change the set, including to stale."""
    table = make_table({"n1": {"tags": ["a", "b"]}, "n2": {"tags": []}})
    tags = table.column("tags")
    assert tags is not None
    r1, r2 = table.row_of("n1"), table.row_of("n2")
    assert r1 is not None
    assert r2 is not None
    a = tags.member("a")
    assert a[r1]
    assert not a[r2]
    table.upsert(host_snapshot("n2", {"tags": ["a"]}))
    table.upsert(host_snapshot("n1", {"tags": STALE_VALUE}))
    a = tags.member("a")
    assert not a[r1]
    assert a[r2]
    assert tags.values[r2] == 1.0


def test_member_columns_are_bounded() -> None:
    """At most MAX_MEMBER_COLUMNS member columns are kept per resource."""
    table = make_table({"n1": {"tags": ["m0"]}})
    tags = table.column("tags")
    assert tags is not None
    for i in range(MAX_MEMBER_COLUMNS + 10):
        tags.member(f"m{i}")
    assert len(tags.members) == MAX_MEMBER_COLUMNS
    assert tags.member("m0")[table.row_of("n1")]


def test_string_codes_are_shared() -> None:
    """All string columns code into one pool, so equal strings have equal codes."""
    table = make_table({"n1": {"os": "x", "arch": "x"}, "n2": {"os": "y"}})
    os_col, arch = table.column("os"), table.column("arch")
    assert os_col is not None
    assert arch is not None
    r1 = table.row_of("n1")
    assert r1 is not None
    assert os_col.values[r1] == arch.values[r1] == table.code_of("x")
    assert table.code_of("never") == -2
    ranks = table.ranks()
    assert ranks[table.code_of("x")] < ranks[table.code_of("y")]


@pytest.mark.parametrize(
    ("kind", "value", "expected"),
    [
        ("numeric", 3, 3.0),
        ("numeric", True, None),
        ("numeric", float("nan"), None),
        ("numeric", 10**400, None),
        ("numeric", "3", None),
        ("boolean", True, True),
        ("boolean", 1, None),
        ("string", "x", "x"),
        ("string", 1, None),
        ("string_set", ["a", "a"], frozenset({"a"})),
        ("string_set", [], frozenset()),
        ("string_set", ["a", 1], None),
        ("string_set", "a", None),
        ("numeric", None, None),
    ],
)
def test_normalize(kind: str, value: object, expected: object) -> None:
    """normalize returns the select[] value of a kind, or None for null/wrong kind."""
    assert normalize(kind, value) == expected  # type: ignore[arg-type]


def test_upsert_cost_is_per_value() -> None:
    """Re-upserting an unchanged set does not touch member columns (diff-only maintenance)."""
    table = make_table({"n1": {"tags": ["a"]}})
    tags = table.column("tags")
    assert tags is not None
    col = tags.member("a")
    col[table.row_of("n1")] = False  # poison: an unchanged set must leave it alone
    table.upsert(host_snapshot("n1", {"tags": ["a"]}))
    assert not col[table.row_of("n1")]
    assert isinstance(col, np.ndarray)


def test_cluster_snapshot_replaced() -> None:
    """set_cluster replaces all cluster values."""
    table = make_table({}, cluster={"lic": 1.0})
    table.set_cluster(cluster_snapshot({"site_up": True}))
    assert table.cluster_value("lic") is None
    assert table.cluster_value("site_up") is not None


# -- bulk load (`HostTable.load`) equals upserting one by one -------------------

_HOSTS = st.sampled_from([f"h{i}" for i in range(12)])
_STRINGS = st.sampled_from(["a", "b", "c", "rhel9", ""])
_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True), _STRINGS,
    st.lists(_STRINGS, max_size=4), st.lists(st.one_of(_STRINGS, st.integers()), max_size=3),
)
_ENTRIES = st.builds(
    ValueEntry, value=_VALUES, state=st.sampled_from(["fresh", "stale", "unknown"]),
    reporter=st.just("r"), observed_at=st.just("2026-12-02T14:00:00.000Z"),
    received_at=st.just("2026-12-02T14:00:00.000Z"), expires_at=_TIMES,
)
# Names of every kind and scope in CATALOG, plus one the catalog does not know.
_NAMES = st.sampled_from(["free", "ok", "os", "arch", "tags", "ds", "lic", "unknown_name"])
_SNAPSHOTS = st.builds(
    lambda host, values: HostSnapshot(host=host, as_of=AsOf(seq=1, time=format_time(NOW)),
                                      values=values),
    _HOSTS, st.dictionaries(_NAMES, _ENTRIES, max_size=7),
)


def _without_twins(snap: HostSnapshot | None) -> HostSnapshot | None:
    """The snapshot as a reader of the strings alone sees it (numeric twins dropped), so a
    record with twins compares equal to the same record without them."""
    if snap is None:
        return None
    values = {n: msgspec.structs.replace(e, expires_ts=None, received_ts=None)
              for n, e in snap.values.items()}
    return msgspec.structs.replace(snap, values=values)


def _assert_same_table(bulk: HostTable, one_by_one: HostTable, strict_pool: bool,
                       same_docs: bool = True) -> None:
    """`same_docs`: both hold the same snapshot objects (else: equal snapshots from `get`)."""
    assert bulk.capacity == one_by_one.capacity
    assert bulk.hosts() == one_by_one.hosts()
    for host in one_by_one.hosts():
        assert bulk.row_of(host) == one_by_one.row_of(host)
        if same_docs:
            assert bulk.get(host) is one_by_one.get(host)
        else:
            assert _without_twins(bulk.get(host)) == _without_twins(one_by_one.get(host))
    if strict_pool:
        # The same strings interned, none extra; their codes may differ (a bulk load
        # interns column by column, upserts value by value) — columns compare decoded.
        assert sorted(bulk.strings()) == sorted(one_by_one.strings())
    one_by_one.apply_staged()  # (reading `_columns` directly: no read has written them)
    for name, col in one_by_one._columns.items():  # comparing internals on purpose
        other = bulk.column(name)
        assert other is not None
        for attr in ("state", "fresh", "stale_flag", "t_arr", "f_arr"):
            assert np.array_equal(getattr(other, attr), getattr(col, attr)), (name, attr)
        assert np.array_equal(other.expires, col.expires), name  # bit for bit, inf included
        assert other.sets == col.sets
        if col.kind == "string":
            pool, other_pool = one_by_one.strings(), bulk.strings()
            assert [pool[c] if c >= 0 else None for c in col.values.tolist()] == \
                [other_pool[c] if c >= 0 else None for c in other.values.tolist()], name
        else:
            assert np.array_equal(other.values, col.values), name
        for c in (col, other):  # each a lower bound of its live expiries (tightened by `known`)
            live = (c.state == FRESH) | (c.state == NULL)
            assert not live.any() or c.min_expiry <= c.expires[live].min(), name
        assert np.array_equal(other.known(NOW), col.known(NOW))
        assert np.array_equal(other.stale(NOW), col.stale(NOW))
    assert bulk._cluster_values.keys() == one_by_one._cluster_values.keys()


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@settings(max_examples=300, deadline=None)
@given(st.lists(_SNAPSHOTS, max_size=90))
def test_load_equals_upserts(snaps: list[HostSnapshot]) -> None:
    """load() of random snapshots (stale/unknown/absent, wrong kinds, odd timestamps, repeated
    hosts, past the initial capacity) gives the table that upserting each in turn gives."""
    one_by_one = HostTable(CATALOG)
    for snap in snaps:
        one_by_one.upsert(snap)
    bulk = HostTable(CATALOG)
    bulk.load(iter(snaps))
    repeated = len({s.host for s in snaps}) < len(snaps)
    _assert_same_table(bulk, one_by_one, strict_pool=not repeated)


def test_load_many_hosts_and_set_catalog() -> None:
    """load() past several doublings equals upserts, and set_catalog rebuilds the same columns."""
    snaps = [host_snapshot(f"n{i:04d}", {"free": float(i), "os": "rhel9" if i % 3 else "x",
                                         "tags": ["a", "b"][: i % 3], "ok": NULL_VALUE,
                                         "ds": STALE_VALUE})
             for i in range(700)]
    one_by_one = HostTable(CATALOG)
    for snap in snaps:
        one_by_one.upsert(snap)
    bulk = HostTable(CATALOG)
    bulk.load(snaps)
    _assert_same_table(bulk, one_by_one, strict_pool=True)
    one_by_one.set_catalog(CATALOG)
    _assert_same_table(bulk, one_by_one, strict_pool=True)
    bulk.load([host_snapshot("n0001", {"free": -1.0})])  # not empty: upserts
    assert bulk.column("free").values[bulk.row_of("n0001")] == -1.0  # type: ignore[union-attr]


# -- string sets: one frozenset per distinct array ------------------------------------------

@given(st.lists(st.one_of(st.lists(_STRINGS, max_size=4), _VALUES), max_size=60),
       st.integers(0, 60))
def test_string_sets_equal_one_by_one_and_share_equal_arrays(raw: list[object],
                                                             cut: int) -> None:
    """`string_sets` (the bulk path; two calls sharing their known sets, as a load's chunks
    do) gives what `string_set` gives value by value, and equal arrays of strings get one
    frozenset between them."""
    known: dict[tuple[str, ...], frozenset[str]] = {}
    sets = string_sets(raw[:cut], known) + string_sets(raw[cut:], known)
    assert sets == [string_set(v) for v in raw]
    if all(type(v) is list or v is None for v in raw[:cut]) and all(
            type(v) is list or v is None for v in raw[cut:]) and all(
            s is not None for v, s in zip(raw, sets, strict=True) if v is not None):
        first: dict[tuple[object, ...], frozenset[str] | None] = {}
        for value, got in zip(raw, sets, strict=True):
            if isinstance(value, list):
                assert first.setdefault(tuple(value), got) is got


def test_the_known_sets_stay_bounded() -> None:
    """A column's known sets are emptied when they would exceed MAX_KNOWN_SETS; the values
    stay right."""
    known: dict[tuple[str, ...], frozenset[str]] = {}
    for start in range(0, 3 * MAX_KNOWN_SETS, 1000):
        raw = [[str(i)] for i in range(start, start + 1000)]
        assert string_sets(raw, known) == [frozenset(v) for v in raw]
        assert len(known) <= MAX_KNOWN_SETS


def test_a_bulk_load_shares_the_sets_of_equal_arrays() -> None:
    """A load of many hosts with few distinct `tags` arrays (of snapshots, or of records: the
    view's lean rows) keeps one frozenset per distinct array, and the column that upserting
    them one by one gives."""
    choices = [["a"], ["b", "c"], [], ["c", "b"]]
    snaps = [host_snapshot(f"h{i:03d}", {"tags": choices[i % len(choices)]} if i % 7 else
                           {"tags": NULL_VALUE}) for i in range(200)]
    one_by_one = HostTable(CATALOG)
    for snap in snaps:
        one_by_one.upsert(snap)
    of_snaps, of_records = HostTable(CATALOG), HostTable(CATALOG)
    of_snaps.load(snaps)
    of_records.append_records([encode(s) for s in snaps])
    for bulk in (of_snaps, of_records):
        _assert_same_table(bulk, one_by_one, strict_pool=True, same_docs=bulk is of_snaps)
        col = bulk.column("tags")
        assert col is not None
        assert len({id(s) for s in col.sets if s is not None}) == len(choices)
