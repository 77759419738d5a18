"""Find, filter, sort and page hosts for the status page; and the health summary over them.

No IO and no clock (`now` is an argument): the REST layer (`ops/rest/page_api.py`)
passes the scheduler view's table.  A page is found on the table's arrays
in host-name order (name pattern and `select[]` masks, value sorts with
numpy); a host's record is read only when it is on the page or a STATUS or
reporter filter needs it.  Each host's STATUS (`crr.admin.host_status`, on the record as it is at
`now` via `crr.projections.freshness`), its value counts by state and its reporters'
states are cached per record until its next `expires_at`, so only records
that changed or expired since are looked at again.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Final

import msgspec
import numpy as np

from crr.admin.host_status import HostStatus, host_status
from crr.admin.reporter_health import is_failing
from crr.projections.freshness import Judgement, ProjectorLiveness, earliest_expiry, host_at
from crr.projections.host_table import BoolArray, HostTable, IntArray
from crr.projections.select import Section
from crr.schemas.errors import CrrError
from crr.schemas.snapshot import HostSnapshot

STATUS_ORDER: Final[dict[str, int]] = {"failing": 0, "stale": 1, "unknown": 2, "ok": 3,
                                       "empty": 4}
MAX_LIMIT: Final = 1000
MAX_PATTERN: Final = 512


class HostRow(msgspec.Struct, frozen=True, kw_only=True):
    """One row of the page's host table: the host's STATUS and its record as it is now."""

    host: str
    status: HostStatus
    snapshot: HostSnapshot


class HostPage(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /v1/host-table`: one page of the matching hosts, and how many match."""

    total: int
    """Hosts matching every filter (before paging)."""
    hosts_total: int
    """Hosts in the snapshot."""
    offset: int
    limit: int
    sort: str
    at: float
    """The `now` (epoch seconds) values and the select expression were evaluated at."""
    resources: list[str]
    """The catalog's host-scope resources (the table's columns), sorted."""
    rows: list[HostRow]
    expression: str | None = None
    ignored_sections: list[Section] = msgspec.field(default_factory=list)
    note: str | None = None


