"""The REST endpoints the status page needs beyond docs/contract.md, "REST" (all read-only, in the
OpenAPI).

- `GET /v1/host-table`: the host table the page shows, one page at a time:
  filtered by a host-name pattern, a STATUS, a reporter state and a
  `select[]` expression (or whole requirement string), sorted by any
  column, paged by `offset`/`limit` — the server does the work, so the
  page renders only the visible rows at 50k hosts.
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
from crr.admin.reporter_health import FAILING_STATES
from crr.history.host_timeline import read_timeline, retention
from crr.history.latency import ReporterLatency, SlowReport, collect, slowest, summarize
from crr.projections.freshness import ProjectorLiveness, projector_liveness
from crr.projections.select import Explanation
from crr.projections.select.columnar import truth
from crr.projections.timeline import HostTimeline
from crr.rest.host_query import MAX_LIMIT, HostFacts, HostPage, Summary, query
from crr.rest.host_query import summarize as count_hosts
from crr.schemas.duration import parse_duration
from crr.schemas.errors import CrrError, NotReadyError
from crr.schemas.snapshot import ReporterState
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
        view = self.view
        now = view.judged_at  # freshness at the watermark (crr.admin.liveness.judgement)
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

    async def summary(self) -> Summary:
        """`GET /v1/summary` (reused for `SUMMARY_TTL` s)."""
        self._ready()
        view = self.view
        judged = view.judgement()
        now = judged.now
        cached = self._summary
        if cached is not None and 0 <= now - cached.at < SUMMARY_TTL:
            return cached
        self.facts.prune(len(view.table))
        hosts, statuses, values, reporters = count_hosts(view.table, self.facts,
                                                         judged.judged_at)
        self._summary = Summary(at=now, hosts=hosts, host_status=dict(statuses),
                                values=dict(values), reporters=dict(reporters),
                                failing_reporters=sum(n for s, n in reporters.items()
                                                      if s in FAILING_STATES),
                                liveness=self.live(now), judgement=judged,
                                position=view.position,
                                projector_position=view.projector_position)
        return self._summary

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
