"""Partitioned projectors: start-up, the position work, and `wait_until` latency.

`python -m tests.bench.partitions [--hosts N] [--probes N]`

The same events (one 20-value report per host: the `tests.bench.fold`
workload) on two embedded servers, one stream unpartitioned and one stored
with `partition(2, host)`:

- start-up: an unpartitioned projector (the baseline) against partition 0
  of 2, which reads every subject (so a host that moved keeps its state)
  and keeps its half;
- position work per status write: unpartitioned, `covered_seq` is its
  written position (no IO); a partition with nothing of its own pending
  reads the stream info and looks up its next event per filter;
- `wait_until` latency: one report at a time, measured from its publish
  until `SchedulerView.wait_until(seq)` returns.  With partitions, the
  partitions the report does not touch must move their `covered_seq`
  past it too, which an idle partition does when its status is due
  (every `--status-interval`) or on a wake-up from another partition's
  status — the figure says which of the two bounds it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from nats.aio.client import Client

from crr.bus.connection import connect
from crr.bus.pipeline_publish import PipelinePublisher
from crr.bus.server import NatsServer
from crr.bus.streams import StreamSettings, provision
from crr.projections.percentile import percentiles
from crr.projector.service import Projector
from crr.schemas.catalog import Catalog
from crr.schemas.codec import encode
from crr.schemas.subjects import CATALOG, event_subject
from crr.view.scheduler_view import SchedulerView
from tests.bench.fold import bench_catalog, payload


async def publish_hosts(nc: Client, hosts: int, catalog: Catalog | None = None) -> None:
    """The catalog (`bench_catalog()` by default), then one report per host, acked."""
    await nc.jetstream().publish(CATALOG, encode(catalog or bench_catalog()))
    pipe = PipelinePublisher(nc, max_in_flight=1024)
    await pipe.start()
    try:
        for i in range(hosts):
            host = f"node{i:05d}"
            await pipe.publish(event_subject("report", "bench", host), payload(host, 0))
        await pipe.flush(120.0)
    finally:
        await pipe.close(1.0)


@contextlib.asynccontextmanager
async def running(projectors: list[Projector]) -> AsyncIterator[float]:
    """Run `projectors`; yields the seconds until all were ready."""
    stop = asyncio.Event()
    t = time.perf_counter()
    tasks = [asyncio.create_task(p.run(stop)) for p in projectors]
    try:
        for p in projectors:
            await asyncio.wait_for(p.ready.wait(), 300)
        yield time.perf_counter() - t
    finally:
        stop.set()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 30)


async def coverage_seconds(projector: Projector, rounds: int) -> float:
    """Mean seconds of the position work one status write does (`Position.coverage`)."""
    t = time.perf_counter()
    for _ in range(rounds):
        await projector._pos.coverage()
    return (time.perf_counter() - t) / rounds


async def wait_latencies(nc: Client, probes: int) -> list[float]:
    """Publish `probes` reports one at a time; seconds until the view's wait_until returns."""
    view = SchedulerView(nc)
    await view.start()
    out: list[float] = []
    try:
        await view.wait_ready(60)
        js = nc.jetstream()
        for i in range(probes):
            host = f"node{i:05d}"
            t = time.perf_counter()
            ack = await js.publish(event_subject("report", "bench", host), payload(host, 1 + i))
            await view.wait_until(ack.seq, timeout=30)
            out.append(time.perf_counter() - t)
    finally:
        await view.stop()
    return out


async def bench(hosts: int, probes: int, status_interval: float, store: Path) -> int:
    """Both layouts on their own server; prints each figure beside its baseline."""
    results: dict[str, tuple[float, float, list[float]]] = {}
    for name, n in (("unpartitioned", 1), ("2 partitions", 2)):
        with NatsServer(store / name) as server:
            async with connect(server.url, name=f"bench-{name}") as nc:
                settings = StreamSettings(partitions=n)
                await provision(nc, settings)
                await publish_hosts(nc, hosts)
                first = [Projector(nc, settings=settings, status_interval=status_interval,
                                   partition=None if n == 1 else 0)]
                async with running(first) as startup:
                    cost = await coverage_seconds(first[0], 200)
                fresh = [Projector(nc, settings=settings, status_interval=status_interval,
                                   partition=None if n == 1 else k) for k in range(n)]
                async with running(fresh):
                    latencies = await wait_latencies(nc, probes)
                results[name] = (startup, cost, latencies)
    base_start, base_cost, base_lat = results["unpartitioned"]
    start, cost, lat = results["2 partitions"]
    print(f"hosts {hosts}, probes {probes}, status interval {status_interval:g}s")
    print(f"start-up: partition 0 of 2 {start:.2f} s vs unpartitioned {base_start:.2f} s "
          f"({start / base_start:.2f}x)")
    print(f"position work per status write: partition {cost * 1e3:.2f} ms vs unpartitioned "
          f"{base_cost * 1e6:.1f} us")
    p50s = []
    for label, xs in (("unpartitioned", base_lat), ("2 partitions", lat)):
        p50, p90 = percentiles(xs, (50, 90))
        p50s.append(p50)
        print(f"wait_until latency, {label}: p50 {p50 * 1e3:.1f} ms, "
              f"p90 {p90 * 1e3:.1f} ms, max {max(xs) * 1e3:.1f} ms")
    print(f"wait_until p50 ratio: {p50s[1] / p50s[0]:.1f}x")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point (see the module doc)."""
    p = argparse.ArgumentParser(prog="python -m tests.bench.partitions", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=20_000)
    p.add_argument("--probes", type=int, default=40)
    p.add_argument("--status-interval", type=float, default=1.0)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="crr-bench-partitions-") as tmp:
        return asyncio.run(bench(args.hosts, args.probes, args.status_interval, Path(tmp)))


if __name__ == "__main__":
    sys.exit(main())
