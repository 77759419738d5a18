"""Projector CPU per report: a figure a shared machine cannot fool.

    python -m tests.bench.cpu [--hosts 50000] [--rate 5000] [--rounds 1] [--profile FILE]

Latency and throughput on a 2-core machine shared with other work say more
about the neighbours than about the projector.  CPU seconds do not: this
harness counts the projector process's own CPU time (user + system, from
`/proc/<pid>/stat`) per 10k reports folded and written, at a fixed offered
rate, beside the same figure for the raw relay's middle process
(`tests.bench.relay`: it only republishes each report, padded to a host
record's size) at the same rate, measured in the same run.

One embedded nats-server; `crr projector` as a child process (as in
production and in `crr bench`).  The reports are generated before anything
is timed (`--hosts` simulated hosts with the 20-value catalog of `crr
bench`, 1% silent): a warm-up round (one report per host, published as fast
as the projector takes it, not measured) creates every host's record; then
`--rounds` rounds are published at `--rate` reports/s and the projector's
CPU is read from the first publish until its status covers the last one.
The relay then gets as many fresh reports at the same rate.

`--profile FILE` also records the projector with py-spy during the measured
rounds (collapsed stacks, `--format raw`) and prints where its samples go.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats.js.errors
from nats.aio.client import Client

from crr.bus.connection import connect
from crr.bus.pipeline_publish import PipelinePublisher
from crr.bus.server import NatsServer
from crr.bus.streams import provision
from crr.producers.simulator import Event, Faults, Fleet, sim_catalog
from crr.schemas.codec import encode
from crr.schemas.errors import CrrError
from crr.schemas.subjects import CATALOG, SNAPSHOT_STREAM
from tests.bench.relay import RELAY_STREAM, RelayProcess, provision_relay
from tests.bench.suite import RESOURCES, ProjectorProcess, log, relay_pad, wait_projector

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (its threads included)."""
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of process `pid` so far (its threads included)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS  # utime, stime (fields 14, 15)


def rounds_of(fleet: Fleet, rounds: int) -> list[Event]:
    """The next `rounds` rounds of every host of `fleet`, in host order."""
    out: list[Event] = []
    for _ in range(rounds):
        for i in range(len(fleet)):
            out.extend(fleet.events(i, time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())))
    return out


async def publish_at(nc: Client, msgs: list[Event], rate: float | None) -> int:
    """Publish `msgs` at `rate` per second (None: as fast as acknowledged); the last seq."""
    async with PipelinePublisher(nc) as pipe:
        start = time.monotonic()
        for k, (subject, payload, headers) in enumerate(msgs):
            if rate is not None and k % 64 == 0:
                ahead = start + k / rate - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)
            await pipe.publish(subject, payload, headers)
        await pipe.flush(120)
        return pipe.stats.last_seq


async def relay_done(nc: Client, count: int, timeout: float = 300.0) -> None:
    """Wait until the relay republished `count` messages (its stream's last sequence)."""
    js = nc.jetstream()
    deadline = time.monotonic() + timeout
    while (await js.stream_info(RELAY_STREAM)).state.last_seq < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the relay did not republish {count} messages in {timeout:g}s")
        await asyncio.sleep(0.02)


