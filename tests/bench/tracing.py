"""Tracing overhead: `python -m tests.bench.tracing [--hosts N] [--rounds N] [--repeat N]`.

End to end on an embedded nats-server: `--hosts` × `--rounds` reports, each
put inside a script-run span (as the runner does) through the `Outbox`,
applied by a `Projector`, written to CRR_SNAPSHOT and seen by a
`SchedulerView`; the figure is reports per second from the first put until
the view has the last one.  Three modes, each in its own process (the OTel
provider is process-global):

- `off`: no SDK (crr's default) — the baseline;
- `default`: SDK, `parentbased_traceidratio` at 5% (crr's default when tracing is on);
- `100%`: SDK, every report traced.

With the SDK, spans go through crr's BatchSpanProcessor (`crr.runtime.telemetry`;
`OTEL_BSP_*` apply) to an exporter that drops them (so the cost measured is
crr's and the SDK's, not a backend's).  The summary line puts the overhead
per report at the default sampling beside the overhead at 100%: ideally the
former is the sampling ratio times the latter.
Also per operation, in-process: the µs of one traced `put` (run span +
PRODUCER span + inject) and of one consume (extract + CONSUMER span).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from crr.bus import tracing
from crr.bus.connection import connect
from crr.bus.outbox import Outbox
from crr.bus.server import NatsServer
from crr.bus.streams import provision
from crr.producers.observe import RunObserver
from crr.projector.service import Projector
from crr.runtime.telemetry import DEFAULT_RATIO, batch_span_processor
from crr.schemas.catalog import Catalog, ReporterSpec, ResourceSpec
from crr.schemas.codec import encode
from crr.schemas.subjects import CATALOG, MSG_ID_HEADER, event_subject, msg_id
from crr.schemas.wire_time import format_time
from crr.view.scheduler_view import SchedulerView

MODES = {"off": None, "default": DEFAULT_RATIO, "100%": 1.0}


class _Drop(SpanExporter):
    """Counts and drops spans."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Drop the batch."""
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def _install(ratio: float | None) -> _Drop:
    drop = _Drop()
    if ratio is not None:
        provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
        provider.add_span_processor(batch_span_processor(drop))
        trace.set_tracer_provider(provider)
    return drop


def _catalog() -> Catalog:
    return Catalog(resources={"v": ResourceSpec(kind="numeric", reporter="bench")},
                   reporters={"bench": ReporterSpec(type="external", interval=600.0)})


async def _pipeline(hosts: int, rounds: int) -> float:
    """Reports per second through outbox → projector → snapshot → view."""
    with tempfile.TemporaryDirectory(prefix="crr-bench-tracing-") as store:
        server = NatsServer(store)
        await asyncio.to_thread(server.start)
        try:
            async with connect(server.url, name="bench") as nc:
                await provision(nc)
                await nc.jetstream().publish(CATALOG, encode(_catalog()))
                stop = asyncio.Event()
                projector = Projector(nc, status_interval=0.5)
                task = asyncio.create_task(projector.run(stop))
                await asyncio.wait_for(projector.ready.wait(), 30)
                view = SchedulerView(nc)
                await view.start()
                await view.wait_ready(30)
                outbox = Outbox(nc, window=512)
                await outbox.start()
                observer = RunObserver()
                names = [f"h{i:05d}" for i in range(hosts)]
                started = time.perf_counter()
                for r in range(rounds):
                    now = format_time(time.time())
                    for h in names:
                        with observer.run("bench", h) as record:
                            subject = event_subject("report", "bench", h)
                            body = (b'{"reporter":"bench","host":"%s","boot":"b","seq":%d,'
                                    b'"observed_at":"%s","values":{"v":%d}}'
                                    % (h.encode(), r + 1, now.encode(), r))
                            outbox.put(subject, body, msg_id=msg_id("bench", h, "b", r + 1))
                            record("ok", 0)
                    await outbox.flush(60)
                last = (await nc.jetstream().stream_info("CRR_EVENTS")).state.last_seq
                await view.wait_until(last, 120)
                elapsed = time.perf_counter() - started
                await outbox.close()
                await view.stop()
                stop.set()
                await asyncio.wait_for(task, 30)
        finally:
            await asyncio.to_thread(server.stop)
    return hosts * rounds / elapsed


def _micro(n: int) -> tuple[float, float]:
    """(µs per traced put path, µs per consume) in this process's mode."""
    observer = RunObserver()
    subject = event_subject("report", "bench", "h1")
    t0 = time.perf_counter()
    carried: dict[str, str] = {}
    for i in range(n):
        with observer.run("bench", "h1") as record:
            hdrs = {MSG_ID_HEADER: msg_id("bench", "h1", "b", i)}
            span = tracing.start_publish(subject, hdrs, size=100)
            tracing.end_publish(span, seq=i)
            record("ok", 0)
            if span is not None:
                carried = hdrs
    put_us = (time.perf_counter() - t0) / n * 1e6
    hdrs = carried or {MSG_ID_HEADER: "x"}
    t0 = time.perf_counter()
    for i in range(n):
        if tracing.is_traced(hdrs):
            with tracing.consume(subject, hdrs, seq=i, stream="CRR_EVENTS", size=100):
                tracing.current_span_context()
    consume_us = (time.perf_counter() - t0) / n * 1e6
    return put_us, consume_us


def _child(mode: str, hosts: int, rounds: int) -> dict[str, float]:
    drop = _install(MODES[mode])
    rate = asyncio.run(_pipeline(hosts, rounds))
    put_us, consume_us = _micro(20000)
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.force_flush()
    return {"rate": rate, "put_us": put_us, "consume_us": consume_us, "spans": drop.spans}


def main(argv: list[str] | None = None) -> int:
    """Run each mode `--repeat` times in child processes; print figures beside the baseline."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--child", choices=list(MODES), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.hosts, args.rounds)))
        return 0
    results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for _ in range(args.repeat):
        for mode in MODES:  # interleaved, so drift hits every mode alike
            out = subprocess.run(
                [sys.executable, "-m", "tests.bench.tracing", "--child", mode,
                 "--hosts", str(args.hosts), "--rounds", str(args.rounds)],
                check=True, capture_output=True, text=True)
            results[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
           for m, rs in results.items()}
    base = med["off"]
    n = args.hosts * args.rounds
    print(f"tracing overhead: {n} reports ({args.hosts} hosts x {args.rounds} rounds), "
          f"median of {args.repeat} run(s) per mode, each in its own process")
    print(f"{'mode':<9}{'reports/s':>11}{'vs off':>9}{'put µs':>9}{'vs off':>9}"
          f"{'consume µs*':>12}{'spans':>8}")
    for mode, m in med.items():
        print(f"{mode:<9}{m['rate']:>11.0f}{m['rate'] / base['rate']:>9.2f}"
              f"{m['put_us']:>9.2f}{m['put_us'] / base['put_us']:>9.2f}"
              f"{m['consume_us']:>12.2f}{m['spans']:>8.0f}")
    per_report = {m: 1e6 / v["rate"] for m, v in med.items()}  # µs per report, end to end
    over = {m: per_report[m] - per_report["off"] for m in ("default", "100%")}
    print(f"overhead per report: default {over['default']:.1f} µs, 100% {over['100%']:.1f} µs; "
          f"default/100% = {over['default'] / over['100%']:.3f} (sampling ratio "
          f"{DEFAULT_RATIO:g})")
    print("reports/s: end to end (outbox → projector → snapshot → view); 'vs off' = ratio "
          "to the no-SDK baseline measured in the same run; *per traced message (an "
          "untraced one costs one dict lookup)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
