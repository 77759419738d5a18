"""Tracing: one trace per report from the script run to the scheduler view, on a real server.

The OTel SDK provider is process-global and can be set only once, so this
module installs one for the session whose root sampler is a switch (off
unless a test turns it on): other tests keep running untraced.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import pytest
from nats.aio.client import Client
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
)
from opentelemetry.trace import Link, SpanKind
from opentelemetry.util.types import Attributes

from crr.bus import tracing
from crr.bus.outbox import Outbox
from crr.producers.agent import Agent
from crr.projector.service import Projector
from crr.schemas.codec import encode
from crr.schemas.subjects import CATALOG, EVENTS_STREAM, event_subject, subject_template
from crr.view.scheduler_view import SchedulerView
from tests.support.agent import HOST, SAFE_ENV, good_catalog


class _Switch(Sampler):
    """Root sampler: record everything while `on`, nothing otherwise."""

    on = False

    def should_sample(  # noqa: PLR0917 - the SDK's Sampler signature
        self, parent_context: otel_context.Context | None, trace_id: int, name: str,
        kind: SpanKind | None = None, attributes: Attributes = None,
        links: Sequence[Link] | None = None, trace_state: trace.TraceState | None = None,
    ) -> SamplingResult:
        """Sample when switched on."""
        return SamplingResult(Decision.RECORD_AND_SAMPLE if self.on else Decision.DROP,
                              attributes if self.on else None)

    def get_description(self) -> str:
        """Name shown by the SDK."""
        return "TestSwitch"


class _Signal(SpanProcessor):
    """Sets an asyncio event whenever a span ends, so tests wait on spans, not on time."""

    def __init__(self) -> None:
        self.ended = asyncio.Event()

    def on_end(self, span: ReadableSpan) -> None:
        """Wake the waiting test."""
        self.ended.set()


_SWITCH = _Switch()
_EXPORTER = InMemorySpanExporter()
_SIGNAL = _Signal()


def _install() -> None:
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        return
    provider = TracerProvider(sampler=ParentBased(root=_SWITCH))
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    provider.add_span_processor(_SIGNAL)
    trace.set_tracer_provider(provider)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing at 100% for the test's duration; the exporter that receives the spans."""
    _install()
    _EXPORTER.clear()
    _SIGNAL.ended = asyncio.Event()
    _SWITCH.on = True
    try:
        yield _EXPORTER
    finally:
        _SWITCH.on = False
        _EXPORTER.clear()


async def _wait_for_trace(exporter: InMemorySpanExporter, names: list[str],
                          within: float = 15.0) -> list[ReadableSpan]:
    """The spans of the first trace that has every span name in `names` (bounded wait)."""
    async with asyncio.timeout(within):
        while True:
            by_trace: dict[int, list[ReadableSpan]] = {}
            for s in exporter.get_finished_spans():
                assert s.context is not None
                by_trace.setdefault(s.context.trace_id, []).append(s)
            for group in by_trace.values():
                if all(any(s.name == n for s in group) for n in names):
                    return group
            _SIGNAL.ended.clear()
            await _SIGNAL.ended.wait()


@contextlib.asynccontextmanager
async def _pipeline(nc: Client) -> AsyncIterator[tuple[Projector, SchedulerView]]:
    """A ready projector and a ready scheduler view on the test server."""
    stop = asyncio.Event()
    projector = Projector(nc, status_interval=0.5)
    task = asyncio.create_task(projector.run(stop))
    view = SchedulerView(nc)
    try:
        await asyncio.wait_for(projector.ready.wait(), 10)
        await view.start()
        await view.wait_ready(10)
        yield projector, view
    finally:
        await view.stop()
        stop.set()
        await asyncio.wait_for(task, 10)


RUN = "crr.reporter.run"
PUBLISH_REPORT = "publish crr.v1.report.host.{host}.{reporter}"
APPLY_REPORT = "process crr.v1.report.host.{host}.{reporter}"
WRITE_SNAPSHOT = "publish crr.v1.snapshot.host.{host}"
VIEW_UPDATE = "process crr.v1.snapshot.host.{host}"


async def test_one_trace_from_script_run_to_view(
    nc: Client, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    """A report of the real agent is one trace: run → publish → apply → snapshot write → view."""
    async with _pipeline(nc):
        catalog = good_catalog(tmp_path)
        await nc.jetstream().publish(CATALOG, encode(catalog))
        agent = Agent(nc, HOST, tmp_path, environ=SAFE_ENV, kill_grace=0.3, exit_grace=0.2)
        await agent.start()
        try:
            group = await _wait_for_trace(
                spans, [RUN, PUBLISH_REPORT, APPLY_REPORT, WRITE_SNAPSHOT, VIEW_UPDATE])
        finally:
            await agent.stop()
    by_name = {s.name: s for s in group}
    # A chain of parents, each hop the child of the one before.
    chain = [RUN, PUBLISH_REPORT, APPLY_REPORT, WRITE_SNAPSHOT, VIEW_UPDATE]
    for parent, child in itertools.pairwise(chain):
        p, c = by_name[parent], by_name[child]
        assert c.parent is not None
        assert p.context is not None
        assert c.parent.span_id == p.context.span_id, f"{child} is not a child of {parent}"
    assert by_name[PUBLISH_REPORT].kind == SpanKind.PRODUCER
    assert by_name[APPLY_REPORT].kind == SpanKind.CONSUMER
    assert by_name[VIEW_UPDATE].kind == SpanKind.CONSUMER
    run = by_name[RUN].attributes or {}
    assert run["crr.reporter"] == "good"
    assert run["crr.reporter.outcome"] == "ok"
    pub = by_name[PUBLISH_REPORT].attributes or {}
    assert pub["messaging.system"] == "nats"
    assert pub["messaging.destination.name"] == event_subject("report", "good", HOST)
    assert str(pub["messaging.message.id"]).startswith(f"good/{HOST}/")
    apply_attrs = by_name[APPLY_REPORT].attributes or {}
    assert apply_attrs["crr.stream.name"] == EVENTS_STREAM
    assert apply_attrs["crr.stream.sequence"] == pub["crr.stream.sequence"]
    assert apply_attrs["messaging.message.id"] == pub["messaging.message.id"]
    # Low-cardinality names: no host or reporter in any span name.
    assert not any(HOST in s.name or "good" in s.name for s in spans.get_finished_spans())


async def test_unsampled_reports_carry_no_trace_context(nc: Client) -> None:
    """Unsampled (the default): nothing is injected, the stored event has no trace header."""
    _install()
    assert not _SWITCH.on
    outbox = Outbox(nc)
    await outbox.start()
    subject = event_subject("report", "r", "h")
    outbox.put(subject, b'{"reporter":"r"}', msg_id="r/h/b/1")
    await outbox.flush()
    await outbox.close()
    msg = await nc.jetstream().get_last_msg(EVENTS_STREAM, subject)
    assert tracing.TRACEPARENT not in (msg.headers or {})
    assert (msg.headers or {}).get("Nats-Msg-Id") == "r/h/b/1"


def test_destination_templates_hide_hosts_and_reporters() -> None:
    """Span names come from subject templates, so one name serves every host."""
    assert subject_template("crr.v1.report.host.n=2E1.scratch") == \
        "crr.v1.report.host.{host}.{reporter}"
    assert subject_template("crr.v1.health.cluster.flexlm") == \
        "crr.v1.health.cluster.{reporter}"
    assert subject_template("crr.v1.snapshot.host.n1") == \
        "crr.v1.snapshot.host.{host}"
    assert subject_template("crr.v1.catalog") == "crr.v1.catalog"
