"""Find, filter, sort and page hosts for the status page; and the health summary over them.

No IO and no clock (`now` is an argument): the REST layer (`ops/page_api.py`)
passes the scheduler view's table.  At 50k hosts a request walks the host
list once: each host's STATUS (`ops.host_status`, on the record as it is at
`now` via `ops.page_truth`), its value counts by state and its reporters'
states are cached per record until its next `expires_at`, so only records
that changed or expired since are looked at again.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Final, Literal

import msgspec

from ops.host_status import HostStatus, host_status
from ops.page_truth import host_now
from ops.reporter_health import FAILING_STATES
from projections.host_table import expires_seconds
from projections.select import Section
from schemas.errors import CrrError
from schemas.snapshot import ClusterSnapshot, HostSnapshot

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
    hosts: int
    host_status: dict[str, int]
    """Hosts per STATUS (ok, failing, stale, unknown, empty)."""
    values: dict[str, int]
    """Host values per state now (fresh, stale, unknown)."""
    reporters: dict[str, int]
    """(reporter, host) pairs per reporter state, cluster reporters included."""
    failing_reporters: int
    liveness: Any
    """The projector's liveness now (state, last status age, lag, detail)."""
    position: int
    projector_position: int


class _Facts:
    __slots__ = ("reporters", "snap", "status", "until", "values")

    def __init__(self, snap: HostSnapshot, now: float) -> None:
        self.snap = snap
        shown = host_now(snap, now)
        self.status: HostStatus = host_status(shown, now)
        self.values = Counter(e.state for e in shown.values.values())
        self.reporters = tuple(st.state for st in snap.reporters.values())
        later = [t for t in (expires_seconds(e.expires_at) for e in shown.values.values()
                             if e.state != "stale") if t > now]
        self.until = min(later, default=math.inf)


class HostFacts:
    """Per-record cache of STATUS, value states and reporter states (see the module doc)."""

    def __init__(self) -> None:
        self._cache: dict[str, _Facts] = {}

    def of(self, snap: HostSnapshot, now: float) -> _Facts:
        """The facts of `snap` at `now`."""
        f = self._cache.get(snap.host)
        if f is None or f.snap is not snap or now >= f.until:
            f = self._cache[snap.host] = _Facts(snap, now)
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


SortKey = tuple[int, Any]
_MISSING: Final = 1


def _value_key(snap: HostSnapshot, resource: str) -> SortKey | None:
    entry = snap.values.get(resource)
    if entry is None:
        return None
    v = entry.last_value if entry.state == "stale" else entry.value
    if v is None:
        return None
    if isinstance(v, bool | int | float):
        return (0, float(v))
    if isinstance(v, list):
        return (0, float(len(v)))
    return (1, str(v))


def check_sort(sort: str, resources: Iterable[str]) -> tuple[str, bool]:
    """(column, descending) of `sort` (`host`, `-status`, `scratch_free`…); CrrError if unknown."""
    desc = sort.startswith("-")
    column = sort[1:] if desc else sort
    if column not in ("host", "status") and column not in set(resources):
        raise CrrError(f"cannot sort by {column!r}: expected host, status or a host-scope "
                       "resource of the catalog (prefix - for descending)")
    return column, desc


def order(rows: list[tuple[HostSnapshot, _Facts]], column: str, desc: bool,
          ) -> list[tuple[HostSnapshot, _Facts]]:
    """Rows sorted by `column`; hosts without a value of a resource column come last."""
    if column == "host":
        return sorted(rows, key=lambda r: r[0].host, reverse=desc)
    if column == "status":
        return sorted(rows, key=lambda r: (STATUS_ORDER[r[1].status], r[0].host), reverse=desc)
    keyed = [(_value_key(r[0], column), r) for r in rows]
    have = [(k, r) for k, r in keyed if k is not None]
    missing = [r for k, r in keyed if k is None]
    have.sort(key=lambda kr: (kr[0], kr[1][0].host), reverse=desc)
    missing.sort(key=lambda r: r[0].host)
    return [r for _, r in have] + missing


ReporterFilter = Literal["failing", "ok"] | str | None


def query(snaps: Iterable[HostSnapshot], facts: HostFacts, now: float, *,
          match: str | None = None, status: str | None = None,
          reporter_state: str | None = None, selected: set[str] | None = None,
          sort: str = "host", resources: list[str], offset: int = 0, limit: int = 100,
          ) -> tuple[int, list[HostRow]]:
    """(number of matching hosts, the page `[offset, offset + limit)` of them, sorted)."""
    column, desc = check_sort(sort, resources)
    matches = name_matcher(match) if match else None
    kept: list[tuple[HostSnapshot, _Facts]] = []
    for snap in snaps:
        if selected is not None and snap.host not in selected:
            continue
        if matches is not None and not matches(snap.host):
            continue
        f = facts.of(snap, now)
        if status is not None and f.status != status:
            continue
        if reporter_state is not None and not (
                any(s in FAILING_STATES for s in f.reporters) if reporter_state == "failing"
                else reporter_state in f.reporters):
            continue
        kept.append((snap, f))
    page = order(kept, column, desc)[offset:offset + limit]
    return len(kept), [HostRow(host=s.host, status=f.status, snapshot=host_now(s, now))
                       for s, f in page]


def summarize(snaps: Iterable[HostSnapshot], cluster: ClusterSnapshot | None, facts: HostFacts,
              now: float) -> tuple[int, Counter[str], Counter[str], Counter[str]]:
    """(hosts, hosts per STATUS, values per state, reporters per state) at `now`."""
    hosts = 0
    statuses: Counter[str] = Counter()
    values: Counter[str] = Counter()
    reporters: Counter[str] = Counter()
    for snap in snaps:
        f = facts.of(snap, now)
        hosts += 1
        statuses[f.status] += 1
        values.update(f.values)
        reporters.update(f.reporters)
    if cluster is not None:
        reporters.update(st.state for st in cluster.reporters.values())
    return hosts, statuses, values, reporters