def profile_summary(path: Path, top: int = 25) -> str:
    """Where py-spy's collapsed stacks (`--format raw`) spend their samples: the share of
    samples each function is on the stack of (inclusive), the `top` first."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        if not stack:
            continue
        count = int(samples)
        total += count
        frames = [f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].rsplit("/", 1)[-1]
                  if " (" in f else f for f in stack.split(";")]
        for f in set(frames):
            inclusive[f] += count
        own[frames[-1]] += count
    lines = [f"{total} samples; inclusive / own share per function:"]
    for f, n in inclusive.most_common(top):
        lines.append(f"  {100 * n / total:5.1f}%  {100 * own[f] / total:5.1f}%  {f}")
    return "\n".join(lines)


async def cpu_bench(args: argparse.Namespace) -> dict[str, Any]:
    """The projector's and the relay's CPU per 10k reports at the same offered rate."""
    hosts, rate = args.hosts, args.rate
    catalog = sim_catalog(RESOURCES, hosts / rate)
    variants = [("this", None)] + ([("compare", args.compare)] if args.compare else [])
    runs: list[dict[str, Any]] = []
    res: dict[str, Any] = {"hosts": hosts, "rate": rate, "runs": runs}
    for k in range(args.repeat):
        for label, cwd in variants:
            last = k == args.repeat - 1 and label == variants[-1][0]
            profile = args.profile if args.profile and k == 0 and label == "this" else None
            async with _server() as (nc, url):
                await nc.jetstream().publish(CATALOG, encode(catalog))
                fleet = Fleet(catalog, hosts, seed=11, faults=_FAULTS)
                warm = rounds_of(fleet, 1)
                batch = rounds_of(fleet, args.rounds)
                projector = ProjectorProcess(url, cwd=cwd)
                try:
                    await _caught_up(nc, projector, 1)
                    log(f"projector ({label}): warm-up, {len(warm):,} reports (one per host)")
                    await _caught_up(nc, projector, await publish_at(nc, warm, None))
                    run = await _measure(nc, projector, batch, rate, profile)
                    run.pop("last_seq")
                    run["rss"] = projector.rss
                    runs.append({"projector": label, "cwd": cwd or ".", **run})
                    log(f"projector ({label}): {run['cpu_s']:.2f} CPU s over {run['wall_s']:.1f} s"
                        f" = {run['cpu_per_10k']:.3f} s per 10k reports"
                        f" (system {run['system_per_10k']:.3f} s; {run['writes_per_10k']:,.0f}"
                        " records + status writes per 10k)")
                    pad = await relay_pad(nc)
                finally:
                    projector.stop()
                if last:
                    res.update(await _relay(nc, url, catalog, pad, args))
    mine = [r["cpu_per_10k"] for r in runs if r["projector"] == "this"]
    res["projector_cpu_per_10k"] = min(mine)
    if args.compare:
        other = [r["cpu_per_10k"] for r in runs if r["projector"] == "compare"]
        res["compare_cpu_per_10k"] = min(other)
        res["vs_compare"] = min(mine) / min(other)
    res["ratio"] = res["projector_cpu_per_10k"] / res["relay_cpu_per_10k"]
    return res


_FAULTS = Faults.parse("silent=0.01")


@contextlib.asynccontextmanager
async def _server() -> AsyncIterator[tuple[Client, str]]:
    """A fresh embedded server with crr's streams, and a connection to it."""
    with tempfile.TemporaryDirectory(prefix="crr-bench-cpu-") as store:
        server = NatsServer(store, port=0)
        await asyncio.to_thread(server.start)
        try:
            async with connect(server.url, name="crr-bench-cpu") as nc:
                await provision(nc)
                yield nc, server.url
        finally:
            await asyncio.to_thread(server.stop)


