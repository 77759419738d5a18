"""The ramp's publisher: the simulated fleet split over child processes, started together.

One Python process generating and publishing 50k hosts' reports tops out
somewhere around the rates the raw relay keeps up with, so a ramp driven
from the bench process measures the publisher, not the pipeline.  Each
child here publishes a shard of the hosts (the same host names as one
`Fleet` of `hosts`: shard k of P takes every P-th name) at its share of the
offered rate, after all children have connected and built their fleet
(`go` on stdin), and reports what it did as one JSON line; with
`--expected PATH` it also writes the last valid value of every resource it
sent per host that it sent a report of (msgpack `{host: {resource: value}}`)
for the zero-loss check.

    python -m tests.bench.publishers --server URL --hosts N --shard K --shards P \\
        --load RATE --duration S [--seed N] [--expected PATH]

`crr bench` drives the same children for crr and for the raw relay
(`run_publishers`).  Times are `time.monotonic()`, one clock for every
process on the machine (Linux CLOCK_MONOTONIC).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from crr.bus.connection import connect
from crr.bus.pipeline_publish import PipelinePublisher
from crr.producers.simulator import Fleet, run_fleet, sim_catalog

RESOURCES = 20
CATALOG_INTERVAL = 10.0
"""`sim_catalog`'s report interval: the catalog `crr bench` publishes (FULL plan)."""


@dataclass(frozen=True)
class Published:
    """What the publishers of one ramp step did, together."""

    events: int
    acked: int
    rejected: int
    failed: int
    last_seq: int
    """Highest CRR_EVENTS sequence acknowledged to any of them."""
    started: float
    """When the first one started publishing (monotonic)."""
    finished: float
    """When the last one had every publish acknowledged (monotonic)."""
    behind: float
    """How far the slowest one lagged its schedule at the end (s)."""
    expected: dict[str, dict[str, Any]]
    """Per host reported in this step, the last valid value of every resource sent
    (empty unless asked)."""

    @property
    def rate(self) -> float:
        """Events/s published and acknowledged, all publishers together."""
        return self.events / max(self.finished - self.started, 1e-9)


async def run_publishers(url: str, *, hosts: int, load: int, duration: float,
                         processes: int, seed: int = 5, catalog_interval: float,
                         expected: bool = False) -> Published:
    """One ramp step: `processes` children publish `hosts` hosts at `load` events/s in all."""
    with tempfile.TemporaryDirectory(prefix="crr-bench-pub-") as tmp:
        children = []
        for k in range(processes):
            cmd = [sys.executable, "-m", "tests.bench.publishers", "--server", url,
                   "--hosts", str(hosts), "--shard", str(k), "--shards", str(processes),
                   "--load", str(load), "--duration", str(duration), "--seed", str(seed),
                   "--catalog-interval", str(catalog_interval)]
            if expected:
                cmd += ["--expected", str(Path(tmp) / f"expected-{k}.msgpack")]
            children.append(await asyncio.create_subprocess_exec(
                *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE))
        try:
            for child in children:
                assert child.stdout is not None
                line = await asyncio.wait_for(child.stdout.readline(), 120)
                if line.strip() != b"ready":
                    raise RuntimeError(f"bench publisher did not start: {line!r}")
            for child in children:
                assert child.stdin is not None
                child.stdin.write(b"go\n")
                await child.stdin.drain()
            outs = [json.loads((await child.communicate())[0]) for child in children]
        finally:
            for child in children:
                if child.returncode is None:
                    child.kill()
                    await child.wait()
        merged: dict[str, dict[str, Any]] = {}
        if expected:
            for k in range(processes):
                merged.update(msgspec.msgpack.decode(
                    (Path(tmp) / f"expected-{k}.msgpack").read_bytes()))
    return Published(
        events=sum(o["events"] for o in outs), acked=sum(o["acked"] for o in outs),
        rejected=sum(o["rejected"] for o in outs), failed=sum(o["failed"] for o in outs),
        last_seq=max(o["last_seq"] for o in outs), started=min(o["started"] for o in outs),
        finished=max(o["finished"] for o in outs), behind=max(o["behind"] for o in outs),
        expected=merged)


def shard_fleet(hosts: int, shard: int, shards: int, seed: int,
                catalog_interval: float) -> Fleet:
    """Shard `shard` of `shards`: every `shards`-th of the names one fleet of `hosts` has."""
    names = Fleet(sim_catalog(RESOURCES, catalog_interval), hosts, boot="0").names[shard::shards]
    fleet = Fleet(sim_catalog(RESOURCES, catalog_interval), len(names),
                  seed=seed * 1_000 + shard)
    fleet.names = names
    return fleet


async def publish_shard(args: argparse.Namespace) -> tuple[dict[str, Any], Fleet]:
    """The child: build the shard, say ready, wait for `go`, publish; what it did."""
    fleet = shard_fleet(args.hosts, args.shard, args.shards, args.seed, args.catalog_interval)
    interval = args.hosts / args.load  # every host once per interval: `load` events/s in all
    async with connect(args.server, name=f"crr-bench-pub-{args.shard}") as nc, \
            PipelinePublisher(nc) as pipe:
        await nc.flush()
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        started = time.monotonic()
        stats = await run_fleet(fleet, pipe.publish, interval=interval, duration=args.duration)
        await pipe.flush(120)
        finished = time.monotonic()
    return {"events": stats.events, "acked": pipe.stats.acked, "rejected": pipe.stats.rejected,
            "failed": pipe.stats.failed, "last_seq": pipe.stats.last_seq, "started": started,
            "finished": finished, "behind": stats.behind}, fleet


def main(argv: list[str] | None = None) -> int:
    """Entry point of one publisher child."""
    parser = argparse.ArgumentParser(prog="python -m tests.bench.publishers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", required=True)
    parser.add_argument("--hosts", type=int, required=True)
    parser.add_argument("--shard", type=int, default=0)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--load", type=float, required=True, help="events/s, all shards")
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--catalog-interval", type=float, default=CATALOG_INTERVAL)
    parser.add_argument("--expected", default=None)
    args = parser.parse_args(argv)
    result, fleet = asyncio.run(publish_shard(args))
    if args.expected:
        sent = zip(fleet.names, fleet.expected, fleet.rounds, strict=True)
        Path(args.expected).write_bytes(msgspec.msgpack.encode(
            {name: values for name, values, rounds in sent if rounds}))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
