"""`crr bench`: the whole pipeline on one machine, every figure beside a baseline from the same run.

    crr bench [--quick] [--hosts N] [--publishers N] [--skip PHASE]... [--out DIR] [--soak 30m]
              [--rebuild-hosts N] [--rebuild-events N]
    python -m tests.bench.suite ...          (the same)

An embedded nats-server, the projector as a separate process (`crr
projector`, as in production), the simulated reporters
(`crr.producers.simulator.Fleet` through `crr.bus.pipeline_publish`) and the
scheduler view (`crr.view.scheduler_view.SchedulerView`) in this process.  Measured:

1. report → view latency p50/p99 at a fixed offered rate (50k hosts @ 10 s
   = 5k reports/s; `--quick`: 10k hosts @ 4 s), and stale-detection
   lateness (a silent host's `expires_at` → `stale` visible in the view);
2. throughput vs offered load (a ramp of `Plan.loads`, published by
   `Plan.publishers` child processes, `tests.bench.publishers`), with zero
   loss checked after every step (the projector's status covers every report
   and every host's snapshot equals the last valid report sent); the max
   sustained offered load is the highest step sustained (`step_verdict`);
3. maximum end-to-end rate: pre-generated reports published as fast as the
   pipeline takes them, until the projector has written them to
   CRR_SNAPSHOT — beside raw nats-py `publish_async` of the same messages
   into a stream with the same settings (issue 2's goal: ≥ 40%);
4. view cold start for all hosts vs a raw ordered-consumer read of
   CRR_SNAPSHOT (each in a fresh child process, which also gives the view's
   RSS per host: the RSS after the load minus that of the same process
   connected and idle before it);
5. `select[]` host-evaluations/s vs the hand-written lambda (and ClassAd
   when `htcondor` is importable), reusing `tests.bench.select`;
6. projector RSS per host, after the fixed-rate phase and after the ramp;
7. the **raw relay** baseline (`tests.bench.relay`): the same publisher and
   rates, a process that only republishes each report (padded to a host
   record's size) into a last-per-subject stream, and a reader here — its
   latency at the fixed rate and its ramp (the same ladder, publishers and
   rules; a step arrives when the relay's stream stored every report),
   beside crr's, ending in one line: crr max sustained X/s, relay Y/s,
   ratio, goal.  It runs after crr's phases, with the projector stopped
   (the same process layout: publishers, one process in the middle, the
   reader here);
8. projector restart (restore from CRR_SNAPSHOT) vs a raw read of it (`tests.bench.restart`);
9. projector rebuild (CRR_SNAPSHOT lost: the fold of every retained event) vs a raw
   ordered read of the same history, its peak RSS vs the restore path's, and its
   records checked against the restore path's (`tests.bench.rebuild`).

Writes `bench-results.json` and, when matplotlib is installed (the optional
`bench` extra), `bench-plot.png` (latency CDF; throughput vs offered load).
`--soak DURATION` runs the fixed load for DURATION with RSS sampled every
10 s and prints the trend instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import StreamConfig

from crr.bus.connection import connect
from crr.bus.ordered import OrderedReader, StoredMessage
from crr.bus.pipeline_publish import PipelinePublisher
from crr.bus.server import NatsServer
from crr.bus.streams import provision
from crr.commands.bench import add_arguments
from crr.producers.simulator import SILENT, Event, Faults, Fleet, sim_catalog
from crr.projections.host_table import HostTable
from crr.projections.percentile import percentiles
from crr.projections.select import compile_select
from crr.schemas.codec import decode, encode
from crr.schemas.distribution import install_hint
from crr.schemas.duration import parse_duration
from crr.schemas.errors import CrrError
from crr.schemas.snapshot import ProjectorStatus
from crr.schemas.subjects import (
    CATALOG,
    EVENTS_STREAM,
    SNAPSHOT_ALL,
    SNAPSHOT_PROJECTOR,
    SNAPSHOT_STREAM,
    host_snapshot_subject,
)
from crr.schemas.wire_time import expires_seconds, parse_time
from crr.view.scheduler_view import SchedulerView
from crr.view.snapshot_reader import read_snapshot
from tests.bench import rebuild, restart
from tests.bench import select as sb
from tests.bench.publishers import Published, run_publishers
from tests.bench.relay import (
    RELAY_STREAM,
    RelayProcess,
    RelayReader,
    provision_relay,
    terminate,
)

RESOURCES = 20


@dataclass(frozen=True)
class Plan:
    """Sizes of one run."""

    hosts: int
    latency_interval: float
    latency_duration: float
    loads: tuple[int, ...]
    ramp_duration: float
    max_events: int
    select_hosts: int
    publishers: int = 2
    """Child processes publishing the ramp (`tests.bench.publishers`), for crr and the relay."""
    pack: bool = True
    """The view keeps its records compressed (`SchedulerView(pack_records=...)`)."""
    rebuild_hosts: int = 50_000
    rebuild_events: int = 40
    """The rebuild phase's history: `rebuild_events` reports per host (`tests.bench.rebuild`)."""


FULL = Plan(hosts=50_000, latency_interval=10.0, latency_duration=40.0,
            loads=(5_000, 6_000, 7_000, 8_000, 9_000, 10_000, 12_000, 14_000, 17_000,
                   20_000, 25_000, 30_000, 40_000),
            ramp_duration=15.0, max_events=150_000, select_hosts=50_000)
QUICK = Plan(hosts=10_000, latency_interval=4.0, latency_duration=9.0,
             loads=(2_500, 3_500, 5_000, 7_500, 10_000, 15_000, 20_000), ramp_duration=4.0,
             max_events=40_000, select_hosts=10_000, rebuild_hosts=2_000)
"""`loads`: the ramp's ladder, the same for crr and the raw relay (each climbs it until
its first step that is not sustained)."""
RAMP_INTERVAL = 120.0
"""The catalog's report interval during crr's ramp: every value outlives a step and the
gap to the next, so no step makes values go stale (expiry writes: work the relay has
no counterpart for).  A step below `hosts / RAMP_INTERVAL` reports/s is skipped."""