async def _relay(nc: Client, url: str, catalog: Any, pad: int,
                 args: argparse.Namespace) -> dict[str, Any]:
    """The raw relay's middle process: CPU for as many steady-state reports at the rate."""
    relayed = rounds_of(Fleet(catalog, args.hosts, seed=12, faults=_FAULTS), 1 + args.rounds)
    relayed = relayed[len(relayed) * 1 // (1 + args.rounds):]  # steady-state rounds
    await provision_relay(nc)
    relay = RelayProcess(url, pad)
    try:
        await asyncio.to_thread(relay.wait_ready)
        rpid = relay.proc.pid
        log(f"relay (padded by {pad} B): {len(relayed):,} reports at {args.rate:,}/s")
        c0, t0 = cpu_seconds(rpid), time.monotonic()
        await publish_at(nc, relayed, args.rate)
        await relay_done(nc, len(relayed))
        c1, t1 = cpu_seconds(rpid), time.monotonic()
    finally:
        relay.stop()
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await nc.jetstream().delete_stream(RELAY_STREAM)
    return {"relay_pad": pad, "relay_reports": len(relayed), "relay_cpu_s": c1 - c0,
            "relay_wall_s": t1 - t0, "relay_cpu_per_10k": (c1 - c0) / len(relayed) * 1e4}


async def _caught_up(nc: Client, projector: ProjectorProcess, seq: int) -> None:
    """Wait until the projector's status covers `seq`; CrrError if the process ended."""
    waiting = asyncio.ensure_future(wait_projector(nc, seq, 600))
    while not waiting.done():
        await asyncio.wait({waiting}, timeout=1.0)
        if not waiting.done() and projector.proc.poll() is not None:
            waiting.cancel()
            raise CrrError(f"the projector exited ({projector.proc.returncode})")
    await waiting


async def _measure(nc: Client, projector: ProjectorProcess, batch: list[Event], rate: float,
                   profile: str | None) -> dict[str, Any]:
    """Publish `batch` at `rate`; the projector's CPU until its status covers the last."""
    pid = projector.proc.pid
    spy = _spy(pid, profile) if profile else None
    js = nc.jetstream()
    w0 = (await js.stream_info(SNAPSHOT_STREAM)).state.last_seq
    (u0, s0), t0 = cpu_split(pid), time.monotonic()
    last = await publish_at(nc, batch, rate)
    await _caught_up(nc, projector, last)
    (u1, s1), t1 = cpu_split(pid), time.monotonic()
    c0, c1 = u0 + s0, u1 + s1
    writes = (await js.stream_info(SNAPSHOT_STREAM)).state.last_seq - w0
    if spy is not None:
        spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        await asyncio.to_thread(spy.wait, 30)
    return {"reports": len(batch), "cpu_s": c1 - c0, "wall_s": t1 - t0,
            "cpu_per_10k": (c1 - c0) / len(batch) * 1e4, "last_seq": last,
            "writes_per_10k": writes / len(batch) * 1e4,
            "system_per_10k": (s1 - s0) / len(batch) * 1e4}


def _spy(pid: int, out: str) -> subprocess.Popen[bytes]:
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return subprocess.Popen([exe, "record", "--pid", str(pid), "--rate", "200", "--format",
                             "raw", "--output", out], stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m tests.bench.cpu`."""
    parser = argparse.ArgumentParser(prog="python -m tests.bench.cpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=50_000)
    parser.add_argument("--rate", type=int, default=5_000, help="offered reports/s")
    parser.add_argument("--rounds", type=int, default=1, help="measured rounds (one per host)")
    parser.add_argument("--profile", default=None, metavar="FILE",
                        help="py-spy the projector during the measured rounds (collapsed stacks)")
    parser.add_argument("--compare", default=None, metavar="DIR",
                        help="also measure the projector of another checkout (e.g. a git "
                             "worktree of main), alternating with this one, same run")
    parser.add_argument("--repeat", type=int, default=1,
                        help="measurements per projector (alternating); the best counts")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    res = asyncio.run(cpu_bench(args))
    if args.json:
        print(json.dumps(res))
    else:
        for r in res["runs"]:
            print(f"projector ({r['projector']}, {r['cwd']}): {r['cpu_per_10k']:.3f} CPU s per "
                  f"10k reports ({r['cpu_s']:.2f} s for {r['reports']:,} at {res['rate']:,}/s, "
                  f"wall {r['wall_s']:.1f} s)")
        if "vs_compare" in res:
            print(f"this projector / the compared one (best of each): {res['vs_compare']:.3f}")
        print(f"raw relay CPU per 10k reports: {res['relay_cpu_per_10k']:.3f} s "
              f"({res['relay_cpu_s']:.2f} s for {res['relay_reports']:,}, "
              f"wall {res['relay_wall_s']:.1f} s)")
        print(f"ratio: {res['ratio']:.2f}x the relay (best run of this projector)")
    if args.profile:
        print(profile_summary(Path(args.profile)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
