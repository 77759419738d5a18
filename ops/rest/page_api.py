"""The REST endpoints the status page needs beyond docs/contract.md, "REST" (all read-only, in the
OpenAPI).

- `GET /v1/host-table`: the host table the page shows, one page at a time:
  filtered by a host-name pattern, a STATUS, a reporter state and a
  `select[]` expression (or whole requirement string), sorted by any
  column, paged by `offset`/`limit` — the server does the work, so the
  page renders only the visible rows at 50k hosts.
- `GET /v1/page`: one paint of the page — the host table's page (as above), the
  summary, the failing reporters, the cluster values, what the bridges apply per
  row and the page's defaults from the catalog — all judged at one `now`
  (`ops/rest/page_view.py`).
- `GET /v1/summary`: hosts per STATUS, values per state, reporters per
  state, projector liveness and lag.
- `GET /v1/hosts/{host}/timeline?window=1h`: each value and reporter state
  of a host over the window, replayed from CRR_EVENTS with `crr replay`'s
  fold (`ops/history/host_timeline.py`); a window beyond the stream's retention is
  a 400.
- `GET /v1/explain?expr=…&host=…`: `crr explain`, as data and as its text.
- `GET /v1/latency?since=15m`: `crr latency`'s figures per reporter and the
  slowest reports, with trace ids (and `trace_url`, from `CRR_TRACE_URL`)
  when tracing is on.

Bad input is a 4xx problem detail (see `ops/rest/problems.py`), never a 500.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Annotated, Final, Literal, get_args

import msgspec
from litestar import get
from litestar.exceptions import NotFoundException
from litestar.handlers import HTTPRouteHandler
from litestar.params import PathParameter, QueryParameter

from crr.admin.liveness import silent_after
from crr.admin.reporter_health import ReporterHealth
from crr.history.host_timeline import read_timeline, retention
from crr.history.latency import ReporterLatency, SlowReport, collect, slowest, summarize
from crr.projections.freshness import Judgement, ProjectorLiveness, projector_liveness
from crr.projections.select import Explanation
from crr.projections.select.columnar import truth
from crr.projections.timeline import HostTimeline
from crr.rest.host_query import MAX_LIMIT, Counts, HostFacts, HostPage, Summary, query
from crr.rest.host_query import summarize as count_hosts
from crr.rest.page_view import PageJudge, PageView, cluster_now, failures
from crr.schemas.duration import parse_duration
from crr.schemas.errors import CrrError, NotReadyError
from crr.schemas.snapshot import ReporterState
from crr.schemas.subjects import snapshot_kind
from crr.view.scheduler_view import SchedulerView

TRACE_URL_ENV: Final = "CRR_TRACE_URL"
LATENCY_TTL: Final = 2.0
"""Seconds a latency answer is reused (each one reads both streams)."""
SUMMARY_TTL: Final = 1.0
"""Seconds a summary is reused (it walks every host: ~0.15 s at 50k)."""
MAX_LATENCY_REPORTS: Final = 200_000
"""Reports timed per answer at most (memory and time stay bounded on a busy cluster)."""
MAX_LATENCY_WINDOW: Final = 24 * 3600.0
HostStatusName = Literal["ok", "failing", "stale", "unknown", "empty"]
REPORTER_STATES: Final = frozenset(get_args(ReporterState)) | {"failing"}


class LatencyView(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /v1/latency`: `crr latency --json` plus the slowest reports."""

    since: float
    """The window's length in seconds."""
    reporters: list[ReporterLatency]
    slowest: list[SlowReport]
    left_out: int = 0
    """Reports of the window not timed (beyond `MAX_LATENCY_REPORTS`: the first ones are)."""
    trace_url: str | None = None
    """A link template with `{trace_id}` (from `CRR_TRACE_URL`), for traced reports."""


