"""A bridge's own health in `crr health` and its metrics.

**Health**: the bridge publishes Health events as reporter `bridge-<door>`
(`crr.v1.health.host.<host>.bridge-<door>` for a per-host door,
`crr.v1.health.cluster.bridge-<door>` for a whole-cluster one) on every change of
its state — `ok`, or `failed` with the last target error, an `exports:` that no
longer type-checks, or nodes the target does not know, in `detail` — so `crr
health` lists it like any reporter.  It also publishes an empty Report every
`HEARTBEAT` seconds so the projector does not mark it `silent` while it runs;
when the bridge stops, it turns `silent` (failing) after the reporter lifetime.

**Metrics** (OTel, meter `crr.bridge`, attribute `crr.bridge.door`):
`crr.bridge.applied` (node changes accepted by the target), `crr.bridge.errors`
(failed target commands and node failures), `crr.bridge.calls` (target commands),
`crr.bridge.lag` (s from a snapshot change to the target showing it),
`crr.bridge.unknown_nodes`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Final

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

from crr.bridges.engine import Engine, Planner
from crr.producers.external import ExternalPublisher
from crr.schemas.events import HealthState

HEARTBEAT: Final = 15.0
"""Seconds between a bridge's empty reports (a reporter owning no resource is silent
after 45 s without one)."""


def health_of(engine: Engine, planner: Planner | None) -> tuple[HealthState, str | None]:
    """The bridge's Health state and detail from what its engine and planner say."""
    problems: list[str] = []
    if engine.stats.failures and engine.stats.last_error:
        problems.append(f"target failing ({engine.stats.failures} cycle(s)): "
                        f"{engine.stats.last_error}")
    if planner is not None and planner.problem:
        problems.append(planner.problem)
    if engine.stats.unknown:
        nodes = sorted(engine.stats.unknown)
        more = f" and {len(nodes) - 5} more" if len(nodes) > 5 else ""
        problems.append(f"unknown to the target: {', '.join(nodes[:5])}{more}")
    if problems:
        return "failed", "; ".join(problems)[:1000]
    return "ok", None


class BridgeHealth:
    """Publishes the bridge's health (see module doc); call `cycle` after each pass."""

    def __init__(self, reporter: ExternalPublisher | None, host: str | None,
                 planner: Planner | None) -> None:
        self.reporter = reporter
        self.host = host
        self.planner = planner
        self.said: tuple[HealthState, str | None] | None = None
        self._beat = 0.0

    def cycle(self, engine: Engine) -> None:
        """Say the state when it changed, and beat when due."""
        state = health_of(engine, self.planner)
        if self.reporter is None:
            return
        if state != self.said:
            self.reporter.health(state[0], state[1], host=self.host)
            self.said = state
        self.beat()

    def beat(self) -> None:
        """An empty report when `HEARTBEAT` passed since the last one."""
        now = time.time()
        if self.reporter is not None and now - self._beat >= HEARTBEAT:
            self.reporter.report({}, host=self.host)
            self._beat = now


class BridgeMetrics:
    """The bridge's OTel instruments, observed from its engine's stats on collection."""

    def __init__(self, engine: Engine, meter_provider: MeterProvider | None = None) -> None:
        provider = meter_provider or metrics.get_meter_provider()
        meter = provider.get_meter("crr.bridge")
        attrs = {"crr.bridge.door": engine.door.name}

        def counter(name: str, unit: str, description: str, read: str) -> None:
            def observe(_options: CallbackOptions) -> Iterable[Observation]:
                return [Observation(getattr(engine.stats, read), attrs)]

            meter.create_observable_counter(name, [observe], unit=unit, description=description)

        counter("crr.bridge.applied", "{change}", "Node changes the target accepted", "applied")
        counter("crr.bridge.errors", "{error}", "Failed target commands and node failures",
                "errors")
        counter("crr.bridge.calls", "{call}", "Target commands issued", "calls")
        meter.create_observable_gauge(
            "crr.bridge.lag", [lambda _o: [Observation(engine.stats.lag, attrs)]], unit="s",
            description="Seconds from a snapshot change to the target showing it")
        meter.create_observable_gauge(
            "crr.bridge.unknown_nodes",
            [lambda _o: [Observation(len(engine.stats.unknown), attrs)]], unit="{node}",
            description="Nodes in crr's snapshot the target does not know")
