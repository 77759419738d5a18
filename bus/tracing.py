"""W3C trace context in NATS headers: the only place crr injects or extracts it.

One trace per report: the script run (a span the runner opens) → the
publish (a PRODUCER span whose context travels in the `traceparent` header
of the stored event) → the projector's apply (a CONSUMER span, child of
that context, carrying the event's stream sequence) → the snapshot write
(a PRODUCER span whose context travels in the snapshot record's headers) →
the scheduler view's update (a CONSUMER span again).

Sampling happens where the trace starts, at the reporter: only a *sampled*
context is injected, and consumers open a span only for a message that
carries one, so an unsampled report costs the rest of the pipeline one
dict lookup.  With no SDK configured (the default) every helper here is a
no-op: the OTel API's proxy tracer returns an invalid span at once.

Span names are low-cardinality: `publish crr.v1.report.host.{host}.{reporter}`
(the subject *template*); the concrete subject, message id and sequence are
attributes (OTel messaging semantic conventions: `messaging.system`,
`messaging.destination.name`, `messaging.destination.template`,
`messaging.message.id`, `messaging.operation.type` …).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Final

from opentelemetry import trace
from opentelemetry.trace import Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from bus.subjects import EVENT_TYPES, PREFIX, SNAPSHOT_HOST_PREFIX

__all__ = [
    "Span", "SpanContext", "Status", "StatusCode", "consume", "current_span_context",
    "destination_template", "end_publish", "is_traced", "span", "start_publish",
]

TRACEPARENT: Final = "traceparent"
MSG_ID: Final = "Nats-Msg-Id"

# The proxy tracer resolves the global provider lazily: importing this module
# configures nothing (`ops.telemetry` installs an SDK provider from OTEL_*).
_tracer = trace.get_tracer("crr.bus")
# W3C only, whatever OTEL_PROPAGATORS says: `traceparent` is part of the wire contract.
_propagator = TraceContextTextMapPropagator()


def destination_template(subject: str) -> str:
    """The subject with its host and reporter tokens replaced: a low-cardinality name."""
    parts = subject.split(".")
    if len(parts) >= 5 and parts[0] == "crr" and parts[2] in EVENT_TYPES:
        if parts[3] == "host" and len(parts) == 6:
            return f"{PREFIX}.{parts[2]}.host.{{host}}.{{reporter}}"
        if parts[3] == "cluster" and len(parts) == 5:
            return f"{PREFIX}.{parts[2]}.cluster.{{reporter}}"
    if subject.startswith(SNAPSHOT_HOST_PREFIX):
        return SNAPSHOT_HOST_PREFIX + "{host}"
    return subject


def _messaging(subject: str, operation: str, op_type: str) -> dict[str, str]:
    return {
        "messaging.system": "nats",
        "messaging.operation.name": operation,
        "messaging.operation.type": op_type,
        "messaging.destination.name": subject,
        "messaging.destination.template": destination_template(subject),
    }


def start_publish(
    subject: str, headers: dict[str, str], *, parent: SpanContext | None = None,
    size: int | None = None,
) -> Span | None:
    """Open a PRODUCER span for a publish and inject its context into `headers`.

    The parent is `parent` if given, else the current span (the script run),
    else none (the span is a root and the sampler decides).  Returns None,
    and leaves `headers` alone, when the span is not sampled (or no SDK is
    configured); otherwise the caller ends the span with `end_publish`.
    """
    ctx = (trace.set_span_in_context(trace.NonRecordingSpan(parent))
           if parent is not None else None)
    span = _tracer.start_span(f"publish {destination_template(subject)}", context=ctx,
                              kind=SpanKind.PRODUCER)
    if not span.is_recording():
        span.end()
        return None
    span.set_attributes(_messaging(subject, "publish", "send"))
    msg_id = headers.get(MSG_ID)
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
    msg_id = headers.get(MSG_ID)
    if msg_id is not None:
        attributes["messaging.message.id"] = msg_id
    with _tracer.start_as_current_span(
        f"process {destination_template(subject)}", context=parent, kind=SpanKind.CONSUMER,
        attributes=attributes,
    ) as span:
        yield span


def current_span_context() -> SpanContext | None:
    """The current span's context if it is being recorded (so a later write can continue it)."""
    span = trace.get_current_span()
    return span.get_span_context() if span.is_recording() else None


@contextmanager
def span(name: str, attributes: Mapping[str, str | int | float | bool] | None = None,
         ) -> Iterator[Span]:
    """An INTERNAL span made current (e.g. the script run a report comes from)."""
    with _tracer.start_as_current_span(name, attributes=attributes) as s:
        yield s