class ExplainView(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /v1/explain`: `crr explain EXPR --host H`, as data and as its text."""

    explanation: Explanation
    text: str
    """What `crr explain` prints."""


def _window(text: str, what: str) -> float:
    seconds = parse_duration(text)
    if not seconds > 0:
        raise CrrError(f"{what} must be a positive duration like 15m or 1h, got {text!r}")
    return seconds


class PageApi:
    """The handlers of the endpoints above, bound to one view (and its NATS connection for
    history); `routes` says which URL each serves."""

    def __init__(self, view: SchedulerView,
                 live: Callable[[float], ProjectorLiveness] | None = None) -> None:
        """`live(now)`: the projector's liveness at `now` (default:
        `crr.projections.freshness.projector_liveness` of the view's status records)."""
        self.view = view
        threshold = silent_after()
        self.live = live or (lambda now: projector_liveness(view.projectors, now, threshold))
        self.facts = HostFacts()
        self._latency: dict[tuple[float, int], tuple[float, LatencyView]] = {}
        self._latency_lock = asyncio.Lock()
        self._summary: Summary | None = None
        self.judge = PageJudge()
        self._paint: tuple[int, Counts, list[ReporterHealth], int] | None = None
        self._records = 0
        """Host, cluster and catalog records applied by the view (not projector statuses,
        which come every second and change no host): a `/v1/page` summary is reused
        only while this stays the same."""
        view.subscribe(self._applied)

    def _applied(self, subject: str) -> None:
        if snapshot_kind(subject) != "projector":
            self._records += 1

    def _ready(self) -> None:
        if not self.view.ready:
            raise NotReadyError("scheduler view not loaded yet: retry shortly")

    def _resources(self) -> list[str]:
        catalog = self.view.catalog
        if catalog is None:
            return []
        return sorted(n for n, spec in catalog.resources.items() if spec.scope == "host")

    async def measure_latency(self, since: float, top: int) -> LatencyView:
        """The latency figures (reused for `LATENCY_TTL` s; one measurement at a time)."""
        async with self._latency_lock:
            cached = self._latency.get((since, top))
            if cached is not None and time.monotonic() - cached[0] < LATENCY_TTL:
                return cached[1]
            events, dropped = await collect(self.view.nc, since=since, limit=MAX_LATENCY_REPORTS)
            out = LatencyView(since=since, reporters=summarize(events), left_out=dropped,
                              slowest=slowest(events, top),
                              trace_url=os.environ.get(TRACE_URL_ENV) or None)
            self._latency = {(since, top): (time.monotonic(), out)}
            return out

    # -- the routes' handlers --------------------------------------------------------

    async def host_table(  # noqa: PLR0917 - one argument per query parameter
        self,
        offset: Annotated[int, QueryParameter(ge=0, description="first row")] = 0,
        limit: Annotated[int, QueryParameter(ge=1, le=MAX_LIMIT,
                                             description="rows per page")] = 100,
        match: Annotated[str | None, QueryParameter(
            max_length=512, description="host names: a glob matched whole (node1*), "
                                        "else a case-insensitive substring")] = None,
        status: Annotated[HostStatusName | None, QueryParameter(
            description="only hosts with this STATUS now")] = None,
        reporter_state: Annotated[str | None, QueryParameter(
            description="only hosts with a reporter in this state (or `failing`: any "
                        "failing state)")] = None,
        sort: Annotated[str, QueryParameter(
            description="host, status or a host-scope resource; prefix - for "
                        "descending; hosts without the value come last")] = "host",
        select: Annotated[str | None, QueryParameter(
            description="a select[] expression or whole LSF requirement string: only "
                        "the hosts it selects now")] = None,
    ) -> HostPage:
        """`GET /v1/host-table`."""
        self._ready()
        # Freshness at the watermark (crr.admin.liveness.judgement), as every reader.
        return self._host_page(self.view.judged_at, offset=offset, limit=limit, match=match,
                               status=status, reporter_state=reporter_state, sort=sort,
                               select=select)

    def _host_page(self, now: float, *, offset: int, limit: int, match: str | None,
                   status: str | None, reporter_state: str | None, sort: str,
                   select: str | None) -> HostPage:
        view = self.view
        if reporter_state is not None and reporter_state not in REPORTER_STATES:
            raise CrrError(f"unknown reporter state {reporter_state!r}: expected one of "
                           f"{', '.join(sorted(REPORTER_STATES))}")
        compiled = view.compile(select) if select is not None and select.strip() else None
        selected = truth(compiled.tree, view.table, now) if compiled is not None else None
        resources = self._resources()
        self.facts.prune(len(view.table))
        total, rows = query(view.table, self.facts, now, match=match, status=status,
                            reporter_state=reporter_state, selected=selected, sort=sort,
                            resources=resources, offset=offset, limit=limit)
        return HostPage(total=total, hosts_total=len(view.table), offset=offset,
                        limit=limit, sort=sort, at=now, resources=resources, rows=rows,
                        expression=compiled.expression if compiled else None,
                        ignored_sections=list(compiled.ignored_sections) if compiled
                        else [], note=compiled.note if compiled else None)

    async def page(  # noqa: PLR0917 - one argument per query parameter
        self,
        offset: Annotated[int, QueryParameter(ge=0, description="first row")] = 0,
        limit: Annotated[int, QueryParameter(ge=1, le=MAX_LIMIT,
                                             description="rows per page")] = 100,
        match: Annotated[str | None, QueryParameter(
            max_length=512, description="as for /v1/host-table")] = None,
        status: Annotated[HostStatusName | None, QueryParameter(
            description="as for /v1/host-table")] = None,
        reporter_state: Annotated[str | None, QueryParameter(
            description="as for /v1/host-table")] = None,
        sort: Annotated[str, QueryParameter(description="as for /v1/host-table")] = "host",
        select: Annotated[str | None, QueryParameter(
            description="as for /v1/host-table")] = None,
    ) -> PageView:
        """`GET /v1/page`: the host table's page, the summary, the failures, the cluster
        values, the bridges' marks and the page's defaults, all at one `now`."""
        self._ready()
        view = self.view
        judged, summary, failing, failing_total = self._judged()
        now = judged.judged_at
        table = self._host_page(now, offset=offset, limit=limit, match=match, status=status,
                                reporter_state=reporter_state, sort=sort, select=select)
        return PageView(at=now, summary=summary, table=table, judgement=judged,
                        marks=self.judge.marks(view.table, table, view.catalog, now),
                        failures=failing, failures_total=failing_total,
                        cluster=cluster_now(view.cluster, now),
                        display=self.judge.display(view.catalog),
                        projectors=list(view.projectors))

    def _judged(self) -> tuple[Judgement, Summary, list[ReporterHealth], int]:
        """(the judgement, the summary, the failing rows, how many) for a `/v1/page` answer.

        The counts and the failing rows (each a walk over every host: ~0.5 s at 50k)
        are reused while the view has applied no host, cluster or catalog record since
        and no counted value has expired (`Counts.until`): they are then exactly what a
        walk at `now` would find.  Everything is judged at one `now`: the judgement's
        `judged_at` (the projector's watermark, at most `outage_hold` back)."""
        view = self.view
        judged = view.judgement()
        now = judged.judged_at
        cached = self._paint
        if cached is None or cached[0] != self._records or now >= cached[1].until:
            self.facts.prune(len(view.table))
            key = self._records
            counts = count_hosts(view.table, self.facts, now)
            failing, total = failures(view.table, self.facts, view.cluster, now)
            cached = self._paint = (key, counts, failing, total)
        _, counts, failing, total = cached
        return judged, self._summary_of(counts, judged), failing, total

    def _summary_of(self, counts: Counts, judged: Judgement) -> Summary:
        view = self.view
        now = judged.now  # (liveness at the clock; the counts, `at`, at judged_at)
        return Summary(at=judged.judged_at, hosts=counts.hosts, host_status=counts.host_status,
                       values=counts.values, reporters=counts.reporters,
                       failing_reporters=counts.failing_reporters, liveness=self.live(now),
                       position=view.position, projector_position=view.projector_position,
                       judgement=judged)

    async def summary(self) -> Summary:
        """`GET /v1/summary` (reused for `SUMMARY_TTL` s)."""
        self._ready()
        now = time.time()
        cached = self._summary
        if cached is not None and 0 <= now - cached.at < SUMMARY_TTL:
            return cached
        self._summary = self.summary_at(now)
        return self._summary

    def summary_at(self, now: float) -> Summary:
        """The summary at `now` (uncached), its counts judged at `judged_at`."""
        self.facts.prune(len(self.view.table))
        judged = self.view.judgement(now)
        return self._summary_of(count_hosts(self.view.table, self.facts, judged.judged_at),
                                judged)

    async def timeline(
        self,
        host: Annotated[str, PathParameter(description="the host name")],
        window: Annotated[str, QueryParameter(
            max_length=32, description="how far back from now: 15m, 1h, 6h…; at most "
                                       "what CRR_EVENTS retains")] = "1h",
    ) -> HostTimeline:
        """`GET /v1/hosts/{host}/timeline`."""
        self._ready()
        seconds = _window(window, "window")
        if self.view.table.get(host) is None:
            raise NotFoundException(f"no snapshot for host {host!r}")
        now = time.time()
        return await read_timeline(self.view.nc, host, now - seconds, now)

    async def latency(
        self,
        since: Annotated[str, QueryParameter(
            max_length=32, description="reports stored within this long ago (15m, 1h)"
        )] = "15m",
        top: Annotated[int, QueryParameter(ge=0, le=100,
                                           description="how many slowest reports")] = 10,
    ) -> LatencyView:
        """`GET /v1/latency`."""
        self._ready()
        seconds = _window(since, "since")
        keep = min(await retention(self.view.nc), MAX_LATENCY_WINDOW)
        if seconds > keep:
            raise CrrError(f"since={since} reaches beyond what can be measured "
                           f"({keep:g} s: CRR_EVENTS retention, at most 24 h)")
        return await self.measure_latency(seconds, top)

    async def explain(
        self,
        expr: Annotated[str, QueryParameter(
            description="the expression, or a whole LSF requirement string")],
        host: Annotated[str, QueryParameter(description="the host")],
    ) -> ExplainView:
        """`GET /v1/explain`."""
        self._ready()
        found = self.view.explain(expr, host, time.time())
        return ExplainView(explanation=found, text=found.render())


def routes(page: PageApi) -> list[HTTPRouteHandler]:
    """The page's routes (added to `crr.rest.app`'s): URL and OpenAPI facts, and the
    `page` method serving each."""
    return [
        get("/v1/host-table", tags=["hosts"],
            summary="The status page's host table: filtered, sorted, one page at a time",
            )(page.host_table),
        get("/v1/page", tags=["hosts"],
            summary="One paint of the status page: table, summary, failures, cluster, "
                    "bridges' marks and defaults, at one moment",
            )(page.page),
        get("/v1/summary", tags=["health"],
            summary="Counts for the status page: hosts, values, reporters, projector",
            )(page.summary),
        get("/v1/hosts/{host:str}/timeline", tags=["hosts"],
            summary="A host's values and reporter states over a window (replayed history)",
            )(page.timeline),
        get("/v1/latency", tags=["health"],
            summary="Per reporter observed → stored → snapshot percentiles; slowest reports",
            )(page.latency),
        get("/v1/explain", tags=["select"],
            summary="Why a host matches a select[] expression or not (crr explain)",
            )(page.explain),
    ]