def log(text: str) -> None:
    """Progress lines on stderr."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of a process (this one by default), from /proc."""
    path = f"/proc/{pid or os.getpid()}/status"
    with open(path, encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def percentile(xs: list[float], p: float) -> float:
    """The p-th percentile of `xs` (`crr.projections.percentile`; nan when empty)."""
    return percentiles(xs, (p,))[0] if xs else float("nan")


async def projector_seq(nc: Client) -> int:
    """The CRR_EVENTS sequence up to which the projector's status says CRR_SNAPSHOT
    reflects every event (`covered_seq`, else `last_seq`; 0: none yet)."""
    try:
        msg = await nc.jetstream().get_last_msg(SNAPSHOT_STREAM, SNAPSHOT_PROJECTOR)
    except nats.js.errors.NotFoundError:
        return 0
    if not msg.data:
        return 0
    status = decode(msg.data, ProjectorStatus)
    return status.covered_seq or status.last_seq


async def wait_projector(nc: Client, seq: int, timeout: float) -> float:
    """Poll the projector's status until it covers `seq`; returns when (monotonic)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await projector_seq(nc) >= seq:
            return time.monotonic()
        await asyncio.sleep(0.02)
    raise CrrError(f"projector did not reach events seq {seq} within {timeout:g}s")


class ProjectorProcess:
    """`crr projector` as a child process."""

    def __init__(self, url: str, *, cwd: str | None = None) -> None:
        """`cwd`: run the projector of the checkout there (`python -m` imports from it)."""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "crr.cli", "projector", "--server", url],
            stdin=subprocess.DEVNULL, cwd=cwd)

    @property
    def rss(self) -> int:
        """Its resident set size now."""
        return rss_bytes(self.proc.pid)

    def stop(self) -> None:
        """SIGTERM, then wait (kill after 10 s)."""
        terminate(self.proc)


class _ProbeEntry(msgspec.Struct, gc=False):
    state: str
    observed_at: str
    expires_at: str


class _Probe(msgspec.Struct, gc=False):
    values: dict[str, _ProbeEntry] = msgspec.field(default_factory=dict)


_probe = msgspec.json.Decoder(_Probe)


class _HeadEntry(msgspec.Struct, gc=False):
    state: str
    observed_at: str


def _head_probe(name: str) -> Callable[[bytes], _HeadEntry | None]:
    """A record's entry of resource `name` alone (every report of the simulator has it and
    all its values share the report's `observed_at`): decoded as leanly as the relay reader
    decodes its messages' `observed_at`."""
    values = msgspec.defstruct("HeadValues", [("v", _HeadEntry | None, None)],
                               rename={"v": name}, gc=False)
    record = msgspec.defstruct("HeadRecord", [("values", values | None, None)], gc=False)
    decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(record)
    decode = decoder.decode

    def head(data: bytes) -> _HeadEntry | None:
        vals = decode(data).values
        entry: _HeadEntry | None = None if vals is None else vals.v
        return entry

    return head


class GcPauses:
    """A `gc.callbacks` entry: the cyclic collector's pauses in this process."""

    def __init__(self) -> None:
        self.total = 0.0
        self.full = 0
        self.full_max = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._start = now
            return
        took = now - self._start
        self.total += took
        if info["generation"] == 2:
            self.full += 1
            self.full_max = max(self.full_max, took)


QUERY_EVERY = 0.1
"""Seconds between the latency phase's `select` calls (a scheduler's cadence)."""


async def _scheduler_queries(view: SchedulerView, catalog: Any, took: list[float]) -> None:
    """What a scheduler does meanwhile: a `select` every `QUERY_EVERY` seconds, each timed
    (it writes the rows staged since the last one into the columns first)."""
    kinds = {spec.kind: name for name, spec in sorted(catalog.resources.items(), reverse=True)}
    expr = f"{kinds['numeric']} > 500"
    if "string_set" in kinds:
        expr += f' && {kinds["string_set"]} has "d1"'
    compiled = view.compile(expr)
    while True:
        await asyncio.sleep(QUERY_EVERY)  # pacing, not synchronisation
        start = time.perf_counter()
        view.select(compiled)
        took.append(time.perf_counter() - start)


# -- 1. latency and stale lateness (simulator in a child process, view here) ---------


async def latency_phase(nc: Client, url: str, plan: Plan, duration: float, *,
                        projector: ProjectorProcess, sample_rss: bool = False,
                        ) -> dict[str, Any]:
    """Fixed offered load from `crr sim reporters` in a child process; the view here.

    Latency: the time a host's record reaches the view minus the report's
    `observed_at` (the simulator stamps it when it publishes; one clock, one
    machine; millisecond resolution).  Stale lateness: a silent host's record
    turning all-stale in the view minus its `expires_at`.
    """
    faults = "silent=0.01"
    catalog = sim_catalog(RESOURCES, plan.latency_interval)
    fleet = Fleet(catalog, plan.hosts, seed=11,
                  faults=Faults.parse(faults))  # the same names and roles as the child's
    head = _head_probe(min(catalog.resources))
    index = {host_snapshot_subject(h): i for i, h in enumerate(fleet.names)}
    last_seen = [""] * len(fleet)
    latencies: list[float] = []
    hops: list[float] = []
    """Stored in CRR_SNAPSHOT (server time) → applied in the view: the reader's own part."""
    lateness: list[float] = []
    silent_open = {i for i in range(len(fleet)) if fleet.role[i] == SILENT}
    view = SchedulerView(nc, pack_records=plan.pack)
    await view.start()
    await view.wait_ready(120)

    def on_record(subject: str) -> None:
        i = index.get(subject)
        if i is None:
            return
        hops.append(time.time() - view.last_stored_at)
        record = view.table.record(fleet.names[i])
        if record is None:
            return
        # The harness reads only what it times, as leanly as it can: one entry, and all
        # of them only for a silent host not seen stale yet.
        entry = head(record)
        now = time.time()
        if entry is not None and entry.state == "fresh" and entry.observed_at != last_seen[i]:
            last_seen[i] = entry.observed_at
            latencies.append(now - expires_seconds(entry.observed_at))  # the relay's parser
        elif i in silent_open:
            snap = _probe.decode(record)
            if snap.values and all(e.state == "stale" for e in snap.values.values()):
                lateness.append(now - max(parse_time(e.expires_at)
                                          for e in snap.values.values()))
                silent_open.discard(i)

    unsubscribe = view.subscribe(on_record)
    selects: list[float] = []
    querying = asyncio.create_task(_scheduler_queries(view, catalog, selects))
    samples: list[tuple[float, int, int]] = []
    t0 = time.monotonic()
    cpu0 = time.process_time()
    pauses = GcPauses()
    gc.callbacks.append(pauses)
    sim = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crr.cli", "sim", "reporters", "--server", url,
        "--hosts", str(plan.hosts), "--interval", str(plan.latency_interval),
        "--duration", str(duration), "--seed", "11", "--faults", faults, "--json",
        stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL)
    assert sim.stdout is not None
    reading = asyncio.create_task(sim.stdout.read())
    while not reading.done():
        if sample_rss:
            samples.append((time.monotonic() - t0, projector.rss, rss_bytes()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(reading), 10.0)
    await sim.wait()
    summary = json.loads(await reading)
    await view.wait_until(summary["last_seq"], 120)
    querying.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await querying
    cpu = time.process_time() - cpu0  # this process: the view, its queries, the probe
    gc.callbacks.remove(pauses)
    unsubscribe()
    view_rss = rss_bytes()
    await view.stop()
    return {
        "hosts": plan.hosts, "interval": plan.latency_interval,
        "offered_rate": summary["offered_rate"], "achieved_rate": summary["rate"],
        "events": summary["events"], "duration": summary["elapsed"],
        "latency_ms": sorted(x * 1e3 for x in latencies),
        "latency_p50_ms": percentile(latencies, 50) * 1e3,
        "latency_p99_ms": percentile(latencies, 99) * 1e3,
        "latency_samples": len(latencies),
        "hop_p50_ms": percentile(hops, 50) * 1e3, "hop_p99_ms": percentile(hops, 99) * 1e3,
        "stale_lateness_ms": sorted(x * 1e3 for x in lateness),
        "stale_p50_ms": percentile(lateness, 50) * 1e3,
        "stale_p99_ms": percentile(lateness, 99) * 1e3,
        "stale_samples": len(lateness), "silent_hosts": sum(r == SILENT for r in fleet.role),
        "reader_cpu_us": cpu / max(1, view.applied) * 1e6,
        "gc_full_collections": pauses.full, "gc_full_max_ms": pauses.full_max * 1e3,
        "gc_total_ms": pauses.total * 1e3,
        "select_p50_ms": percentile(selects, 50) * 1e3,
        "select_p99_ms": percentile(selects, 99) * 1e3, "select_samples": len(selects),
        "view_process_rss": view_rss,
        "rss_samples": [{"t": t, "projector": p, "view": v} for t, p, v in samples],
    }


# -- 2. throughput vs offered load, zero loss ----------------------------------------


SUSTAINED_CATCH_UP_S = 2.0
"""A step is sustained only if its destination holds every report this soon after the
publishers' last acknowledged publish."""
PUBLISHER_SHARE = 0.95
"""…and only if the publishers sent at least this share of the offered reports (if they
could not, the step measured the publishers, not the pipeline: "publisher-limited")."""

RAMP_ATTEMPTS = 2
"""Tries of a step before it counts as not sustained."""

Position = Callable[[], Awaitable[int]]
"""How far the destination of a ramp got, in the units of `Target`."""
Target = Callable[[Published, int], int]
"""The position at which every report a step published has arrived (from the position
before the step)."""
Check = Callable[[dict[str, dict[str, Any]]], Awaitable[int]]
"""Hosts whose state at the destination differs from what the publishers last sent."""


async def wait_position(position: Position, target: int, *, stall: float = 10.0,
                        timeout: float = 600.0) -> tuple[float, int]:
    """Poll `position` until it reaches `target`, or it did not move for `stall` seconds
    (what is missing then is lost); returns when (monotonic) and the position."""
    last = await position()
    moved = time.monotonic()
    while last < target:
        await asyncio.sleep(0.02)
        now_at = await position()
        now = time.monotonic()
        if now_at != last:
            last, moved = now_at, now
        elif now - moved > stall or now - moved > timeout:
            break
    return time.monotonic(), last


def step_verdict(step: dict[str, Any]) -> str:
    """Why a ramp step counts as sustained or not (one word or phrase)."""
    if step["events"] < PUBLISHER_SHARE * step["offered"] * step["duration"]:
        return "publisher-limited"
    if step["lost"]:
        return f"lost {step['lost']}"
    if step.get("hosts_mismatched"):
        return f"{step['hosts_mismatched']} hosts differ"
    if step["catch_up_s"] > SUSTAINED_CATCH_UP_S:
        return "fell behind"
    return "sustained"


def sustained(steps: list[dict[str, Any]]) -> int:
    """The highest offered load kept up with: the publishers reached it, every report
    arrived (and, where checked, every host's state is the last one sent), and the
    destination caught up within `SUSTAINED_CATCH_UP_S` of the last publish."""
    return max((s["offered"] for s in steps if s["verdict"] == "sustained"), default=0)


async def ramp_steps(url: str, plan: Plan, *, position: Position, target: Target,
                     label: str, check: Check | None = None) -> list[dict[str, Any]]:
    """The ramp: each of `plan.loads` for `ramp_duration`, from `plan.publishers` child
    processes (`tests.bench.publishers`), until the destination has every report.

    A warm-up round (every host once, at the latency phase's rate) comes first, so
    every step finds every host known (crr's values live `RAMP_INTERVAL` meanwhile).
    A step that is not sustained is tried again once (a shared machine's hiccup should
    not end a ramp); the ramp stops after a step that fails both times (the same rules
    for crr and the relay, so both climb the same ladder as far as they can).
    """
    warm = Plan(**{**plan.__dict__, "ramp_duration": plan.latency_interval})
    rate = round(plan.hosts / plan.latency_interval)
    step = await _ramp_step(url, warm, rate, position=position, target=target, check=None)
    log(f"{label} ramp warm-up (one report per host at {rate:,}/s, not counted): "
        f"{step['verdict']}")
    steps: list[dict[str, Any]] = []
    for load in plan.loads:
        if load < plan.hosts / RAMP_INTERVAL:
            log(f"{label} ramp {load:,}/s skipped: below one report per host per "
                f"{RAMP_INTERVAL:g}s (values would go stale between reports)")
            continue
        for attempt in range(1, RAMP_ATTEMPTS + 1):
            step = await _ramp_step(url, plan, load, position=position, target=target,
                                    check=check)
            step["attempt"] = attempt
            steps.append(step)
            log(f"{label} ramp {load:,}/s (attempt {attempt}): published "
                f"{step['published_rate']:,.0f}/s by {plan.publishers} process(es), "
                f"end-to-end {step['e2e_rate']:,.0f}/s, caught up {step['catch_up_s']:.2f}s "
                f"after the last publish, lost {step['lost']}: {step['verdict']}")
            if step["verdict"] == "sustained":
                break
        if step["verdict"] != "sustained":
            break
    return steps


async def _ramp_step(url: str, plan: Plan, load: int, *, position: Position, target: Target,
                     check: Check | None) -> dict[str, Any]:
    base = await position()
    pub = await run_publishers(url, hosts=plan.hosts, load=load,
                               duration=plan.ramp_duration, processes=plan.publishers,
                               catalog_interval=plan.latency_interval,
                               expected=check is not None)
    goal = target(pub, base)
    done, reached = await wait_position(position, goal)
    step: dict[str, Any] = {
        "offered": load, "duration": plan.ramp_duration, "publishers": plan.publishers,
        "events": pub.events, "published_rate": pub.rate,
        "e2e_rate": pub.events / (done - pub.started),
        "catch_up_s": max(0.0, done - pub.finished), "publisher_behind_s": pub.behind,
        "acked": pub.acked, "rejected": pub.rejected,
        "lost": max(0, goal - reached) + pub.events - pub.acked}
    if check is not None and not step["lost"]:
        step["hosts_mismatched"] = await check(pub.expected)
    step["verdict"] = step_verdict(step)
    return step


def ramp_summary(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The ramp's figure and, when the publishers were what stopped it, that."""
    last = steps[-1] if steps else None
    return {"steps": steps, "max_sustained_offered": sustained(steps),
            "stopped_by": last["verdict"] if last is not None else "no steps",
            "ladder_top": last is not None and last["verdict"] == "sustained"}


async def ramp_phase(nc: Client, url: str, plan: Plan) -> dict[str, Any]:
    """crr's ramp: until the projector's status covers every report and every host's
    record holds the values last sent."""

    async def covered() -> int:
        return await projector_seq(nc)

    async def check(expected: dict[str, dict[str, Any]]) -> int:
        contents = await read_snapshot(nc, 120)
        lost = 0
        for name, values in expected.items():
            snap = contents.hosts.get(name)
            got = ({n: e.value if e.state == "fresh" else e.last_value
                    for n, e in snap.values.items()} if snap else {})
            lost += got != values
        return lost

    js = nc.jetstream()
    # Values that outlive the gaps between steps (publisher start-up, the check): with the
    # latency phase's 10 s interval a value would go stale between two steps, and the
    # projector would write every host's stale transition, work the relay does not have.
    ack = await js.publish(CATALOG, encode(sim_catalog(RESOURCES, RAMP_INTERVAL)))
    await wait_projector(nc, ack.seq, 300)
    try:
        steps = await ramp_steps(url, plan, position=covered,
                                 target=lambda pub, _base: pub.last_seq, label="crr",
                                 check=check)
    finally:
        ack = await js.publish(CATALOG, encode(sim_catalog(RESOURCES, plan.latency_interval)))
        await wait_projector(nc, ack.seq, 300)
    out = ramp_summary(steps)
    out["hosts_checked"] = plan.hosts
    out["hosts_mismatched"] = sum(s.get("hosts_mismatched", 0) for s in steps)
    return out


# -- 7. the raw relay baseline ---------------------------------------------------------


async def relay_pad(nc: Client) -> int:
    """Bytes to add to a report so the relay republishes records of a host record's size."""
    js = nc.jetstream()
    snap = (await js.stream_info(SNAPSHOT_STREAM)).state
    events = (await js.stream_info(EVENTS_STREAM)).state
    record = snap.bytes / max(1, snap.messages)
    report = events.bytes / max(1, events.messages)
    return max(0, round(record - report))


async def relay_phase(nc: Client, url: str, plan: Plan, pad: int, *,
                      latency: bool = True, ramp: bool = True) -> dict[str, Any]:
    """The raw relay (`tests.bench.relay`): latency at the fixed rate, then its ramp."""
    await provision_relay(nc)
    relay = RelayProcess(url, pad)
    reader = RelayReader(nc)
    result: dict[str, Any] = {"record_bytes_pad": pad}
    try:
        await asyncio.to_thread(relay.wait_ready)
        if latency:
            await reader.start()
            cpu0 = time.process_time()
            sim = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "crr.cli", "sim", "reporters", "--server", url,
                "--hosts", str(plan.hosts), "--interval", str(plan.latency_interval),
                "--duration", str(plan.latency_duration), "--seed", "11",
                "--faults", "silent=0.01", "--json",
                stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL)
            out, _ = await sim.communicate()
            summary = json.loads(out)
            expected = summary["events"]
            await reader.wait_count(expected)
            cpu = time.process_time() - cpu0  # this process: the reader (and its timing)
            latencies = list(reader.latencies)
            result |= {
                "offered_rate": summary["offered_rate"],
                "events": expected, "received": reader.count,
                "latency_ms": sorted(x * 1e3 for x in latencies),
                "latency_p50_ms": percentile(latencies, 50) * 1e3,
                "latency_p99_ms": percentile(latencies, 99) * 1e3,
                "latency_samples": len(latencies),
                "hop_p50_ms": percentile(reader.hops, 50) * 1e3,
                "hop_p99_ms": percentile(reader.hops, 99) * 1e3,
                "reader_cpu_us": cpu / max(1, reader.count) * 1e6,
            }
            log(f"relay latency p50 {result['latency_p50_ms']:.1f} ms, "
                f"p99 {result['latency_p99_ms']:.1f} ms")
            await reader.stop()  # crr's ramp runs without a view: the same here
        if ramp:
            js = nc.jetstream()

            async def stored() -> int:  # every report is republished: a count, like a seq
                return int((await js.stream_info(RELAY_STREAM)).state.last_seq)

            steps = await ramp_steps(url, plan, position=stored,
                                     target=lambda pub, base: base + pub.acked, label="relay")
            result |= ramp_summary(steps)
        return result
    finally:
        await reader.stop()
        relay.stop()
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await nc.jetstream().delete_stream(RELAY_STREAM)


# -- 3. maximum end-to-end rate vs raw publish_async --------------------------------


def pregenerate(catalog: Any, hosts: int, events: int, seed: int = 21) -> list[Event]:
    """`events` reports of a fresh fleet, in schedule order (the same messages for both)."""
    fleet = Fleet(catalog, hosts, seed=seed)
    out: list[Event] = []
    k = 0
    while len(out) < events:
        out.extend(fleet.events(k % hosts, "2026-12-02T14:00:00.000Z"))
        k += 1
    return out[:events]


async def raw_publish_async(nc: Client, msgs: list[Event]) -> float:
    """Raw nats-py `publish_async` of `msgs` into a same-config stream; returns msgs/s."""
    js = nc.jetstream()
    info = await js.stream_info(EVENTS_STREAM)
    cfg: StreamConfig = info.config
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await js.delete_stream("BENCH_RAW")
    await js.add_stream(StreamConfig(
        name="BENCH_RAW", subjects=["raw.>"], storage=cfg.storage, retention=cfg.retention,
        max_age=cfg.max_age, duplicate_window=cfg.duplicate_window))
    start = time.perf_counter()
    for subject, payload, headers in msgs:
        await js.publish_async("raw." + subject, payload, headers=headers)
    await asyncio.wait_for(js.publish_async_completed(), 120)
    rate = len(msgs) / (time.perf_counter() - start)
    await js.delete_stream("BENCH_RAW")
    return rate


async def max_phase(nc: Client, catalog: Any, plan: Plan) -> dict[str, Any]:
    """Pre-generated messages: pipeline publish → projector → CRR_SNAPSHOT, vs raw."""
    msgs = pregenerate(catalog, plan.hosts, plan.max_events)
    raw = await raw_publish_async(nc, msgs)
    log(f"raw publish_async: {raw:,.0f} msgs/s")
    async with PipelinePublisher(nc) as pipe:
        start = time.monotonic()
        for subject, payload, headers in msgs:
            await pipe.publish(subject, payload, headers)
        await pipe.flush(60)
        published = time.monotonic()
        done = await wait_projector(nc, pipe.stats.last_seq, 600)
    pub_rate = len(msgs) / (published - start)
    e2e = len(msgs) / (done - start)
    log(f"max: pipeline publish {pub_rate:,.0f}/s, end-to-end into CRR_SNAPSHOT {e2e:,.0f}/s")
    return {"events": len(msgs), "raw_publish_async_rate": raw, "pipeline_publish_rate": pub_rate,
            "e2e_rate": e2e, "e2e_vs_raw": e2e / raw}


# -- 4. cold start (child processes) -------------------------------------------------


async def _child_cold_start(url: str, mode: str) -> dict[str, Any]:
    async with connect(url, name=f"crr-bench-{mode}") as nc:
        await nc.flush()
        base = rss_bytes()  # an idle connected client
        start = time.perf_counter()
        if mode in {"view", "view-nopack"}:
            view = SchedulerView(nc, pack_records=mode == "view")
            await view.start()
            await view.wait_ready(300)
            took = time.perf_counter() - start
            hosts = len(view.table)
            at_ready = rss_bytes() - base
            await view.wait_packed(300)
            out = {"seconds": took, "hosts": hosts, "rss_delta": rss_bytes() - base,
                   "rss_delta_at_ready": at_ready,
                   "packed_after_s": time.perf_counter() - start}
            await view.stop()
            return out
        count = 0

        def noop(_m: StoredMessage) -> None:
            nonlocal count
            count += 1

        reader = OrderedReader(nc, stream=SNAPSHOT_STREAM, subject=SNAPSHOT_ALL,
                               handler=noop)
        await reader.start()
        await reader.wait_ready(300)
        took = time.perf_counter() - start
        await reader.stop()
        return {"seconds": took, "records": count}


def cold_start(url: str, mode: str) -> dict[str, Any]:
    """Run `_child_cold_start` in a fresh interpreter; its JSON result."""
    out = subprocess.run(
        [sys.executable, "-m", "tests.bench.suite", "--child", mode, "--server", url],
        capture_output=True, text=True, timeout=600, check=True)
    result: dict[str, Any] = json.loads(out.stdout)
    return result


# -- 5. select[] --------------------------------------------------------------------


def select_phase(n: int) -> dict[str, Any]:
    """Host-evaluations/s of compiled select[] vs the lambda (and ClassAd), per case."""
    snaps, dicts = sb.make_hosts(n, 1)
    table = HostTable(sb.CATALOG)
    for snap in snaps:
        table.upsert(snap)
    rows = [(d["_host"], d) for d in dicts]
    classad, why = sb._classad()
    ads = ([(d["_host"], classad.ClassAd(sb._ad_dict(d, None))) for d in dicts]
           if classad is not None else [])
    out: dict[str, Any] = {"hosts": n, "classad": why or "yes", "cases": {}}
    for case in sb.cases(None):
        compiled = compile_select(case.select, sb.CATALOG)
        sel = sb._best(functools.partial(compiled.select, table, sb.NOW), 3, 3)
        lam = sb._best(functools.partial(sb._filter, case.python, rows), 3)
        entry = {"select_per_s": n / sel, "lambda_per_s": n / lam}
        if classad is not None:
            tree = classad.ExprTree(case.classad)
            ca = sb._best(functools.partial(sb._classad_filter, tree, ads), 1)
            entry["classad_per_s"] = n / ca
        out["cases"][case.label] = entry
    return out


# -- report ---------------------------------------------------------------------------


def _mb(b: float) -> str:
    return f"{b / 1e6:,.0f} MB"


def _latency_rows(lat: dict[str, Any], relay: dict[str, Any] | None,
                  ) -> list[tuple[str, str, str, str, str]]:
    rows: list[tuple[str, str, str, str, str]] = []
    figures: tuple[tuple[str, str, str, dict[str, str]], ...] = (
        ("latency", f"report→view latency {{p}} @ {lat['offered_rate']:,.0f}/s", "raw relay",
         {"p50": "≤ 10 ms", "p99": "≤ 5x the relay's p99"}),
        ("hop", "stored in the stream → applied by the reader {p}", "relay reader", {}),
    )
    for key, label, baseline, goals in figures:
        for p in ("p50", "p99"):
            ours = lat[f"{key}_{p}_ms"]
            base, ratio = "—", ""
            if relay is not None:
                theirs = relay[f"{key}_{p}_ms"]
                base, ratio = f"{theirs:.1f} ms {baseline}", f"{ours / theirs:.1f}x"
            rows.append((label.format(p=p), f"{ours:.1f} ms", base, ratio, goals.get(p, "")))
    cpu = lat.get("reader_cpu_us")
    if cpu is not None:  # CPU time, unlike latency, barely depends on the neighbours
        theirs = None if relay is None else relay.get("reader_cpu_us")
        rows.append(("reader process CPU per record", f"{cpu:.1f} µs",
                     "—" if theirs is None else f"{theirs:.1f} µs relay reader",
                     "" if theirs is None else f"{cpu / theirs:.1f}x", ""))
    if "gc_full_collections" in lat:
        rows.append(("view process GC: full collections, longest / all pauses",
                     f"{lat['gc_full_collections']}, {lat['gc_full_max_ms']:.0f} / "
                     f"{lat['gc_total_ms']:.0f} ms", "—", "", ""))
    if lat.get("select_samples"):
        rows.append((f"select every {QUERY_EVERY:g} s meanwhile p50 / p99",
                     f"{lat['select_p50_ms']:.1f} / {lat['select_p99_ms']:.1f} ms "
                     f"(n={lat['select_samples']})", "—", "", ""))
    rows.append(("stale lateness p50 / p99",
                 f"{lat['stale_p50_ms']:.0f} / {lat['stale_p99_ms']:.0f} ms "
                 f"(n={lat['stale_samples']})", "—", "", "p99 ≤ 250 ms"))
    return rows


def _stop(ramp: dict[str, Any]) -> str:
    """What ended a ramp: the next step's verdict, or the top of the ladder."""
    if ramp["ladder_top"]:
        return "top of the ladder"
    return f"next step {ramp['stopped_by']}"


def ramp_verdict(res: dict[str, Any]) -> str | None:
    """The max-sustained comparison in one plain sentence (None without both ramps)."""
    ramp, relay = res.get("ramp"), res.get("relay")
    if not ramp or not relay or not relay.get("steps"):
        return None
    ours, theirs = ramp["max_sustained_offered"], relay["max_sustained_offered"]
    ratio = ours / theirs if theirs else float("nan")
    text = (f"crr max sustained {ours:,}/s, relay {theirs:,}/s"
            f"{'+' if relay['ladder_top'] else ''}, ratio {ratio:.0%}, goal ≥ 50%: "
            f"{'met' if ratio >= 0.5 else 'NOT met'}")
    limited = [name for name, r in (("crr", ramp), ("relay", relay))
               if r["stopped_by"] == "publisher-limited"]
    if limited:
        text += (f" — the publishers could not reach the next step for {' and '.join(limited)}"
                 " (a lower bound there; raise --publishers)")
    return text


def table(res: dict[str, Any]) -> str:
    """The results table: figure | baseline | ratio | goal."""
    rows: list[tuple[str, str, str, str, str]] = []
    relay = res.get("relay")
    if "latency" in res:
        rows += _latency_rows(res["latency"], relay if relay and "latency_p50_ms" in relay
                              else None)
    if "ramp" in res:
        ramp = res["ramp"]
        best = max(s["e2e_rate"] for s in ramp["steps"])
        if relay is not None and relay.get("steps"):
            theirs = relay["max_sustained_offered"]
            rows.append(("max sustained offered load (zero loss)",
                         f"{ramp['max_sustained_offered']:,}/s ({_stop(ramp)})",
                         f"{theirs:,}/s{'+' if relay['ladder_top'] else ''} raw relay, same "
                         f"ladder ({_stop(relay)})",
                         f"{ramp['max_sustained_offered'] / max(theirs, 1):.0%}",
                         "≥ 50% of the relay's"))
        elif "max" in res:
            raw = res["max"]["raw_publish_async_rate"]
            rows.append(("max sustained offered load (zero loss)",
                         f"{ramp['max_sustained_offered']:,}/s", f"{raw:,.0f}/s raw",
                         f"{ramp['max_sustained_offered'] / raw:.0%}", "≥ 20k/s"))
        rows.append(("zero loss: hosts whose snapshot ≠ last report",
                     f"{ramp['hosts_mismatched']} of {ramp['hosts_checked']} (each step)",
                     "—", "", "0"))
        rows.append(("best ramp end-to-end rate", f"{best:,.0f}/s", "", "", ""))
    if "max" in res:
        m = res["max"]
        rows.append(("e2e reports/s into CRR_SNAPSHOT (pre-generated)", f"{m['e2e_rate']:,.0f}/s",
                     f"{m['raw_publish_async_rate']:,.0f}/s raw publish_async",
                     f"{m['e2e_vs_raw']:.0%}", "≥ 40% of raw"))
        rows.append(("crr pipelined publish (same messages)",
                     f"{m['pipeline_publish_rate']:,.0f}/s",
                     f"{m['raw_publish_async_rate']:,.0f}/s raw",
                     f"{m['pipeline_publish_rate'] / m['raw_publish_async_rate']:.0%}", ""))
    if "cold_view" in res:
        v, r = res["cold_view"], res["cold_raw"]
        raw_s = r["seconds"]
        rows.append((f"view cold start, {v['hosts']:,} hosts (best of 3)",
                     f"{v['seconds'] * 1e3:,.0f} ms",
                     f"{raw_s * 1e3:,.0f} ms raw ordered read (best of 3)",
                     f"{v['seconds'] / raw_s:.1f}x", "≤ 2x the raw read"))
        rows.append(("view RSS per host after load (over an idle connected client)",
                     f"{v['rss_delta'] / max(v['hosts'], 1) / 1e3:.2f} kB",
                     _mb(v["rss_delta"]), "", "≤ 3 kB/host"))
    if "projector_rss" in res:
        p = res["projector_rss"]
        phases = [(f" after {after}", res[key]) for key, after in (
            ("projector_rss_after_latency", "the fixed-rate phase"),
            ("projector_rss_after_ramp", "the ramp (overloaded at its top)")) if key in res]
        for after, rss in phases or [("", p["rss"])]:
            rows.append((f"projector RSS{after}, {p['hosts']:,} hosts × {RESOURCES} values",
                         _mb(rss), f"{rss / p['hosts'] / 1e3:.1f} kB/host", "",
                         "≤ 400 MB at 50k"))
    if "select" in res:
        s = res["select"]
        for label, c in s["cases"].items():
            base = f"{c['lambda_per_s'] / 1e6:.2f} M/s lambda"
            if "classad_per_s" in c:
                base += f", {c['classad_per_s'] / 1e6:.2f} M/s ClassAd"
            rows.append((f"select[] {label}, {s['hosts']:,} hosts",
                         f"{c['select_per_s'] / 1e6:.2f} M/s", base,
                         f"{c['select_per_s'] / c['lambda_per_s']:.1f}x lambda", ""))
    rows += restart.table_rows(res)
    rows += rebuild.table_rows(res)
    widths = [max(len(r[k]) for r in [*rows, ("figure", "crr", "baseline", "ratio", "goal")])
              for k in range(5)]
    head = ("figure", "crr", "baseline", "ratio", "goal")
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def plot(res: dict[str, Any], path: Path) -> str:
    """Latency CDF and throughput vs offered load; a message when matplotlib is missing."""
    try:
        import matplotlib as mpl  # noqa: PLC0415 - optional (the `bench` extra)

        mpl.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415 - after choosing the backend
    except ImportError:
        return f"plot skipped: matplotlib is not installed ({install_hint('bench')})"
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    lat = res.get("latency", {}).get("latency_ms", [])
    if lat:
        a.plot(lat, [(k + 1) / len(lat) for k in range(len(lat))], label="crr (view)")
        a.set_xscale("log")
    relay_lat = res.get("relay", {}).get("latency_ms", [])
    if relay_lat:
        a.plot(relay_lat, [(k + 1) / len(relay_lat) for k in range(len(relay_lat))],
               "--", label="raw relay")
        a.legend()
    a.set_xlabel("report → view latency (ms)")
    a.set_ylabel("fraction of reports")
    if "latency" in res:
        a.set_title(f"latency CDF @ {res['latency']['offered_rate']:,.0f} reports/s")
    a.grid(visible=True, which="both", alpha=0.3)
    if "ramp" in res:
        steps = res["ramp"]["steps"]
        xs = [s["offered"] for s in steps]
        b.plot(xs, [s["e2e_rate"] for s in steps], "o-", label="crr end-to-end")
        b.plot(xs, [s["published_rate"] for s in steps], "s--", label="published")
        relay_steps = res.get("relay", {}).get("steps", [])
        if relay_steps:
            b.plot([s["offered"] for s in relay_steps], [s["e2e_rate"] for s in relay_steps],
                   "^-", label="raw relay end-to-end")
        b.plot(xs, xs, ":", color="grey", label="offered")
        if "max" in res:
            b.axhline(res["max"]["raw_publish_async_rate"], color="red", ls="--",
                      label="raw publish_async")
        b.legend()
    b.set_xlabel("offered load (reports/s)")
    b.set_ylabel("achieved (reports/s)")
    b.set_title("throughput vs offered load")
    b.grid(visible=True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return f"plot: {path}"


# -- main -----------------------------------------------------------------------------


async def bench(args: argparse.Namespace) -> int:
    """Run the suite (or the soak) and print the table."""
    plan = QUICK if args.quick else FULL
    skip = set(args.skip or ())
    if args.no_pack:
        plan = Plan(**{**plan.__dict__, "pack": False})
    if args.hosts:
        plan = Plan(**{**plan.__dict__, "hosts": args.hosts})
    if args.publishers:
        plan = Plan(**{**plan.__dict__, "publishers": args.publishers})
    for name in ("rebuild_hosts", "rebuild_events"):
        if getattr(args, name, None):
            plan = Plan(**{**plan.__dict__, name: getattr(args, name)})
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - once, before measuring
    res: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                                       "platform": sys.platform},
                           "plan": plan.__dict__, "quick": args.quick}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="crr-bench-") as store:
        server = NatsServer(store, port=0)
        await asyncio.to_thread(server.start)
        projector: ProjectorProcess | None = None
        try:
            async with connect(server.url, name="crr-bench") as nc:
                await provision(nc)
                catalog = sim_catalog(RESOURCES, plan.latency_interval)
                await nc.jetstream().publish(CATALOG, encode(catalog))
                projector = ProjectorProcess(server.url)
                await wait_projector(nc, 1, 60)
                if args.soak:
                    return await soak(nc, server.url, plan, parse_duration(args.soak),
                                      projector=projector, out_dir=out_dir)
                if "latency" not in skip:
                    log(f"latency: {plan.hosts} hosts @ {plan.latency_interval:g}s for "
                        f"{plan.latency_duration:g}s")
                    res["latency"] = await latency_phase(nc, server.url, plan,
                                                         plan.latency_duration,
                                                         projector=projector)
                    log(f"latency p50 {res['latency']['latency_p50_ms']:.1f} ms, "
                        f"p99 {res['latency']['latency_p99_ms']:.1f} ms")
                    res["projector_rss_after_latency"] = projector.rss
                if "ramp" not in skip:
                    res["ramp"] = await ramp_phase(nc, server.url, plan)
                    res["projector_rss_after_ramp"] = projector.rss
                res["projector_rss"] = {"hosts": plan.hosts, "rss": projector.rss}
                if "max" not in skip:
                    res["max"] = await max_phase(nc, catalog, plan)
                    res["projector_rss_after_max"] = projector.rss
                if "cold" not in skip:
                    log("cold start (child processes; best of 3, alternating)")
                    raws, views = [], []
                    for _ in range(3):
                        raws.append(await asyncio.to_thread(cold_start, server.url, "raw"))
                        views.append(await asyncio.to_thread(
                            cold_start, server.url, "view" if plan.pack else "view-nopack"))
                    res["cold_raw"] = min(raws, key=lambda r: r["seconds"])
                    res["cold_view"] = min(views, key=lambda r: r["seconds"])
                    res["cold_runs"] = {"raw_s": [r["seconds"] for r in raws],
                                        "view_s": [v["seconds"] for v in views],
                                        "view_rss_delta": [v["rss_delta"] for v in views]}
                if "relay" not in skip and not {"latency", "ramp"} <= skip:
                    pad = await relay_pad(nc)
                    projector.stop()  # the relay takes its place (same process layout)
                    projector = None
                    log(f"raw relay (records padded by {pad} bytes)")
                    res["relay"] = await relay_phase(nc, server.url, plan, pad,
                                                     latency="latency" not in skip,
                                                     ramp="ramp" not in skip)
        finally:
            if projector is not None:
                projector.stop()
            await asyncio.to_thread(server.stop)
    if "select" not in skip:
        log(f"select[] over {plan.select_hosts} hosts")
        res["select"] = select_phase(plan.select_hosts)
    if "restart" not in skip:
        log(f"projector restart, {plan.hosts} hosts")
        res["restart"] = await restart.bench_restart(plan.hosts)
    if "rebuild" not in skip:
        log(f"projector rebuild, {plan.rebuild_hosts} hosts × {plan.rebuild_events} events")
        res["rebuild"] = await rebuild.bench_rebuild(plan.rebuild_hosts, plan.rebuild_events,
                                                     log=log)
    res["elapsed_s"] = time.monotonic() - started
    (out_dir / "bench-results.json").write_text(json.dumps(res, indent=1))
    print(table(res))
    verdict = ramp_verdict(res)
    if verdict is not None:
        print(f"\n{verdict}")
    print(f"\nresults: {out_dir / 'bench-results.json'}; {plot(res, out_dir / 'bench-plot.png')}"
          f"; took {res['elapsed_s']:.0f}s")
    return 0 if res.get("ramp", {}).get("hosts_mismatched", 0) == 0 else 1


