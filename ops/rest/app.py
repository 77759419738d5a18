"""The read-only REST API and status page (`crr api`, docs/contract.md, "REST"), over a
`SchedulerView`.

Litestar, because it encodes msgspec Structs natively (the JSON is exactly
the wire types of `schemas/`) and derives the OpenAPI document from the
same types (served at `/schema/openapi.json`).  Every answer comes from the
scheduler view's cached copy of CRR_SNAPSHOT; nothing here calls a reporter
or the projector.

Errors are RFC 9457 problem details (`application/problem+json`,
`crr.rest.problems`): a bad `select[]` expression is a 400 whose `detail`
carries the caret message and `column` the 0-based offset; before the view's
initial load every data endpoint answers 503 (never an empty, "absent" answer).

The handlers are plain methods of `Api`, which holds the app's dependencies
(the view, the liveness threshold, the caches); `routes` says which URL each
one serves, and `create_app` wires them (`crr.rest.server` serves the app).

`/v1/events` is a server-sent event stream fed by `SchedulerView.subscribe`:
one `host` / `cluster` / `catalog` / `projector` event per changed record
(coalesced), and a `liveness` event (the projector's liveness now) at once
and every `liveness_interval` seconds, which the status page (`/`, files in
`ops/rest/static/`) applies in place without reloading.  A `projector` event
carries the status record that changed: with partitioned projectors there is
one per partition (its `partition`/`partitions` say which), and a left-over
record of an earlier layout sends none.

One truth at `now` (`crr.projections.freshness`): every host and cluster record
served — `/v1/hosts`, `/v1/hosts/{host}`, `/v1/cluster`, the `host` and
`cluster` events — shows a value past its `expires_at` as stale, whether or
not the projector has written it so.  Every response carries the
projector's liveness in `Crr-Projector-State` (live, silent, absent),
`Crr-Projector-Age` (seconds since the oldest current status) and
`Crr-Projector-Lag` headers; `/v1/projector` has the details; `/healthz` is
503 — and says why in its body — when the projector is silent or absent or
NATS is unreachable.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import msgspec
from litestar import Litestar, MediaType, Response, get
from litestar.exceptions import NotFoundException, ValidationException
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import Tag
from litestar.params import PathParameter, QueryParameter
from litestar.response import File, ServerSentEvent
from litestar.response.sse import ServerSentEventMessage
from litestar.static_files import create_static_files_router

from crr.admin.liveness import silent_after as configured_silent_after
from crr.admin.reporter_health import ReporterHealth, reporter_rows
from crr.projections.freshness import (
    Judgement,
    ProjectorLiveness,
    cluster_at,
    earliest_expiry,
    host_at,
    projector_liveness,
)
from crr.projections.select import Explanation, Section
from crr.projector.metrics import ViewMetrics
from crr.rest import api_docs, page_api
from crr.rest.page_api import PageApi
from crr.rest.problems import EXCEPTION_HANDLERS
from crr.schemas.catalog import ResourceSpec
from crr.schemas.errors import NotReadyError, SubjectError
from crr.schemas.snapshot import ClusterSnapshot, HostSnapshot, ProjectorStatus, ValueState
from crr.schemas.subjects import snapshot_host, snapshot_kind, status_partition
from crr.schemas.wire_time import format_time
from crr.view.scheduler_view import SchedulerView

STATIC_DIR: Final = Path(__file__).resolve().parent / "static"
HEARTBEAT: Final = 15.0
"""Seconds between SSE comments that keep proxies from closing an idle stream."""
LIVENESS_INTERVAL: Final = 5.0
"""Seconds between `liveness` events on `/v1/events`."""


class SelectResult(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /v1/select`: the matching hosts (sorted), and why `host` matches if asked."""

    expression: str
    hosts: list[str]
    at: str
    """The `now` the expression was evaluated at (RFC 3339, like every other time)."""
    at_ts: float
    """The same instant in epoch seconds (the numeric twin)."""
    explanation: Explanation | None = None
    judgement: Judgement | None = None
    """When freshness was judged: `judged_at` (= `at_ts`), the watermark, and whether the
    view is holding (docs/contract.md, "Freshness at the watermark")."""
    ignored_sections: list[Section] = msgspec.field(default_factory=list)
    """For a whole LSF requirement string: its sections other than select (`rusage[...]`,
    `order[...]`, …), which are the scheduler's and were not evaluated."""
    note: str | None = None
    """Says so in one line when `ignored_sections` is not empty."""


