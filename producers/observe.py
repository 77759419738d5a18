"""What the agent tells OpenTelemetry about its script runs: a span per run, run metrics.

`RunObserver` is the runner's optional hook (`ReporterRunner(observer=…)`):
`run()` wraps one periodic run in the span a report's trace starts from
(`crr.reporter.run`, with the duration, outcome and exit code; the sampling
decision is taken there, once, and an unsampled run creates no span), and counts
the run; `health()` follows the reporter's lifecycle (state gauge,
transitions, restarts).  Stream-mode scripts get no run span (a stream
lives for days; each of its reports starts its own trace at the publish).

Everything goes through the OTel API: with no SDK configured (the default)
the spans and instruments are no-ops.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final

from opentelemetry import metrics
from opentelemetry.metrics import MeterProvider

from crr.bus import tracing

RUN_SPAN: Final = "crr.reporter.run"

RecordOutcome = Callable[[str, int | None], None]
"""`record(state, exit_code)`: how the run ended (a Health state)."""

_DURATION_BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class RunObserver:
    """Spans and metrics of one agent's script runs (see module doc)."""

    def __init__(self, meter_provider: MeterProvider | None = None) -> None:
        meter = (meter_provider or metrics.get_meter_provider()).get_meter("crr.agent")
        self._runs = meter.create_counter(
            "crr.reporter.runs", unit="{run}", description="Script runs by outcome")
        self._duration = meter.create_histogram(
            "crr.reporter.run.duration", unit="s", description="Wall time of a script run",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS)
        self._restarts = meter.create_counter(
            "crr.reporter.restarts", unit="{restart}",
            description="Stream scripts restarted after they ended")
        self._transitions = meter.create_counter(
            "crr.reporter.transitions", unit="{transition}",
            description="Reporter lifecycle (Health) state changes")
        self._state = meter.create_gauge(
            "crr.reporter.state", unit="1",
            description="1 for the current lifecycle state of each reporter, else 0")
        self._current: dict[str, str] = {}

    @contextmanager
    def run(self, reporter: str, host: str, *, traced: bool = True) -> Iterator[RecordOutcome]:
        """Wrap one run; call the yielded `record(state, exit_code)` once it is judged."""
        started = time.perf_counter()
        outcome: list[tuple[str, int | None]] = []

        def record(state: str, exit_code: int | None) -> None:
            outcome.append((state, exit_code))

        if not traced:
            yield record
        else:
            # The report's sampling decision: unsampled (most runs) creates nothing.
            with tracing.root_span(
                    RUN_SPAN, lambda: {"crr.reporter": reporter, "crr.host": host}) as span:
                yield record
                if outcome and span is not None:
                    state, code = outcome[-1]
                    span.set_attribute("crr.reporter.outcome", state)
                    if code is not None:
                        span.set_attribute("process.exit.code", code)
                    if state not in ("ok", "not_applicable"):
                        span.set_status(tracing.Status(tracing.StatusCode.ERROR, state))
        attrs = {"crr.reporter": reporter}
        self._duration.record(time.perf_counter() - started, attrs)
        state = outcome[-1][0] if outcome else "cancelled"
        self._runs.add(1, {**attrs, "crr.reporter.outcome": state})

    def health(self, reporter: str, state: str) -> None:
        """The reporter's lifecycle state changed to `state`."""
        old = self._current.get(reporter)
        if old is not None:
            self._state.set(0, {"crr.reporter": reporter, "crr.reporter.state": old})
        self._current[reporter] = state
        self._state.set(1, {"crr.reporter": reporter, "crr.reporter.state": state})
        self._transitions.add(1, {"crr.reporter": reporter, "crr.reporter.state": state})
        if state == "restarting":
            self._restarts.add(1, {"crr.reporter": reporter})
