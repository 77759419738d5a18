"""Agent overhead: `python -m tests.bench.agent [--reporters 20] [--interval 1] [--duration 20]`.

Runs the real `crr agent` (a separate process, started through the CLI)
against an embedded nats-server with `--reporters` periodic script
reporters at `--interval`, for `--duration` seconds, and measures:

* the agent's own CPU share — utime+stime of the agent process from
  `/proc/<pid>/stat`, which excludes its reaped children, i.e. the
  scripts — over the measured window (after a warm-up);
* its RSS (now and peak, from `/proc/<pid>/status`);
* spawn-to-publish latency: each script prints bash's `$EPOCHREALTIME`
  (taken right after exec, with no extra fork); the bench receives the
  report on a core-NATS subscription and takes the difference — spawn,
  script, pipe, parse, encode, JetStream publish and delivery;
* the agent's publish path alone: receipt time minus the report's
  `observed_at` (millisecond precision).

Baseline, in the same run: an idle nats-py client process connected to the
same server (the floor any Python agent pays).  Goals: agent RSS <= 60 MB,
CPU <= 3 % of one core.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nats
from nats.aio.msg import Msg

from crr.bus.server import NatsServer
from crr.bus.streams import provision
from crr.projections.percentile import percentiles
from crr.schemas.catalog import Catalog, ReporterSpec, ResourceSpec
from crr.schemas.codec import decode, encode
from crr.schemas.events import Report
from crr.schemas.subjects import REPORTS, SNAPSHOT_CATALOG
from crr.schemas.wire_time import parse_time

SCRIPT = """#!/bin/bash
printf '{"values": {"%s_t0": %s}}\\n' "$CRR_REPORTER" "$EPOCHREALTIME"
"""

IDLE_CLIENT = """
import asyncio, sys, nats
async def main():
    nc = await nats.connect(sys.argv[1])
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Usage:
    """CPU seconds (own, not children's) and memory of a process at one moment."""

    at: float
    cpu: float
    rss_mb: float
    hwm_mb: float


def usage(pid: int) -> Usage:
    """Read /proc/<pid>/stat and /proc/<pid>/status."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (not cutime/cstime)
    mem = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            mem[key] = int(value.split()[0]) / 1024
    return Usage(time.monotonic(), cpu, mem["VmRSS"], mem["VmHWM"])


def share(a: Usage, b: Usage) -> float:
    """CPU share of one core between two samples, in percent."""
    return 100.0 * (b.cpu - a.cpu) / (b.at - a.at)


def bench_catalog(n: int, interval: float) -> Catalog:
    """`n` periodic reporters `r00`… each owning one numeric resource."""
    resources = {f"r{i:02d}_t0": ResourceSpec(kind="numeric", reporter=f"r{i:02d}")
                 for i in range(n)}
    reporters = {f"r{i:02d}": ReporterSpec(command=["bench.sh"], interval=interval,
                                           timeout=max(1.0, interval))
                 for i in range(n)}
    return Catalog(resources=resources, reporters=reporters)


async def bench(n: int, interval: float, duration: float, warmup: float) -> int:
    """Run the measurement and print the table; non-zero if a goal is missed."""
    if shutil.which("bash") is None:
        print("bench needs bash (for $EPOCHREALTIME)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="crr-bench-") as tmp, \
            NatsServer(Path(tmp) / "store") as server:
        script = Path(tmp) / "bench.sh"
        script.write_text(SCRIPT)
        script.chmod(0o755)
        nc = await nats.connect(server.url)
        await provision(nc)
        latencies: list[float] = []
        publish_path: list[float] = []
        measuring = False

        async def on_report(msg: Msg) -> None:
            received = time.time()
            report = decode(msg.data, Report)
            t0 = next(iter(report.values.values()))
            if measuring and isinstance(t0, float):
                latencies.append(received - t0)
                publish_path.append(received - parse_time(report.observed_at))

        await nc.subscribe(REPORTS, cb=on_report)
        await nc.jetstream().publish(SNAPSHOT_CATALOG, encode(bench_catalog(n, interval)))

        env = {**os.environ, "NATS_URL": server.url}
        idle = await asyncio.create_subprocess_exec(
            sys.executable, "-c", IDLE_CLIENT, server.url, stdout=asyncio.subprocess.PIPE,
            env=env)
        agent = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "crr.cli", "agent", "--host", "bench",
            "--reporters-dir", tmp, "--server", server.url, env=env)
        try:
            assert idle.stdout is not None
            await idle.stdout.readline()  # "ready": connected
            await asyncio.sleep(warmup)  # a benchmark window, not synchronisation
            measuring = True
            a0, i0 = usage(agent.pid), usage(idle.pid)
            await asyncio.sleep(duration)
            measuring = False
            a1, i1 = usage(agent.pid), usage(idle.pid)
        finally:
            stop_started = time.monotonic()
            agent.send_signal(signal.SIGTERM)
            try:
                agent_rc = await asyncio.wait_for(agent.wait(), 15)
            except TimeoutError:
                agent.kill()
                agent_rc = await agent.wait()
            stop_took = time.monotonic() - stop_started
            idle.kill()
            await idle.wait()
            await nc.drain()

    expected = n * duration / interval
    agent_cpu, idle_cpu = share(a0, a1), share(i0, i1)
    print(f"crr agent benchmark: {n} periodic reporters every {interval:g}s, "
          f"measured {duration:g}s after {warmup:g}s warm-up, {os.cpu_count()} CPU(s)")
    print(f"{'':28}{'agent':>12}{'idle nats-py client':>22}")
    print(f"{'CPU, % of one core':28}{agent_cpu:>12.2f}{idle_cpu:>22.2f}")
    print(f"{'RSS now, MB':28}{a1.rss_mb:>12.1f}{i1.rss_mb:>22.1f}")
    print(f"{'RSS peak, MB':28}{a1.hwm_mb:>12.1f}{i1.hwm_mb:>22.1f}")
    if latencies:
        print(f"reports received: {len(latencies)} of ~{expected:.0f} expected")
        p50, p99 = percentiles(latencies, (50, 99))
        print(f"spawn-to-publish latency ms: p50 {p50 * 1000:.1f}  p99 {p99 * 1000:.1f}  "
              f"max {max(latencies) * 1000:.1f}  mean {statistics.fmean(latencies) * 1000:.1f}")
        if publish_path:
            p50, p99 = percentiles(publish_path, (50, 99))
            print(f"observed_at-to-received ms: p50 {p50 * 1000:.1f}  p99 {p99 * 1000:.1f}  "
                  "(observed_at has ms precision)")
    else:
        print("no reports received")
    print(f"agent stop (SIGTERM): exit {agent_rc} after {stop_took:.2f}s")
    ok = agent_cpu <= 3.0 and a1.hwm_mb <= 60.0 and agent_rc == 0 and bool(latencies)
    print("goals (RSS <= 60 MB, CPU <= 3 %):", "met" if ok else "NOT met")
    return 0 if ok else 1


def main() -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(prog="python -m tests.bench.agent", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reporters", type=int, default=20)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--warmup", type=float, default=3.0)
    args = p.parse_args()
    return asyncio.run(bench(args.reporters, args.interval, args.duration, args.warmup))


if __name__ == "__main__":
    sys.exit(main())