ProblemCode = Literal["nats_unreachable", "projector_silent", "projector_absent",
                      "projector_rebuilding", "projector_lagging"]
_LIVENESS_PROBLEM: dict[str, ProblemCode] = {
    "absent": "projector_absent", "silent": "projector_silent",
    "rebuilding": "projector_rebuilding"}


class HealthProblem(msgspec.Struct, frozen=True, kw_only=True):
    """Why `/healthz` is not 200: which part, and one line for people."""

    code: ProblemCode
    detail: str


class ProjectorInfo(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /v1/projector`: the projector's liveness now, and its status record(s)."""

    liveness: ProjectorLiveness
    projector_position: int
    """Every CRR_EVENTS event up to this sequence is reflected (the minimum over partitions)."""
    projectors: list[ProjectorStatus]
    """The current layout's status records: one, or one per partition in partition order."""


class Healthz(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /healthz` once the view is loaded: 200 when `status` is ok, else 503."""

    status: Literal["ok", "unavailable"]
    problems: list[HealthProblem] = msgspec.field(default_factory=list)
    """Empty when ok; else what is wrong: NATS unreachable, the projector silent or absent."""
    nats: Literal["connected", "unreachable"] = "connected"
    liveness: ProjectorLiveness | None = None
    """The projector's liveness now (last status age, lag)."""
    hosts: int
    position: int
    """Last CRR_SNAPSHOT sequence the view applied."""
    projector_position: int
    """Every CRR_EVENTS event up to this sequence is reflected (the minimum over partitions)."""
    projector: ProjectorStatus | None = None
    """The newest projector status record (for one projector: its status)."""
    projectors: list[ProjectorStatus] = msgspec.field(default_factory=list)
    """The current layout's status records: one, or one per partition in partition order."""
    judgement: Judgement | None = None
    """When values are judged now (`judged_at`), the watermark's lag, and whether the view
    is holding (then `problems` says `projector_lagging`)."""


def _current_status(view: SchedulerView, subject: str) -> ProjectorStatus | None:
    """The current layout's status record on `subject` (None: deleted, or a left-over)."""
    partition = status_partition(subject)
    return next((st for st in view.projectors if st.partition == partition), None)


def _filter_host(snap: HostSnapshot, resources: Sequence[str] | None,
                 state: ValueState | None) -> HostSnapshot | None:
    values = snap.values
    if resources:
        values = {k: v for k, v in values.items() if k in resources}
        if not values:
            return None
    if state is not None and not any(v.state == state for v in values.values()):
        return None
    if values is snap.values:
        return snap
    return msgspec.structs.replace(snap, values=values)


class Api:
    """The route handlers, bound to one view (see module doc)."""

    def __init__(self, view: SchedulerView, *, silent_after: float | None = None,
                 liveness_interval: float = LIVENESS_INTERVAL) -> None:
        self.view = view
        self.silent_after = configured_silent_after() if silent_after is None else silent_after
        """Seconds without a projector status before /healthz reports it silent."""
        self.liveness_interval = liveness_interval
        self.closing = asyncio.Event()
        """Set on shutdown: open event streams end."""
        self.page_loads = 0
        self.metrics = ViewMetrics(view, self.liveness)
        self._expiry: dict[str, tuple[HostSnapshot, float]] = {}
        """host -> (the record last served, its `earliest_expiry`): most records need no
        work at `now` (see `host_now`)."""

    def host_now(self, snap: HostSnapshot, now: float) -> HostSnapshot:
        """`host_at(snap, now)`, skipping records with nothing due yet (cached per record;
        a lean row is decoded anew on every `get`, so it is not cached)."""
        if self.view.table.record(snap.host) is not None:
            return host_at(snap, now)
        cached = self._expiry.get(snap.host)
        if cached is None or cached[0] is not snap:
            if len(self._expiry) > 2 * len(self.view.table) + 1024:
                self._expiry.clear()  # forgotten hosts: start over rather than grow
            cached = self._expiry[snap.host] = (snap, earliest_expiry(snap))
        return snap if now < cached[1] else host_at(snap, now)

    def liveness(self, now: float | None = None) -> ProjectorLiveness:
        """The projector's liveness at `now` (default: the clock), from the view's records."""
        return projector_liveness(self.view.projectors, time.time() if now is None else now,
                                  self.silent_after)

    def judged_at(self) -> float:
        """The time every freshness rule is applied at now (`SchedulerView.judgement`)."""
        return self.view.judgement().judged_at

    def health(self, now: float) -> Healthz:
        """The `/healthz` body at `now` (the view must be loaded)."""
        view = self.view
        live = self.liveness(now)
        judged = view.judgement(now)
        problems = []
        if not view.connected:
            problems.append(HealthProblem(
                code="nats_unreachable",
                detail="NATS unreachable: the view is reconnecting; answers may be out of date"))
        if live.state != "live":
            problems.append(HealthProblem(
                code=_LIVENESS_PROBLEM[live.state],
                detail=f"projector {live.detail}"))
        if judged.holding or judged.expired:
            problems.append(HealthProblem(code="projector_lagging", detail=judged.detail))
        return Healthz(status="unavailable" if problems else "ok", problems=problems,
                       judgement=judged, liveness=live,
                       nats="connected" if view.connected else "unreachable",
                       hosts=len(view.table), position=view.position,
                       projector_position=view.projector_position,
                       projector=view.projector, projectors=view.projectors)

    def liveness_headers(self, response: Response[Any]) -> Response[Any]:
        """Every response says how alive the projector is (see the module doc)."""
        live = self.liveness()
        response.headers["Crr-Projector-State"] = live.state
        if live.last_status_age is not None:
            response.headers["Crr-Projector-Age"] = f"{live.last_status_age:.3f}"
        if live.lag is not None:
            response.headers["Crr-Projector-Lag"] = str(live.lag)
        return response

    def _ready(self) -> None:
        if not self.view.ready:
            raise NotReadyError("scheduler view not loaded yet: retry shortly")

    # -- the routes' handlers (`routes` says which URL each serves) -----------------

    async def hosts(
        self,
        resource: Annotated[list[str] | None, QueryParameter(
            description="only hosts with a value of this resource, showing only the "
                        "named resources (repeatable)")] = None,
        value_state: Annotated[ValueState | None, QueryParameter(
            name="state",
            description="only hosts with a value in this state now (a fresh value past "
                        "its expires_at counts as stale)")] = None,
    ) -> list[HostSnapshot]:
        """`GET /v1/hosts`."""
        self._ready()
        view = self.view
        at = self.judged_at()
        out = []
        for name in view.table.hosts():
            snap = view.table.get(name)
            if snap is None:
                continue
            kept = _filter_host(self.host_now(snap, at), resource, value_state)
            if kept is not None:
                out.append(kept)
        return out

    async def host(
        self, host: Annotated[str, PathParameter(description="the host name")],
    ) -> HostSnapshot:
        """`GET /v1/hosts/{host}`."""
        self._ready()
        snap = self.view.table.get(host)
        if snap is None:
            raise NotFoundException(f"no snapshot for host {host!r}")
        return self.host_now(snap, self.judged_at())

    async def cluster(self) -> ClusterSnapshot:
        """`GET /v1/cluster`."""
        self._ready()
        if self.view.cluster is None:
            raise NotFoundException("no cluster snapshot yet (no cluster-scope value)")
        return cluster_at(self.view.cluster, self.judged_at())

    async def resources(self) -> dict[str, ResourceSpec]:
        """`GET /v1/resources`."""
        self._ready()
        catalog = self.view.catalog
        return dict(catalog.resources) if catalog is not None else {}

    async def reporters(
        self,
        reporter: Annotated[str | None,
                            QueryParameter(description="only this reporter")] = None,
        failing: Annotated[bool | None, QueryParameter(
            description="only failing (true) or only healthy (false) rows")] = None,
    ) -> list[ReporterHealth]:
        """`GET /v1/reporters`."""
        self._ready()
        table = self.view.table
        snaps = [s for s in (table.get(h) for h in table.hosts()) if s is not None]
        rows = reporter_rows(snaps, self.view.cluster)
        return [r for r in rows if (reporter is None or r.reporter == reporter)
                and (failing is None or r.failing == failing)]

    async def select(
        self,
        expr: Annotated[str, QueryParameter(
            description="the expression, bare or wrapped (scratch_free > 100), or a whole "
                        "LSF requirement string (select[...] rusage[...] …: only the "
                        "select section is evaluated)")],
        explain: Annotated[bool, QueryParameter(
            description="also explain why `host` matches or not")] = False,
        host: Annotated[str | None, QueryParameter(
            description="the host to explain (required with explain=true)")] = None,
    ) -> SelectResult:
        """`GET /v1/select`."""
        self._ready()
        view = self.view
        judged = view.judgement()
        now, at = judged.now, judged.judged_at
        compiled = view.compile(expr)
        explanation = None
        if explain:
            if host is None:
                raise ValidationException("explain=true needs host=<name>")
            explanation = view.explain(expr, host, now)
        return SelectResult(expression=expr, hosts=view.select(compiled, now),
                            at=format_time(at), at_ts=at, explanation=explanation,
                            judgement=judged,
                            ignored_sections=list(compiled.ignored_sections),
                            note=compiled.note)

    async def projector(self) -> ProjectorInfo:
        """`GET /v1/projector`."""
        self._ready()
        return ProjectorInfo(liveness=self.liveness(),
                             projector_position=self.view.projector_position,
                             projectors=self.view.projectors)

    async def healthz(self) -> Response[Healthz]:
        """`GET /healthz`."""
        if not self.view.ready and not self.view.connected:
            raise NotReadyError("scheduler view not loaded yet, and NATS is unreachable")
        self._ready()
        body = self.health(time.time())
        return Response(body, status_code=200 if body.status == "ok" else 503)

    async def events(self) -> ServerSentEvent:
        """`GET /v1/events`."""
        self._ready()
        return ServerSentEvent(self.stream())

    async def index(self) -> File:
        """`GET /`: the status page."""
        self.page_loads += 1
        return File(STATIC_DIR / "index.html", content_disposition_type="inline",
                    media_type=MediaType.HTML)

    # -- /v1/events ---------------------------------------------------------------

    def _message(self, subject: str) -> ServerSentEventMessage | None:
        """The event a changed record on `subject` sends (None: nothing to send)."""
        view = self.view
        match snapshot_kind(subject):
            case "host":
                try:
                    name = snapshot_host(subject)
                except SubjectError:
                    return None
                snap = view.table.get(name)
                data = (msgspec.json.encode(self.host_now(snap, self.judged_at()))
                        if snap is not None
                        else msgspec.json.encode({"host": name, "removed": True}))
                return ServerSentEventMessage(event="host", data=data.decode())
            case "cluster" if view.cluster is not None:
                return ServerSentEventMessage(
                    event="cluster",
                    data=msgspec.json.encode(cluster_at(view.cluster,
                                                        self.judged_at())).decode())
            case "catalog" if view.catalog is not None:
                return ServerSentEventMessage(
                    event="catalog", data=msgspec.json.encode(view.catalog.resources).decode())
            case "projector":
                status = _current_status(view, subject)
                if status is not None:
                    return ServerSentEventMessage(event="projector",
                                                  data=msgspec.json.encode(status).decode())
        return None

    def _liveness_message(self) -> ServerSentEventMessage:
        return ServerSentEventMessage(event="liveness",
                                      data=msgspec.json.encode(self.liveness()).decode())

    def _judgement_message(self) -> ServerSentEventMessage:
        """When values are judged now, and whether the view is holding (the page's banner)."""
        return ServerSentEventMessage(
            event="judgement", data=msgspec.json.encode(self.view.judgement()).decode())

    async def stream(self) -> AsyncIterator[ServerSentEventMessage]:
        """Changed records as SSE messages; coalesced per subject, until shutdown."""
        pending: dict[str, None] = {}
        wake = asyncio.Event()

        def listener(subject: str) -> None:
            pending[subject] = None
            wake.set()

        unsubscribe = self.view.subscribe(listener)
        closing = asyncio.ensure_future(self.closing.wait())
        waiter: asyncio.Future[Literal[True]] | None = None
        loop = asyncio.get_running_loop()
        try:
            yield ServerSentEventMessage(event="hello", data=str(self.view.position))
            yield self._liveness_message()
            yield self._judgement_message()
            next_liveness = loop.time() + self.liveness_interval
            while not self.closing.is_set():
                waiting = waiter = asyncio.ensure_future(wake.wait())
                timeout = max(0.0, min(HEARTBEAT, next_liveness - loop.time()))
                done, _ = await asyncio.wait({waiting, closing}, timeout=timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
                if loop.time() >= next_liveness:
                    yield self._liveness_message()  # also keeps proxies from closing it
                    yield self._judgement_message()
                    next_liveness = loop.time() + self.liveness_interval
                if not done:
                    continue
                wake.clear()
                subjects, pending = list(pending), {}
                for subject in subjects:
                    msg = self._message(subject)
                    if msg is not None:
                        yield msg
        finally:
            # A client that disconnects cancels this generator inside `asyncio.wait`:
            # both waits are cancelled here, or they would be destroyed pending.
            for fut in (closing, waiter):
                if fut is not None:
                    fut.cancel()
            unsubscribe()


def routes(api: Api) -> list[HTTPRouteHandler]:
    """Every route of the API: its URL and OpenAPI facts, and the `api` method serving it."""
    return [
        get("/v1/hosts", tags=["hosts"], summary="Host snapshots, sorted by host")(api.hosts),
        get("/v1/hosts/{host:str}", tags=["hosts"], summary="One host's snapshot")(api.host),
        get("/v1/cluster", tags=["hosts"], summary="Cluster-scope values")(api.cluster),
        get("/v1/resources", tags=["catalog"],
            summary="The active catalog's resources")(api.resources),
        get("/v1/reporters", tags=["health"],
            summary="Reporter health per host, failing first")(api.reporters),
        get("/v1/select", tags=["select"],
            summary="Hosts matching a select[] expression")(api.select),
        get("/v1/projector", tags=["health"],
            summary="The projector's liveness (last status age, lag) and status records",
            )(api.projector),
        get("/healthz", tags=["health"],
            summary="200 when loaded, NATS reachable and the projector live; else 503",
            responses={503: ResponseSpec(
                data_container=Healthz,
                description="NATS unreachable or the projector silent or absent (`problems` "
                            "says which); a problem detail before the view is loaded")},
            )(api.healthz),
        get("/v1/events", tags=["events"], summary="Server-sent events: changed records",
            media_type="text/event-stream")(api.events),
        get("/", include_in_schema=False, media_type=MediaType.HTML)(api.index),
        *page_api.routes(PageApi(api.view, api.liveness)),
    ]


def create_app(view: SchedulerView, *, debug: bool = False, silent_after: float | None = None,
               liveness_interval: float = LIVENESS_INTERVAL) -> tuple[Litestar, Api]:
    """The Litestar app over `view`, and its handler object (for `closing`, counters).

    `silent_after`: seconds without a projector status before it counts as silent
    (default: `CRR_PROJECTOR_SILENT_AFTER`, else 15)."""
    api = Api(view, silent_after=silent_after, liveness_interval=liveness_interval)
    app = Litestar(
        route_handlers=[*routes(api), *api_docs.HANDLERS,
                        create_static_files_router(path="/static", directories=[STATIC_DIR])],
        openapi_config=OpenAPIConfig(
            # JSON only (/schema/openapi.json): Litestar's UIs load from a CDN; /docs does not.
            title="crr", version="1", render_plugins=[JsonRenderPlugin()],
            description="Read-only REST API of crr (custom resource reporting): the scheduler "
                        "view's copy of CRR_SNAPSHOT.  Errors are RFC 9457 problem details.",
            tags=[Tag(name="hosts"), Tag(name="select"), Tag(name="catalog"),
                  Tag(name="health"), Tag(name="events")],
        ),
        exception_handlers=EXCEPTION_HANDLERS,
        after_request=api.liveness_headers,
        debug=debug,
        # Logging stays crr's (`crr.cli`'s one format): Litestar's default config replaces
        # the root logger's handlers with a queue and a listener thread of its own, which
        # reformats every crr line of `crr api` and, in a test process, keeps writing to a
        # stream that pytest has closed.
        logging_config=None,
    )
    return app, api
