"""The Slurm bridge bench: a real slurmctld with 2,000 nodes, the real pipeline in front.

    python -m tests.bench.slurm_bridge [--nodes 2000] [--samples 40] [--out DIR]

An embedded nats-server, the projector and a `SchedulerView` in this process, and a
real munged + slurmctld (`tests.support.slurm`, no slurmd: the nodes stay UNKNOWN,
which does not matter to feature updates).  Measured:

1. **calls per reconcile, with and without hostlist batching**: a cold reconcile of
   every node (each node's crr features set from a report: `imagenet_cached` on every
   2nd node, `big_scratch` on every 3rd — three distinct crr feature sets, interleaved,
   the worst layout for ranges; nodes with neither have no report), once with hostlist
   expressions and once one node per call, each after `scontrol reconfigure` has wiped
   the features; its wall time too;
2. **report → `scontrol show node` latency** (p50/p99): with the bridge running
   (batching on), a report flips `datasets` on one random node; the time until
   `scontrol show node <node> --oneliner` shows the feature appear (or go) is polled
   every 20 ms (so the figure includes up to one poll interval and one scontrol call);
3. **report → `scontrol show node` shows the node drained** (p50/p99), with the guard on
   (the defaults: `max_drained` 10% = 200 of 2,000, `max_changed` 20% per 5 min) and a
   drain rule with `for: 0s`, `resume_after: 0s`: a report sets `fs_healthy=false` on one
   random node (a different one each time); the time until `scontrol show node <node>
   --oneliner` shows `DRAIN`, polled every 20 ms.  The nodes stay drained (a node with no
   slurmd is UNKNOWN, and slurmctld refuses to resume an UNKNOWN+DRAIN node): 40 of the
   200 allowed, so the guard never trips — what is measured is the gate's cost on the way.

Writes `slurm-bench.json` in `--out`.  Not a test: it runs for about a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from crr.bridges.slurm import SlurmCommands, SlurmDoor
from crr.bridges.slurm_bridge import SlurmBridge, wants_from_view
from crr.bus.connection import connect
from crr.bus.server import NatsServer
from crr.bus.streams import provision
from crr.projections.exports import compile_exports, plan_table
from crr.projections.percentile import percentiles
from crr.schemas.catalog_loader import load_catalog_text
from crr.view.scheduler_view import loaded_view
from tests.support.projector import publish_catalog, publish_report, running_projector
from tests.support.slurm import SlurmCluster, slurm_cluster

CATALOG = load_catalog_text("""
version: 1
resources:
  scratch_free: {kind: numeric, scope: host, reporter: scratch, interval: 1h, min: 0}
  datasets:     {kind: string_set, scope: host, reporter: datasets, interval: 1h}
  fs_healthy:   {kind: boolean, scope: host, reporter: health, interval: 1h}
reporters:
  health:   {type: external, interval: 1h}
  scratch:  {type: external, interval: 1h}
  datasets: {type: external, interval: 1h}
exports:
  features:
    imagenet_cached: 'datasets has "imagenet"'
    big_scratch: 'scratch_free > 500'
  drain:
    - {when: '!fs_healthy', reason: 'bench', for: 0s, resume_after: 0s}
