"""The projector's OpenTelemetry metrics: report→snapshot latency, value and reporter census, lag.

Instruments (OTel metrics API; exported only when `crr.runtime.telemetry` installed
an SDK meter provider — otherwise every call below is a no-op and the
per-event hook returns at once):

- `crr.report.snapshot_latency` (histogram, s, per `crr.reporter`): from a
  report's `observed_at` (the reporter's clock) to the end of the snapshot
  write that covers it; `crr.report.store_latency`: `observed_at` to the
  JetStream timestamp (the part spent reaching the stream);
- `crr.values` (gauge, per `crr.value.state` fresh/stale/unknown): values in
  the snapshot; `crr.values.rejected` (gauge, per `crr.reporter`): values
  rejected in each reporter's latest reports, summed over hosts;
- `crr.reporters` (gauge, per `crr.reporter` and `crr.reporter.state`): hosts
  on which the reporter is in that state (ok, failed, silent, rejecting …);
- `crr.projector.lag` (gauge, events not yet applied), `crr.projector.position`,
  `crr.projector.applied`, `crr.projector.deadletters`,
  `crr.projector.snapshot_writes` (counters).

`crr api` has its own (`ViewMetrics`, meter `crr.api`): `crr.view.hosts`,
`crr.view.position` (CRR_SNAPSHOT), `crr.view.projector_position`
(CRR_EVENTS covered), `crr.view.applied` / `crr.view.rejected` (counters),
and the projector's liveness as the view sees it (`crr.projections.freshness`):
`crr.view.projector.status_age` (s since the oldest current status),
`crr.view.projector.lag`, `crr.view.projector.silent` (1 when silent or
absent) — what to alert on.

The census gauges decode what the projector last wrote (minimal structs,
cached for a second), so they cost nothing between collections.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Final, Protocol

import msgspec
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider

from crr.bus import natspy
from crr.schemas.errors import SubjectError
from crr.schemas.snapshot_views import CensusRecord
from crr.schemas.subjects import (
    REPORT_PREFIX,
    parse_event_subject,
    snapshot_kind,
)
from crr.schemas.wire_time import expires_seconds

if TYPE_CHECKING:
    from crr.bus.ordered import StoredMessage
    from crr.projections.freshness import ProjectorLiveness
    from crr.view.scheduler_view import SchedulerView

LATENCY_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                          60.0)


class _Head(msgspec.Struct):
    observed_at: str | None = None


_head = msgspec.json.Decoder(_Head)
_record = msgspec.json.Decoder(CensusRecord)


def _sdk_installed(provider: MeterProvider) -> bool:
    # The API's default provider is a proxy over a no-op; only an SDK provider exports.
    return isinstance(provider, SdkMeterProvider)


class MeteredProjector(Protocol):
    """What the metrics read of a projector (`crr.projector.Projector` is one): this
    port keeps `crr.metrics` from importing the projector that imports it."""

    @property
    def lag(self) -> int:
        """Events not yet delivered."""

    @property
    def position(self) -> int:
        """Last CRR_EVENTS sequence reflected in CRR_SNAPSHOT."""

    @property
    def applied(self) -> int:
        """Events applied."""

    @property
    def deadletter_count(self) -> int:
        """Events dead-lettered."""

    @property
    def writes(self) -> int:
        """Records and status records written."""

    def written_records(self) -> list[tuple[str, bytes]]:
        """(subject, bytes) of what CRR_SNAPSHOT holds as the projector wrote it."""


class ProjectorMetrics:
    """Metrics of one projector (see module doc); the projector calls `event` and `flushed`."""

    def __init__(
        self, projector: MeteredProjector, meter_provider: MeterProvider | None = None,
    ) -> None:
        provider = meter_provider or metrics.get_meter_provider()
        self.enabled = _sdk_installed(provider)
        self._projector = projector
        self._pending: list[tuple[str, float]] = []
        self._census_at = 0.0
        self._census: tuple[Counter[str], Counter[tuple[str, str]], Counter[str]] = (
            Counter(), Counter(), Counter())
        meter = provider.get_meter("crr.projector")
        self._latency = meter.create_histogram(
            "crr.report.snapshot_latency", unit="s",
            description="Report observed_at to the end of the snapshot write covering it",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS)
        self._store_latency = meter.create_histogram(
            "crr.report.store_latency", unit="s",
            description="Report observed_at to its JetStream timestamp",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS)
        meter.create_observable_gauge(
            "crr.values", [self._values], unit="{value}",
            description="Values in the snapshot by state (fresh, stale, unknown)")
        meter.create_observable_gauge(
            "crr.values.rejected", [self._rejected], unit="{value}",
            description="Values rejected in each reporter's latest reports, over all hosts")
        meter.create_observable_gauge(
            "crr.reporters", [self._reporters], unit="{host}",
            description="Hosts per reporter and reporter state")
        meter.create_observable_gauge(
            "crr.projector.lag", [lambda _o: [Observation(projector.lag)]], unit="{event}",
            description="CRR_EVENTS messages not yet applied")
        meter.create_observable_gauge(
            "crr.projector.position", [lambda _o: [Observation(projector.position)]],
            unit="{sequence}", description="Last CRR_EVENTS sequence written to CRR_SNAPSHOT")
        meter.create_observable_counter(
            "crr.projector.applied", [lambda _o: [Observation(projector.applied)]],
            unit="{event}", description="Events applied since start")
        meter.create_observable_counter(
            "crr.projector.deadletters", [lambda _o: [Observation(projector.deadletter_count)]],
            unit="{event}", description="Events dead-lettered since start")
        meter.create_observable_counter(
            "crr.nats.fallbacks", [_nats_fallbacks], unit="{time}",
            description="Times a nats-py fast path took nats-py's public path (crr.bus.natspy)")
        meter.create_observable_counter(
            "crr.projector.snapshot_writes", [lambda _o: [Observation(projector.writes)]],
            unit="{record}", description="Snapshot records written since start")

    # -- hooks (hot path: return at once when disabled) -----------------------

    def event(self, m: StoredMessage) -> None:
        """An event was applied: remember a report's reporter and observed time."""
        if not self.enabled or not m.subject.startswith(REPORT_PREFIX):
            return
        try:
            reporter = parse_event_subject(m.subject).reporter
            head = _head.decode(m.data)
        except (SubjectError, msgspec.DecodeError, msgspec.ValidationError):
            return
        if head.observed_at is None:
            return
        observed = expires_seconds(head.observed_at)
        attrs = {"crr.reporter": reporter}
        self._store_latency.record(max(0.0, m.time - observed), attrs)
        self._pending.append((reporter, observed))

    def flushed(self, at: float) -> None:
        """The snapshot records covering every applied event were written at `at`."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        for reporter, observed in pending:
            self._latency.record(max(0.0, at - observed), {"crr.reporter": reporter})

    # -- census (observable callbacks) -----------------------------------------

    def _take_census(self) -> tuple[Counter[str], Counter[tuple[str, str]], Counter[str]]:
        now = time.monotonic()
        if now - self._census_at < 1.0:
            return self._census
        values: Counter[str] = Counter()
        reporters: Counter[tuple[str, str]] = Counter()
        rejected: Counter[str] = Counter()
        for subject, data in list(self._projector.written_records()):
            if snapshot_kind(subject) not in ("host", "cluster"):
                continue
            try:
                rec = _record.decode(data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            for v in rec.values.values():
                values[v.state] += 1
            for name, r in rec.reporters.items():
                reporters[(name, r.state)] += 1
                rejected[name] += r.rejected
        self._census = (values, reporters, rejected)
        self._census_at = now
        return self._census

    def _values(self, _options: CallbackOptions) -> Iterable[Observation]:
        values = self._take_census()[0]
        return [Observation(values.get(s, 0), {"crr.value.state": s})
                for s in ("fresh", "stale", "unknown")]

    def _reporters(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"crr.reporter": r, "crr.reporter.state": s})
                for (r, s), n in sorted(self._take_census()[1].items())]

    def _rejected(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"crr.reporter": r})
                for r, n in sorted(self._take_census()[2].items())]


class ViewMetrics:
    """Metrics of the scheduler view behind `crr api` (see module doc): observed on collection."""

    def __init__(self, view: SchedulerView, liveness: Callable[[], ProjectorLiveness],
                 meter_provider: MeterProvider | None = None) -> None:
        provider = meter_provider or metrics.get_meter_provider()
        meter = provider.get_meter("crr.api")

        def gauge(name: str, unit: str, description: str,
                  value: Callable[[], float | None]) -> None:
            def observe(_options: CallbackOptions) -> Iterable[Observation]:
                v = value()
                return [] if v is None else [Observation(v)]

            meter.create_observable_gauge(name, [observe], unit=unit, description=description)

        gauge("crr.view.hosts", "{host}", "Hosts in the view", lambda: len(view.table))
        gauge("crr.view.position", "{sequence}", "Last CRR_SNAPSHOT sequence applied",
              lambda: view.position)
        gauge("crr.view.projector_position", "{sequence}",
              "Every CRR_EVENTS event up to this sequence is in the view",
              lambda: view.projector_position)
        gauge("crr.view.projector.status_age", "s",
              "Seconds since the oldest current projector status",
              lambda: liveness().last_status_age)
        gauge("crr.view.projector.lag", "{event}", "Events the projector(s) had not applied",
              lambda: liveness().lag)
        gauge("crr.view.projector.silent", "1", "1 when the projector is silent or absent",
              lambda: float(liveness().state != "live"))
        meter.create_observable_counter(
            "crr.view.applied", [lambda _o: [Observation(view.applied)]], unit="{record}",
            description="CRR_SNAPSHOT records applied since start")
        meter.create_observable_counter(
            "crr.view.rejected", [lambda _o: [Observation(view.rejected)]], unit="{record}",
            description="CRR_SNAPSHOT records that could not be decoded")


def _nats_fallbacks(_options: CallbackOptions) -> list[Observation]:
    """`crr.nats.fallbacks` per fast path (0 for every path on the fast path)."""
    return [Observation(natspy.fallbacks[path], {"path": path}) for path in natspy.PATHS]
