"""The sampling decision taken up front, once per report (`crr.bus.tracing`).

The ratio decision is checked against a local SDK provider (the global one
can be set only once per process; `tests.bus.test_tracing` owns it), the
once-per-report rule against that global provider and its switch sampler.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    ParentBasedTraceIdRatio,
    Sampler,
    TraceIdRatioBased,
)

from crr.bus import tracing
from crr.schemas.subjects import event_subject
from tests.bus.test_tracing import _SWITCH, _install

LIMIT = TraceIdRatioBased.TRACE_ID_LIMIT


@pytest.fixture
def seeded() -> Iterator[None]:
    """A fixed draw for the SDK's RandomIdGenerator (it uses `random`); restored after."""
    state = random.getstate()
    random.seed(6)
    try:
        yield
    finally:
        random.setstate(state)


def _provider(sampler: Sampler) -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@pytest.mark.usefixtures("seeded")
def test_ratio_decision_is_the_samplers_own_rule() -> None:
    """At a ratio, roots are sampled at that rate and the SDK's sampler agrees with each."""
    sampler = ParentBasedTraceIdRatio(0.25)  # what OTEL_TRACES_SAMPLER=parentbased_… builds
    provider, exporter = _provider(sampler)
    sampling = tracing._Sampling(provider)
    assert sampling.mode == "ratio"
    sampled = 0
    for _ in range(4000):
        tracer = sampling.root_tracer()
        if tracer is None:
            continue
        span = tracer.start_span("root")
        assert span.is_recording()  # the SDK's sampler saw the same trace id: sampled
        span.end()
        sampled += 1
    assert 850 < sampled < 1150  # 25% of 4000, well within binomial spread
    ids = [s.context.trace_id for s in exporter.get_finished_spans() if s.context]
    assert len(ids) == sampled
    assert all(t & LIMIT < TraceIdRatioBased(0.25).bound for t in ids)


def test_non_ratio_samplers_are_classified() -> None:
    """always_off never samples without a parent; always_on and 100% let the SDK decide."""
    off = tracing._Sampling(_provider(ParentBased(ALWAYS_OFF))[0])
    assert off.mode == "ratio"
    assert off.bound == 0
    assert off.root_tracer() is None
    assert tracing._Sampling(_provider(ALWAYS_ON)[0]).mode == "ask"
    assert tracing._Sampling(_provider(TraceIdRatioBased(1.0))[0]).mode == "ask"
    assert tracing._Sampling(trace.NoOpTracerProvider()).mode == "never"


@pytest.mark.usefixtures("seeded")
def test_a_sampled_ratio_root_has_sampled_children() -> None:
    """A root sampled up front is current for its block, and a child follows its parent."""
    provider, exporter = _provider(ParentBased(TraceIdRatioBased(0.5)))
    sampling = tracing._Sampling(provider)
    tracer = None
    while tracer is None:
        tracer = sampling.root_tracer()
    root = tracer.start_span("root")
    with trace.use_span(root, end_on_exit=True):
        child_tracer = sampling.root_tracer()  # a parent exists: the SDK decides, by it
        assert child_tracer is not None
        child_tracer.start_span("child").end()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    child_parent = spans["child"].parent
    assert child_parent is not None
    assert child_parent.span_id == root.get_span_context().span_id


def test_the_decision_is_taken_once_per_report() -> None:
    """Inside an unsampled root nothing starts a span, even if the sampler would now say yes."""
    _install()
    subject = event_subject("report", "r", "h")
    try:
        with tracing.root_span("crr.reporter.run", lambda: {"never": "called"}) as run:
            assert run is None
            _SWITCH.on = True
            headers = {"Nats-Msg-Id": "r/h/b/1"}
            assert tracing.start_publish(subject, headers) is None
            assert tracing.TRACEPARENT not in headers
        # Outside it, a new report decides afresh (now sampled).
        headers = {"Nats-Msg-Id": "r/h/b/2"}
        span = tracing.start_publish(subject, headers)
        assert span is not None
        tracing.end_publish(span, seq=1)
        assert tracing.TRACEPARENT in headers
    finally:
        _SWITCH.on = False
