"""Installing OpenTelemetry SDK providers from the standard `OTEL_*` environment (composition root).

Off by default: with `OTEL_TRACES_EXPORTER` and `OTEL_METRICS_EXPORTER`
unset (or `none`) nothing is installed and every span and instrument in
crr stays the API's no-op.

- `OTEL_TRACES_EXPORTER` / `OTEL_METRICS_EXPORTER`: `console`, `otlp`, `none`
  (comma-separated lists allowed).  `otlp` needs the optional
  `opentelemetry-exporter-otlp` package (`pip install 'crr-reporting[otlp]'`);
  `OTEL_EXPORTER_OTLP_PROTOCOL` picks `http/protobuf` (default) or `grpc`,
  and the exporters read their own `OTEL_EXPORTER_OTLP_*` settings.
- `OTEL_METRICS_EXPORTER=prometheus`: the long-running processes (`crr
  projector`, `crr agent`, `crr api`; `serve_metrics=True`) serve their
  metrics for Prometheus to scrape at `http://HOST:PORT/metrics`, HOST and
  PORT from `OTEL_EXPORTER_PROMETHEUS_HOST` (default `localhost`) and
  `OTEL_EXPORTER_PROMETHEUS_PORT` (default 9464; 0 picks a free port), via
  the OpenTelemetry Prometheus exporter (`pip install 'crr-reporting[prometheus]'`).
  They say where on stderr at start.  One-shot commands ignore it (they
  would fight over the port).
- `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`: as the SDK defines them.
  Unset, crr samples `parentbased_traceidratio` at `DEFAULT_RATIO` (5%): the
  decision is taken where a trace starts (the reporter's run or publish),
  and the projector and view only continue sampled traces.
  For the ratio samplers the decision costs an unsampled report no span at
  all (see `crr.bus.tracing`).
- `OTEL_BSP_*`: as usual, except that the span queue defaults to
  `DEFAULT_BSP_QUEUE` (see `batch_span_processor`).
- `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SDK_DISABLED`,
  `OTEL_METRIC_EXPORT_INTERVAL`: as usual.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased

from crr.schemas.distribution import install_hint
from crr.schemas.errors import CrrError

DEFAULT_RATIO: Final = 0.05
"""Share of reports traced when `OTEL_TRACES_SAMPLER` is unset."""

DEFAULT_BSP_QUEUE: Final = 8192
"""Spans the BatchSpanProcessor holds when `OTEL_BSP_MAX_QUEUE_SIZE` is unset."""

_OTLP_HINT: Final = (f"needs the OTLP exporter: {install_hint('otlp')} "
                     "(opentelemetry-exporter-otlp)")
_PROMETHEUS_HINT: Final = ("OTEL_METRICS_EXPORTER=prometheus needs the Prometheus exporter: "
                           f"{install_hint('prometheus')} (opentelemetry-exporter-prometheus)")
DEFAULT_PROMETHEUS_HOST: Final = "localhost"
DEFAULT_PROMETHEUS_PORT: Final = 9464


def _names(environ: Mapping[str, str], var: str) -> list[str]:
    raw = environ.get(var, "none")
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    known = ("console", "otlp", "none", "prometheus") if var == "OTEL_METRICS_EXPORTER" else (
        "console", "otlp", "none")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise CrrError(f"{var}={raw}: unsupported exporter {unknown[0]!r} "
                       f"(crr knows {', '.join(known)})")
    return [n for n in names if n != "none"]


def prometheus_reader(environ: Mapping[str, str], service_name: str) -> tuple[Any, Any]:
    """A PrometheusMetricReader and the HTTP server it is scraped on (see module doc).

    CrrError with a one-line hint when the exporter is not installed, or the
    address is unusable."""
    try:
        from opentelemetry.exporter.prometheus import (  # noqa: PLC0415 - optional extra
            PrometheusMetricReader,
        )
        from prometheus_client import start_http_server  # noqa: PLC0415 - optional extra
    except ImportError:
        raise CrrError(_PROMETHEUS_HINT) from None
    host = environ.get("OTEL_EXPORTER_PROMETHEUS_HOST", "") or DEFAULT_PROMETHEUS_HOST
    raw_port = environ.get("OTEL_EXPORTER_PROMETHEUS_PORT", "") or str(DEFAULT_PROMETHEUS_PORT)
    if not raw_port.isdigit() or int(raw_port) > 65535:
        raise CrrError(f"OTEL_EXPORTER_PROMETHEUS_PORT={raw_port}: expected a port number")
    try:
        server, _ = start_http_server(int(raw_port), addr=host)
    except OSError as exc:
        raise CrrError(f"cannot serve Prometheus metrics on {host}:{raw_port} "
                       f"(OTEL_EXPORTER_PROMETHEUS_HOST/PORT): {exc.strerror or exc}") from None
    shown = f"[{host}]" if ":" in host else host
    print(f"{service_name}: Prometheus metrics on http://{shown}:{server.server_port}/metrics",
          file=sys.stderr, flush=True)
    return PrometheusMetricReader(), server


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
    service_name: str, environ: Mapping[str, str] | None = None, *, serve_metrics: bool = False,
) -> Callable[[], None]:
    """Install trace and metric providers as `OTEL_*` asks; returns the shutdown function.

    Call once per process, before any span is started (the CLI does, for
    every command).  `serve_metrics`: a long-running process, which serves
    Prometheus metrics when asked (one-shot commands do not).  Raises
    CrrError for an exporter crr cannot provide.
    """
    env = os.environ if environ is None else environ
    shutdowns: list[Callable[[], object]] = []
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return lambda: None
    trace_exporters = _names(env, "OTEL_TRACES_EXPORTER")
    metric_exporters = _names(env, "OTEL_METRICS_EXPORTER")
    if not serve_metrics:
        metric_exporters = [n for n in metric_exporters if n != "prometheus"]
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
        readers: list[MetricReader] = []
        for name in metric_exporters:
            if name == "prometheus":
                reader, server = prometheus_reader(env, service_name)
                readers.append(reader)
                shutdowns.append(server.shutdown)
                continue
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