class Summary(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /v1/summary`: the counts at the top of the status page."""

    at: float
    """When the counts were judged: `judged_at` (the projector's watermark, at most
    `outage_hold` back; the clock while it is live)."""
    hosts: int
    host_status: dict[str, int]
    """Hosts per STATUS (ok, failing, stale, unknown, empty)."""
    values: dict[str, int]
    """Host values per state now (fresh, stale, unknown)."""
    reporters: dict[str, int]
    """(reporter, host) pairs per reporter state, cluster reporters included."""
    failing_reporters: int
    liveness: ProjectorLiveness
    """The projector's liveness now (state, last status age, lag, detail)."""
    position: int
    projector_position: int
    judgement: Judgement | None = None
    """When the counts were judged (`judged_at`, the projector's watermark at most
    `outage_hold` back) and whether the view is holding (the page's banner)."""


class Counts(msgspec.Struct, frozen=True, kw_only=True):
    """`summarize`'s counts, and until when they hold if no record changes."""

    hosts: int
    host_status: dict[str, int]
    values: dict[str, int]
    reporters: dict[str, int]
    failing_reporters: int
    until: float
    """The earliest moment a value counted expires (+inf: none): before it, and while no
    record changes, the same counts hold at any later `now`."""


class _Facts:
    __slots__ = ("failing", "key", "reporters", "status", "until", "values")

    def __init__(self, key: object, snap: HostSnapshot, now: float) -> None:
        self.key = key
        shown = host_at(snap, now)
        self.status: HostStatus = host_status(shown, now)
        self.values = Counter(e.state for e in shown.values.values())
        self.reporters = tuple(st.state for st in snap.reporters.values())
        self.failing = sum(map(is_failing, snap.reporters.values()))
        """Its failing reporters, by the rule `crr health` lists them with."""
        self.until = earliest_expiry(shown)
        """Until then these facts hold (`shown` has nothing due before it)."""


class HostFacts:
    """Per-record cache of STATUS, value states and reporter states (see the module doc),
    keyed by what the table stores for the host (`HostTable.stored`): a record the view
    keeps packed is decoded only when it changed or something in it expired."""

    def __init__(self) -> None:
        self._cache: dict[str, _Facts] = {}

    def of(self, table: HostTable, host: str, now: float) -> _Facts | None:
        """The facts of `host`'s record at `now` (None: no such host)."""
        key = table.stored(host)
        if key is None:
            return None
        f = self._cache.get(host)
        if f is None or f.key is not key or now >= f.until:
            snap = table.get(host)
            if snap is None:
                return None
            f = self._cache[host] = _Facts(key, snap, now)
        return f

    def prune(self, live: int) -> None:
        """Start over when removed hosts make the cache much larger than `live` hosts."""
        if len(self._cache) > 2 * live + 1024:
            self._cache.clear()


def name_matcher(pattern: str) -> Callable[[str], bool]:
    """A glob (`node1*`, `gpu-?[0-9]`) matched whole, else a case-insensitive substring."""
    if len(pattern) > MAX_PATTERN:
        raise CrrError(f"host pattern too long: {len(pattern)} characters "
                       f"(at most {MAX_PATTERN})")
    if any(c in pattern for c in "*?["):
        rx = re.compile(fnmatch.translate(pattern))
        return lambda name: rx.match(name) is not None
    low = pattern.lower()
    return lambda name: low in name.lower()


def check_sort(sort: str, resources: Iterable[str]) -> tuple[str, bool]:
    """(column, descending) of `sort` (`host`, `-status`, `scratch_free`…); CrrError if unknown."""
    desc = sort.startswith("-")
    column = sort[1:] if desc else sort
    if column not in ("host", "status") and column not in set(resources):
        raise CrrError(f"cannot sort by {column!r}: expected host, status or a host-scope "
                       "resource of the catalog (prefix - for descending)")
    return column, desc


def _by_value(table: HostTable, column: str, idx: IntArray, desc: bool, now: float) -> IntArray:
    """`idx` (positions in host-name order) sorted by the value `select[]` sees at `now`:
    fresh values by value (strings by text, string sets by member count), then the hosts
    whose value is not fresh, by name."""
    col = table.column(column)
    if col is None:
        return idx
    rows = table.sorted_rows()[idx]
    known = col.known(now)[rows]
    vals = col.values[rows]
    if col.kind == "string":
        ranks = table.ranks()
        vals = np.where(vals >= 0, ranks[np.clip(vals, 0, max(len(ranks) - 1, 0))], -1) \
            if len(ranks) else np.zeros(len(rows))
    key = vals.astype(np.float64)
    if desc:
        key = -key
    return idx[np.lexsort((idx, key, ~known))]


def query(table: HostTable, facts: HostFacts, now: float, *,
          match: str | None = None, status: str | None = None,
          reporter_state: str | None = None, selected: BoolArray | None = None,
          sort: str = "host", resources: list[str], offset: int = 0, limit: int = 100,
          ) -> tuple[int, list[HostRow]]:
    """(number of matching hosts, the page `[offset, offset + limit)` of them, sorted).

    Works in host-name order on the table's arrays; a host's record is looked at only
    when a filter or the sort needs its STATUS or reporters, or when it is on the page.
    `selected`: a per-row mask (`crr.projections.select.columnar.truth`)."""
    column, desc = check_sort(sort, resources)
    names = table.sorted_names()
    keep = np.ones(len(names), dtype=np.bool_)
    if selected is not None:
        keep &= selected[table.sorted_rows()]
    if match:
        matches = name_matcher(match)
        keep &= np.fromiter(map(matches, names), dtype=np.bool_, count=len(names))
    idx = np.flatnonzero(keep)
    get = table.get
    if status is not None or reporter_state is not None or column == "status":
        chosen: list[int] = []
        ranks: list[int] = []
        for i in idx.tolist():
            f = facts.of(table, names[i], now)
            if f is None:
                continue
            if status is not None and f.status != status:
                continue
            if reporter_state is not None and not (
                    f.failing > 0 if reporter_state == "failing"
                    else reporter_state in f.reporters):
                continue
            chosen.append(i)
            ranks.append(STATUS_ORDER[f.status])
        idx = np.asarray(chosen, dtype=np.int64)
        if column == "status":
            key = np.asarray(ranks, dtype=np.int64)
            idx = idx[np.lexsort((idx, -key if desc else key))]
    if column == "host" and desc:
        idx = idx[::-1]
    elif column not in ("host", "status"):
        idx = _by_value(table, column, idx, desc, now)
    rows = []
    for i in idx[offset:offset + limit].tolist():
        snap = get(names[i])
        f = facts.of(table, names[i], now)
        if snap is not None and f is not None:
            rows.append(HostRow(host=snap.host, status=f.status, snapshot=host_at(snap, now)))
    return len(idx), rows


def summarize(table: HostTable, facts: HostFacts, now: float) -> Counts:
    """Hosts, hosts per STATUS, values per state, reporters per state and failing reporters
    at `now`, the cluster's reporters included."""
    hosts = failing = 0
    until = math.inf
    statuses: Counter[str] = Counter()
    values: Counter[str] = Counter()
    reporters: Counter[str] = Counter()
    for host in table.hosts():
        f = facts.of(table, host, now)
        if f is None:
            continue
        hosts += 1
        statuses[f.status] += 1
        values.update(f.values)
        reporters.update(f.reporters)
        failing += f.failing
        until = min(until, f.until)
    cluster = table.cluster()
    if cluster is not None:
        reporters.update(st.state for st in cluster.reporters.values())
        failing += sum(map(is_failing, cluster.reporters.values()))
    return Counts(hosts=hosts, host_status=dict(statuses), values=dict(values),
                  reporters=dict(reporters), failing_reporters=failing, until=until)
