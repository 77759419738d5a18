"""W3C trace context in NATS headers: the only place crr injects or extracts it.

One trace per report: the script run (a span the runner opens) → the
publish (a PRODUCER span whose context travels in the `traceparent` header
of the stored event) → the projector's apply (a CONSUMER span, child of
that context, carrying the event's stream sequence) → the snapshot write
(a PRODUCER span whose context travels in the snapshot record's headers) →
the scheduler view's update (a CONSUMER span again).

Sampling happens once, where the trace starts (`root_span`, or a publish
outside one), and an unsampled report costs next to nothing: for the
standard ratio samplers (`traceidratio`, `parentbased_traceidratio`, crr's
default) the decision is the SDK's own rule taken up front — draw the trace
id, sample iff its low 64 bits are below the sampler's bound — and only a
sampled report makes a span (started with that very trace id, so the SDK's
sampler agrees).  An unsampled one creates no span, no OTel context, no
attributes: the block is marked unsampled (one ContextVar) and publishes
inside it return at once.  Other samplers are asked through the SDK, once
per report.  Only a *sampled* context is injected, and consumers open a
span only for a message that carries one, so an unsampled report costs the
rest of the pipeline one dict lookup.  With no SDK configured (the
default) every helper here returns at once.

Span names are low-cardinality: `publish crr.v1.report.host.{host}.{reporter}`
(the subject *template*); the concrete subject, message id and sequence are
attributes (OTel messaging semantic conventions: `messaging.system`,
`messaging.destination.name`, `messaging.destination.template`,
`messaging.message.id`, `messaging.operation.type` …).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Final

from opentelemetry import trace
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace import Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes

from crr.schemas.subjects import MSG_ID_HEADER, subject_template

__all__ = [
    "Span", "SpanContext", "Status", "StatusCode", "consume", "current_span_context",
    "end_publish", "is_traced", "root_span", "span", "start_publish",
]

TRACEPARENT: Final = "traceparent"

# The proxy tracer resolves the global provider lazily: importing this module
# configures nothing (`crr.runtime.telemetry` installs an SDK provider from OTEL_*).
_tracer = trace.get_tracer("crr.bus")
# W3C only, whatever OTEL_PROPAGATORS says: `traceparent` is part of the wire contract.
_propagator = TraceContextTextMapPropagator()

_UNSAMPLED: ContextVar[bool] = ContextVar("crr_trace_unsampled", default=False)
"""True inside a `root_span` block whose report is not sampled: nothing inside starts a span."""

_ID_LIMIT: Final = TraceIdRatioBased.TRACE_ID_LIMIT


class _PresetTraceId(IdGenerator):
    """The provider's id generator, except that the trace id was drawn up front."""

    def __init__(self, trace_id: int, ids: IdGenerator) -> None:
        self._trace_id = trace_id
        self._ids = ids

    def generate_trace_id(self) -> int:
        """The trace id the sampling decision was taken on."""
        return self._trace_id

    def generate_span_id(self) -> int:
        """As the provider's generator does."""
        return self._ids.generate_span_id()

    def is_trace_id_random(self) -> bool:
        """As the provider's generator says."""
        return self._ids.is_trace_id_random()


def _root_sampler(sampler: Sampler) -> Sampler:
    """What decides for a trace's root: the root of a `ParentBased` (not overridden), else it."""
    if type(sampler).should_sample is ParentBased.should_sample:
        # ParentBased keeps its root private; every SDK version so far names it `_root`.
        root = getattr(sampler, "_root", None)
        if isinstance(root, Sampler):
            return root
    return sampler


class _Sampling:
    """How this process decides whether a new trace is sampled, derived once per provider.

    `never`: no SDK (the default) or a disabled one — no span at all.
    `ratio`: a `TraceIdRatioBased` (or `always_off`: bound 0) root — crr draws the
    trace id and applies the sampler's own rule (`id & 2**64-1 < bound`) before
    any span exists.
    `ask`: any other sampler — the SDK decides when the root span is started.
    """

    def __init__(self, provider: object) -> None:
        self.provider = provider
        self.mode = "never"
        self.bound = 0
        self.tracer: trace.Tracer = _tracer
        self.ids: IdGenerator | None = None
        if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
            return
        if not isinstance(provider, SdkTracerProvider):
            self.mode = "ask"  # another API implementation: let it decide
            return
        tracer = provider.get_tracer("crr.bus")
        if not isinstance(tracer, SdkTracer):
            return  # OTEL_SDK_DISABLED: a no-op tracer
        self.tracer = tracer
        root = _root_sampler(tracer.sampler)
        if root is ALWAYS_OFF:  # a ratio of 0 (a parent, if any, still decides)
            self.mode, self.ids = "ratio", tracer.id_generator
        elif (isinstance(root, TraceIdRatioBased)
              and type(root).should_sample is TraceIdRatioBased.should_sample
              and root.bound <= _ID_LIMIT):  # (at 100% asking the SDK is as cheap)
            self.mode, self.bound, self.ids = "ratio", root.bound, tracer.id_generator
        else:
            self.mode = "ask"

    def root_tracer(self) -> trace.Tracer | None:
        """The tracer to start a new trace's root span with, or None: not sampled."""
        if self.mode == "ratio":
            if trace.get_current_span().get_span_context().is_valid:
                return self.tracer  # not a root after all: the parent decides, in the SDK
            assert self.ids is not None
            trace_id = self.ids.generate_trace_id()  # exactly what the SDK would draw …
            if trace_id & _ID_LIMIT >= self.bound:  # … and TraceIdRatioBased's rule
                return None
            preset = copy.copy(self.tracer)  # the SDK tracer, starting this one trace id
            assert isinstance(preset, SdkTracer)
            preset.id_generator = _PresetTraceId(trace_id, self.ids)
            return preset
        return self.tracer if self.mode == "ask" else None


