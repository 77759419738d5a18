"""The Slurm bridge's OpenTelemetry metrics (meter `crr.bridge.slurm`).

Exported only when `crr.runtime.telemetry` installed an SDK meter provider (e.g.
`OTEL_METRICS_EXPORTER=prometheus`); otherwise registering them is a no-op.  All are
read from the bridge's status at collection time, so they cost nothing per cycle:

- `crr.bridge.slurm.changes` (counter): node changes applied (a node × a setting);
- `crr.bridge.slurm.calls`, `crr.bridge.slurm.failed_calls` (counters): `scontrol`/`sinfo`
  runs, and those that failed; `crr.bridge.slurm.failures` (counter): failures of any
  kind (a read or an update);
- `crr.bridge.slurm.healthy` (gauge, 1/0), `crr.bridge.slurm.nodes` (Slurm's nodes),
  `crr.bridge.slurm.unknown_nodes` (snapshot hosts Slurm does not have);
- `crr.bridge.slurm.lag` (gauge, events): CRR_EVENTS sequences the view has that the
  last applied cycle had not — what to alert on with `healthy`.

And on meter `crr.bridge` (attribute `crr.bridge.door=slurm`), the guard's:
`crr.bridge.held` (gauge, nodes whose change the guard holds; > 0 while tripped),
`crr.bridge.pending` (gauge, changes waiting for their `for:`/`resume_after:`/`settle`),
`crr.bridge.tripped` (gauge, 1 while a limit is tripped).
"""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

from crr.bridges.slurm_bridge import SlurmBridge
from crr.projections.guard import GateResult


def register_metrics(bridge: SlurmBridge, meter_provider: MeterProvider | None = None) -> None:
    """Register the bridge's instruments (see the module doc)."""
    meter = (meter_provider or metrics.get_meter_provider()).get_meter("crr.bridge.slurm")
    st = bridge.door.status

    def read(value: Callable[[], float]) -> Callable[[CallbackOptions], list[Observation]]:
        return lambda _options: [Observation(value())]

    counters: list[tuple[str, Callable[[], float], str]] = [
            ("changes", lambda: st.changes, "Node changes applied"),
            ("calls", lambda: st.calls, "scontrol/sinfo runs"),
            ("failed_calls", lambda: st.failed_calls, "scontrol update runs that failed"),
            ("failures", lambda: st.failures, "Failed Slurm reads and updates")]
    for name, value, description in counters:
        meter.create_observable_counter(f"crr.bridge.slurm.{name}", [read(value)],
                                        unit="{call}" if "call" in name else "1",
                                        description=description)
    gauges: list[tuple[str, Callable[[], float], str]] = [
            ("healthy", lambda: float(st.healthy), "1 while Slurm is read and updated fine"),
            ("nodes", lambda: st.nodes, "Nodes Slurm has"),
            ("unknown_nodes", lambda: len(st.unknown_nodes),
             "Snapshot hosts Slurm does not have"),
            ("lag", lambda: max(0, bridge.view.projector_position
                                   - bridge.status.applied_position),
             "CRR_EVENTS sequences not yet reflected in Slurm")]
    for name, value, description in gauges:
        meter.create_observable_gauge(f"crr.bridge.slurm.{name}", [read(value)],
                                      description=description)
    bridges = (meter_provider or metrics.get_meter_provider()).get_meter("crr.bridge")
    attrs = {"crr.bridge.door": "slurm"}

    def gated(value: Callable[[GateResult], float],
              ) -> Callable[[CallbackOptions], list[Observation]]:
        return lambda _o: [Observation(value(bridge.gated) if bridge.gated else 0.0, attrs)]

    bridges.create_observable_gauge("crr.bridge.held", [gated(lambda g: len(g.held))],
                                    unit="{node}", description="Node changes the guard holds")
    bridges.create_observable_gauge("crr.bridge.pending", [gated(lambda g: len(g.pending))],
                                    unit="{change}",
                                    description="Changes waiting for for/resume_after/settle")
    bridges.create_observable_gauge("crr.bridge.tripped", [gated(lambda g: float(bool(g.trips)))],
                                    description="1 while a guard limit is tripped")