async def soak(nc: Client, url: str, plan: Plan, duration: float, *,
               projector: ProjectorProcess, out_dir: Path) -> int:
    """The fixed load for `duration` with RSS sampled every 10 s; prints the trend."""
    log(f"soak: {plan.hosts} hosts @ {plan.latency_interval:g}s for {duration:g}s")
    lat = await latency_phase(nc, url, plan, duration, projector=projector,
                              sample_rss=True)
    samples = lat["rss_samples"]
    (out_dir / "bench-soak.json").write_text(json.dumps(lat, indent=1))
    print(f"soak: {lat['events']} reports at {lat['achieved_rate']:,.0f}/s over "
          f"{lat['duration']:.0f}s; latency p50 {lat['latency_p50_ms']:.1f} ms, "
          f"p99 {lat['latency_p99_ms']:.1f} ms")
    print(f"{'t (s)':>7} {'projector RSS':>14} {'view RSS':>13}")
    for s in samples:
        print(f"{s['t']:7.0f} {_mb(s['projector']):>14} {_mb(s['view']):>13}")
    half = [s for s in samples if s["t"] >= samples[-1]["t"] / 2] if samples else []
    if len(half) >= 2:
        dt = (half[-1]["t"] - half[0]["t"]) / 60
        for key in ("projector", "view"):
            slope = (half[-1][key] - half[0][key]) / 1e6 / dt if dt else 0.0
            print(f"{key} RSS trend over the second half: {slope:+.1f} MB/min")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m tests.bench.suite`."""
    parser = argparse.ArgumentParser(prog="python -m tests.bench.suite", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.add_argument("--child", choices=["view", "view-nopack", "raw"], help=argparse.SUPPRESS)
    parser.add_argument("--server", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(asyncio.run(_child_cold_start(args.server, args.child))))
        return 0
    return asyncio.run(bench(args))


run_main: Callable[[list[str] | None], int] = main

if __name__ == "__main__":
    sys.exit(main())