_sampling = [_Sampling(None)]
"""One-slot cache: the `_Sampling` of the last global tracer provider seen."""


def _root_tracer() -> trace.Tracer | None:
    """The tracer to start a new trace's root span with, or None: not sampled, start nothing."""
    if _UNSAMPLED.get():
        return None  # the report's decision was taken already
    provider = trace.get_tracer_provider()
    s = _sampling[0]
    if s.provider is not provider:
        s = _sampling[0] = _Sampling(provider)
    return s.root_tracer()


def _messaging(subject: str, operation: str, op_type: str) -> dict[str, str]:
    return {
        "messaging.system": "nats",
        "messaging.operation.name": operation,
        "messaging.operation.type": op_type,
        "messaging.destination.name": subject,
        "messaging.destination.template": subject_template(subject),
    }


def start_publish(
    subject: str, headers: dict[str, str], *, parent: SpanContext | None = None,
    size: int | None = None,
) -> Span | None:
    """Open a PRODUCER span for a publish and inject its context into `headers`.

    The parent is `parent` if given, else the current span (the script run),
    else none (the span is a root and the sampler decides).  Returns None,
    and leaves `headers` alone, when the span is not sampled (or no SDK is
    configured, or the publish is inside an unsampled `root_span`); otherwise
    the caller ends the span with `end_publish`.
    """
    if parent is not None:
        ctx = trace.set_span_in_context(trace.NonRecordingSpan(parent))
        span = _tracer.start_span(f"publish {subject_template(subject)}", context=ctx,
                                  kind=SpanKind.PRODUCER)
    else:
        tracer = _root_tracer()
        if tracer is None:
            return None
        span = tracer.start_span(f"publish {subject_template(subject)}",
                                 kind=SpanKind.PRODUCER)
    if not span.is_recording():
        span.end()
        return None
    span.set_attributes(_messaging(subject, "publish", "send"))
    msg_id = headers.get(MSG_ID_HEADER)
    if msg_id is not None:
        span.set_attribute("messaging.message.id", msg_id)
    if size is not None:
        span.set_attribute("messaging.message.body.size", size)
    _propagator.inject(headers, context=trace.set_span_in_context(span))
    return span


def end_publish(
    span: Span | None, *, seq: int | None = None, error: BaseException | str | None = None,
    outcome: str | None = None,
) -> None:
    """End a span from `start_publish`: with the stored sequence, or the error, or an outcome.

    `outcome` names an end that is neither (`superseded`, `dropped`, `unsent`).
    """
    if span is None:
        return
    if seq is not None:
        span.set_attribute("crr.stream.sequence", seq)
    if outcome is not None:
        span.set_attribute("crr.outbox.outcome", outcome)
    if error is not None:
        if isinstance(error, BaseException):
            span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, str(error)))
    span.end()


def is_traced(headers: Mapping[str, str] | None) -> bool:
    """Whether a stored message carries a (sampled) trace context: one dict lookup."""
    return headers is not None and TRACEPARENT in headers


@contextmanager
def consume(
    subject: str, headers: Mapping[str, str], *, seq: int, stream: str, size: int,
) -> Iterator[Span]:
    """A CONSUMER span, child of the context in `headers`, current while the handler runs."""
    parent = _propagator.extract(headers)
    attributes: dict[str, str | int] = {
        **_messaging(subject, "process", "process"),
        "crr.stream.name": stream,
        "crr.stream.sequence": seq,
        "messaging.message.body.size": size,
    }
    msg_id = headers.get(MSG_ID_HEADER)
    if msg_id is not None:
        attributes["messaging.message.id"] = msg_id
    with _tracer.start_as_current_span(
        f"process {subject_template(subject)}", context=parent, kind=SpanKind.CONSUMER,
        attributes=attributes,
    ) as span:
        yield span


def current_span_context() -> SpanContext | None:
    """The current span's context if it is being recorded (so a later write can continue it)."""
    span = trace.get_current_span()
    return span.get_span_context() if span.is_recording() else None


@contextmanager
def root_span(
    name: str, attributes: Callable[[], Attributes] | None = None,
) -> Iterator[Span | None]:
    """Where a report's trace starts (e.g. the script run): the sampling decision, once.

    Sampled: yields the recording INTERNAL span, current while the block runs
    (publishes inside are its children), with `attributes()` set on it.
    Unsampled: yields None having created nothing — no span, no context, and
    `attributes` is never called — and publishes inside the block start no
    span either (they return at once).
    """
    tracer = _root_tracer()
    span = (None if tracer is None
            else tracer.start_span(name, attributes=attributes() if attributes else None))
    if span is None or not span.is_recording():
        token = _UNSAMPLED.set(True)
        try:
            yield None
        finally:
            _UNSAMPLED.reset(token)
        return
    with trace.use_span(span, end_on_exit=True):
        yield span


@contextmanager
def span(name: str, attributes: Mapping[str, str | int | float | bool] | None = None,
         ) -> Iterator[Span]:
    """An INTERNAL span made current (e.g. the script run a report comes from)."""
    with _tracer.start_as_current_span(name, attributes=attributes) as s:
        yield s