""")
EXPORTS = compile_exports(CATALOG)
POLL = 0.02


def log(text: str) -> None:
    """Progress on stderr."""
    print(f"[slurm-bench] {text}", file=sys.stderr, flush=True)


def shows(slurm: SlurmCluster, node: str, feature: str) -> bool:
    """Whether `scontrol show node` lists `feature` active on `node`."""
    line = slurm.scontrol("show", "node", node, "--oneliner")
    active = line.split("ActiveFeatures=", 1)[1].split(" ", 1)[0]
    return feature in active.split(",")


async def calls_phase(slurm: SlurmCluster, view: Any, nodes: list[str]) -> dict[str, Any]:
    """One cold reconcile of every node, batched and unbatched."""
    t0 = time.perf_counter()
    wants = wants_from_view(view, EXPORTS, time.time())
    planned = time.perf_counter() - t0
    t0 = time.perf_counter()
    per_host = plan_table(EXPORTS, view.table, time.time())
    reference = time.perf_counter() - t0
    assert {h: (w.features, w.drain) for h, w in per_host.items()} == \
        {h: (w.features, w.drain) for h, w in wants.items()}
    log(f"wanted state of {len(wants)} hosts from the view: {planned * 1000:.1f} ms "
        f"column-wise (view.select), {reference * 1000:.1f} ms per host (plan_table); equal")
    out: dict[str, Any] = {"nodes": len(nodes), "wants_ms": round(planned * 1000, 1),
                           "plan_table_ms": round(reference * 1000, 1),
                           "distinct_feature_sets": len({w.features for w in wants.values()})}
    for batch in (True, False):
        slurm.scontrol("reconfigure")
        door = SlurmDoor(SlurmCommands(env=slurm.env, timeout=60), owned=EXPORTS.features,
                         batch=batch)
        t0 = time.perf_counter()
        done = await door.reconcile(wants)
        took = time.perf_counter() - t0
        assert done.failed == 0, done.errors[:3]
        again = await door.reconcile(wants)
        key = "batched" if batch else "unbatched"
        out[key] = {"calls": done.calls, "seconds": round(took, 3),
                    "calls_when_in_line": again.calls}
        log(f"{key}: {done.calls} scontrol update call(s) for {len(nodes)} nodes in "
            f"{took:.2f} s; a second reconcile: {again.calls} call(s)")
    return out


async def latency_phase(slurm: SlurmCluster, nc: Any, view: Any, nodes: list[str],
                        samples: int) -> dict[str, Any]:
    """Report → `scontrol show node` latency with the bridge running."""
    door = SlurmDoor(SlurmCommands(env=slurm.env, timeout=60))
    bridge = SlurmBridge(view, door, interval=30.0, min_gap=0.0)
    stop = asyncio.Event()
    task = asyncio.create_task(bridge.run(stop))
    rng = random.Random(29)
    took: list[float] = []
    to_view: list[float] = []
    cycles: list[float] = []
    seq = 1_000
    seen: dict[str, float] = {}
    unsubscribe = view.subscribe(lambda subject: seen.setdefault(subject, time.perf_counter()))
    try:
        async with bridge.cycled:  # the first (catch-up) cycle done
            await asyncio.wait_for(bridge.cycled.wait(), 120)
        for _ in range(samples):
            node = rng.choice(nodes)
            has = shows(slurm, node, "imagenet_cached")
            seq += 1
            seen.clear()
            t0 = time.perf_counter()
            await publish_report(nc, "datasets", node,
                                 {"datasets": [] if has else ["imagenet"]}, seq=seq)
            deadline = t0 + 30
            while shows(slurm, node, "imagenet_cached") == has:
                if time.perf_counter() > deadline:
                    raise AssertionError(f"{node}: feature did not follow in 30 s")
                await asyncio.sleep(POLL)
            took.append(time.perf_counter() - t0)
            at_view = [t for subject, t in seen.items() if subject.endswith(node)]
            if at_view:
                to_view.append(at_view[0] - t0)
            cycles.append(bridge.status.last_cycle_seconds)
    finally:
        unsubscribe()
        stop.set()
        await asyncio.wait_for(task, 30)
    p50, p99 = percentiles(took, (50, 99))
    status = bridge.status_dict()
    log(f"report -> scontrol show node: p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms "
        f"({samples} samples); {status['cycles']} cycles, {status['calls']} Slurm calls")
    v50, v99 = percentiles(to_view, (50, 99))
    c50, c99 = percentiles(cycles, (50, 99))
    log(f"  of which report -> view p50 {v50 * 1000:.0f} ms p99 {v99 * 1000:.0f} ms; one "
        f"bridge cycle (read 2,000 nodes, plan, update) p50 {c50 * 1000:.0f} ms "
        f"p99 {c99 * 1000:.0f} ms")
    return {"samples": samples, "p50_ms": round(p50 * 1000, 1), "p99_ms": round(p99 * 1000, 1),
            "report_to_view_p50_ms": round(v50 * 1000, 1),
            "report_to_view_p99_ms": round(v99 * 1000, 1),
            "cycle_p50_ms": round(c50 * 1000, 1), "cycle_p99_ms": round(c99 * 1000, 1),
            "max_ms": round(max(took) * 1000, 1), "poll_ms": POLL * 1000,
            "cycles": status["cycles"], "slurm_calls": status["calls"]}


def drained(slurm: SlurmCluster, node: str) -> bool:
    """Whether `scontrol show node` shows `node` drained (by anyone)."""
    line = slurm.scontrol("show", "node", node, "--oneliner")
    state = line.split(" State=", 1)[1].split(" ", 1)[0]
    return "DRAIN" in state


async def drain_phase(slurm: SlurmCluster, nc: Any, view: Any, nodes: list[str],
                      samples: int) -> dict[str, Any]:
    """Report → `scontrol show node` shows the node drained, guard on (defaults)."""
    door = SlurmDoor(SlurmCommands(env=slurm.env, timeout=60))
    bridge = SlurmBridge(view, door, interval=30.0, min_gap=0.0)
    stop = asyncio.Event()
    task = asyncio.create_task(bridge.run(stop))
    rng = random.Random(31)
    took: list[float] = []
    seq = 5_000
    try:
        async with bridge.cycled:
            await asyncio.wait_for(bridge.cycled.wait(), 120)
        for node in rng.sample(nodes, samples):
            seq += 1
            t0 = time.perf_counter()
            await publish_report(nc, "health", node, {"fs_healthy": False}, seq=seq)
            deadline = t0 + 30
            while not drained(slurm, node):
                if time.perf_counter() > deadline:
                    raise AssertionError(f"{node}: not drained in 30 s")
                await asyncio.sleep(POLL)
            took.append(time.perf_counter() - t0)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    assert bridge.gated is not None
    assert not bridge.gated.trips, bridge.gated.trips
    p50, p99 = percentiles(took, (50, 99))
    log(f"report -> scontrol shows DRAIN (guard on): p50 {p50 * 1000:.0f} ms, "
        f"p99 {p99 * 1000:.0f} ms ({samples} samples)")
    return {"samples": samples, "p50_ms": round(p50 * 1000, 1), "p99_ms": round(p99 * 1000, 1),
            "max_ms": round(max(took) * 1000, 1), "poll_ms": POLL * 1000,
            "guard": "defaults: max_drained 10% (200), max_changed 20% (400) per 5m",
            "cycles": bridge.status.cycles}


async def main(nodes: int, samples: int) -> dict[str, Any]:
    """Run both phases; returns the results (`cli` writes them)."""
    width = max(4, len(str(nodes)))
    expr = f"node[{1:0{width}d}-{nodes:0{width}d}]"
    names = [f"node{i:0{width}d}" for i in range(1, nodes + 1)]
    with tempfile.TemporaryDirectory() as store, NatsServer(store) as server, \
            slurm_cluster(expr, with_slurmd=False) as slurm:
        log(f"slurmctld up with {nodes} nodes ({expr}); nats at {server.url}")
        async with connect(server.url, name="slurm-bench") as nc:
            await provision(nc)
            await publish_catalog(nc, CATALOG)
            async with running_projector(nc), loaded_view(nc, 60) as view:
                last = 0
                for i, name in enumerate(names, 1):
                    values: dict[str, Any] = {}
                    if i % 2 == 0:
                        values["datasets"] = ["imagenet"]
                    if i % 3 == 0:
                        values["scratch_free"] = 900
                    if "datasets" in values:
                        last = await publish_report(nc, "datasets", name,
                                                    {"datasets": values["datasets"]})
                    if "scratch_free" in values:
                        last = await publish_report(nc, "scratch", name,
                                                    {"scratch_free": 900})
                await view.wait_until(last, 60)
                results: dict[str, Any] = {"calls": await calls_phase(slurm, view, names),
                           "latency": await latency_phase(slurm, nc, view, names, samples),
                           "drain": await drain_phase(slurm, nc, view, names, samples)}
    results["note"] = ("one machine (2 cores) shared with other agents' work while measured; "
                       "slurmctld, nats-server, projector, view and bridge all on it")
    return results


def cli(argv: list[str] | None = None) -> int:
    """`python -m tests.bench.slurm_bridge`."""
    p = argparse.ArgumentParser(prog="python -m tests.bench.slurm_bridge")
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--samples", type=int, default=40)
    p.add_argument("--out", type=Path, default=Path())
    args = p.parse_args(argv)
    results = asyncio.run(main(args.nodes, args.samples))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "slurm-bench.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(cli())
