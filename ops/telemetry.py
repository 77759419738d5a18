"""Installing OpenTelemetry SDK providers from the standard `OTEL_*` environment (composition root).

Off by default: with `OTEL_TRACES_EXPORTER` and `OTEL_METRICS_EXPORTER`
unset (or `none`) nothing is installed and every span and instrument in
crr stays the API's no-op.

- `OTEL_TRACES_EXPORTER` / `OTEL_METRICS_EXPORTER`: `console`, `otlp`, `none`
  (comma-separated lists allowed).  `otlp` needs the optional
  `opentelemetry-exporter-otlp` package (`pip install 'crr[otlp]'`);
  `OTEL_EXPORTER_OTLP_PROTOCOL` picks `http/protobuf` (default) or `grpc`,
  and the exporters read their own `OTEL_EXPORTER_OTLP_*` settings.
- `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`: as the SDK defines them.
  Unset, crr samples `parentbased_traceidratio` at `DEFAULT_RATIO` (5%): the
  decision is taken where a trace starts (the reporter's run or publish),
  and the projector and view only continue sampled traces.
  For the ratio samplers the decision costs an unsampled report no span at
  all (see `bus.tracing`).
- `OTEL_BSP_*`: as usual, except that the span queue defaults to
  `DEFAULT_BSP_QUEUE` (see `batch_span_processor`).
- `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SDK_DISABLED`,
  `OTEL_METRIC_EXPORT_INTERVAL`: as usual.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from typing import Any, Final

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased

from schemas.errors import CrrError

DEFAULT_RATIO: Final = 0.05
"""Share of reports traced when `OTEL_TRACES_SAMPLER` is unset."""

DEFAULT_BSP_QUEUE: Final = 8192
"""Spans the BatchSpanProcessor holds when `OTEL_BSP_MAX_QUEUE_SIZE` is unset."""

_OTLP_HINT: Final = ("needs the OTLP exporter: pip install 'crr[otlp]' "
                     "(opentelemetry-exporter-otlp)")


def _names(environ: Mapping[str, str], var: str) -> list[str]:
    raw = environ.get(var, "none")
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n not in ("console", "otlp", "none")]
    if unknown:
        raise CrrError(f"{var}={raw}: unsupported exporter {unknown[0]!r} "
                       "(crr knows console, otlp, none)")
    return [n for n in names if n != "none"]


def _otlp(kind: str, environ: Mapping[str, str]) -> Any:
    """The OTLP exporter class for `kind` ("trace" or "metric"), by OTEL_EXPORTER_OTLP_PROTOCOL."""
    protocol = environ.get(f"OTEL_EXPORTER_OTLP_{kind.upper()}S_PROTOCOL",
                           environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"))
    transport = "grpc" if protocol == "grpc" else "http"
    module = f"opentelemetry.exporter.otlp.proto.{transport}.{kind}_exporter"
    cls = "OTLPSpanExporter" if kind == "trace" else "OTLPMetricExporter"
    try:
        mod = __import__(module, fromlist=[cls])
    except ImportError:
        var = "OTEL_TRACES_EXPORTER" if kind == "trace" else "OTEL_METRICS_EXPORTER"
        raise CrrError(f"{var}=otlp ({protocol}) {_OTLP_HINT}") from None
    return getattr(mod, cls)


def _sampler(environ: Mapping[str, str]) -> Sampler | None:
    """None lets the SDK read OTEL_TRACES_SAMPLER; else crr's default ratio."""
    if environ.get("OTEL_TRACES_SAMPLER"):
        return None
    return ParentBased(TraceIdRatioBased(DEFAULT_RATIO))


def batch_span_processor(
    exporter: SpanExporter, environ: Mapping[str, str] | None = None,
) -> BatchSpanProcessor:
    """A BatchSpanProcessor keeping export off the hot path: `OTEL_BSP_*` as set, else crr's.

    Ending a span only appends it to a queue; a worker thread exports it in
    batches.  crr's defaults differ from the SDK's in the queue size only
    (`OTEL_BSP_MAX_QUEUE_SIZE`, 8192 instead of 2048): at 100% sampling a
    burst of reports ends thousands of spans in a second, and a full queue
    drops each further span with a logged warning — on the hot path.
    """
    env = os.environ if environ is None else environ
    queue = None if env.get("OTEL_BSP_MAX_QUEUE_SIZE") else DEFAULT_BSP_QUEUE
    return BatchSpanProcessor(exporter, max_queue_size=queue)


def configure_telemetry(
    service_name: str, environ: Mapping[str, str] | None = None,
) -> Callable[[], None]:
    """Install trace and metric providers as `OTEL_*` asks; returns the shutdown function.

    Call once per process, before any span is started (the CLI does, for
    every command).  Raises CrrError for an exporter crr cannot provide.
    """
    env = os.environ if environ is None else environ
    shutdowns: list[Callable[[], object]] = []
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return lambda: None
    trace_exporters = _names(env, "OTEL_TRACES_EXPORTER")
    metric_exporters = _names(env, "OTEL_METRICS_EXPORTER")
    if not trace_exporters and not metric_exporters:
        return lambda: None
    attrs = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": service_name}
    resource = Resource.create(attrs)
    if trace_exporters:
        tracer_provider = TracerProvider(resource=resource, sampler=_sampler(env))
        for name in trace_exporters:
            span_exporter: SpanExporter = (ConsoleSpanExporter() if name == "console"
                                           else _otlp("trace", env)())
            tracer_provider.add_span_processor(batch_span_processor(span_exporter, env))
        trace.set_tracer_provider(tracer_provider)
        shutdowns.append(tracer_provider.shutdown)
    if metric_exporters:
        readers = []
        for name in metric_exporters:
            metric_exporter: MetricExporter = (ConsoleMetricExporter() if name == "console"
                                               else _otlp("metric", env)())
            readers.append(PeriodicExportingMetricReader(metric_exporter))
        meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        metrics.set_meter_provider(meter_provider)
        shutdowns.append(meter_provider.shutdown)

    def shutdown() -> None:
        for fn in shutdowns:
            with contextlib.suppress(Exception):  # exporting is best effort at exit
                fn()

    return shutdown
