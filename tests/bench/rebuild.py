"""Projector rebuild from the retained history of CRR_EVENTS vs a raw ordered read of it.

`python -m tests.bench.rebuild [--hosts N] [--events N] [--rounds N]` (also the
`rebuild` phase of `crr bench`, sized by `--rebuild-hosts` / `--rebuild-events`)

One embedded server; the `tests.bench.fold` catalog with values that outlive the
run, and `events` reports per host published round by round (every host once
per round, as a fleet reports once per interval), pipelined
(`crr.bus.pipeline_publish`).  The reports are mixed: a host's first report and every
`FULL_EVERY`-th after it (phase shifted per host) carry all 20 values, the others
`PARTIAL` alone — so most hosts' last report omits what their full reports said.
A projector (`crr projector`, a child process) folds them live as they arrive and
writes CRR_SNAPSHOT: the restore path's snapshot.  Then, each in a fresh child
process (so its peak RSS, VmHWM, is its own), timed from connected to done:

- raw read (the baseline): nats-py's plain ordered consumer over every message of
  CRR_EVENTS, doing nothing (also on the direct, back-pressured receive path the
  projector reads through, `crr.bus.natspy.ordered_consumer`, shown beside it);
- restore: a projector restarting from that snapshot, until ready and its position
  covers the last event (peak RSS taken once it digested what it restored);
- rebuild: CRR_SNAPSHOT deleted (a lost snapshot), a projector folding the whole
  retained history until ready and its position covers the last event;
  its RSS sampled as it reads (RSS at half the history vs at the end: backpressure
  keeps memory bounded however long the history is).

Checked after every rebuild: every host record equals the restore path's (0 hosts
differ), and the values only full reports carried survive the partial ones after
them (each host's values equal the last full report's, refreshed by the last
partial's).  Issue 27's goals: rebuild ≤ 2× the raw read; rebuild peak RSS ≤ 1.2×
the restore path's.  The machine may be shared: the ratios, measured in the same
run, are the figures that matter.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.js.api import DeliverPolicy

from crr.bus.connection import connect
from crr.bus.follower import read_snapshot_bytes
from crr.bus.ordered import OrderedReader, StoredMessage
from crr.bus.pipeline_publish import PipelinePublisher
from crr.bus.server import NatsServer
from crr.bus.streams import provision
from crr.projector.service import Projector
from crr.schemas.codec import decode, encode
from crr.schemas.errors import CrrError
from crr.schemas.snapshot import HostSnapshot
from crr.schemas.subjects import (
    CATALOG,
    EVENTS_STREAM,
    EVERYTHING,
    SNAPSHOT_STREAM,
    event_subject,
    host_snapshot_subject,
)
from crr.sdk.report_outcome import wait_covered
from tests.bench.fold import N_BOOLEAN, N_NUMERIC, N_SET, N_STRING
from tests.bench.restart import LONG_LIVED

FULL_EVERY = 4
"""A host's report `n` is full when `(n + host index) % FULL_EVERY == 0` (and its first)."""
PARTIAL = ("num00", "num01", "num02")
"""What a partial report carries (3 of the 20 values)."""
OBSERVED = "2027-01-15T08:00:00.000Z"
SAMPLE_EVERY = 0.25
"""Seconds between the rebuilding child's RSS samples."""


def host_name(i: int) -> str:
    """The `i`-th host of the history."""
    return f"node{i:05d}"


def full_values(n: int) -> dict[str, Any]:
    """The 20 values of a host's `n`-th report (what a full report carries; a partial one
    carries the `PARTIAL` ones of these)."""
    values: dict[str, Any] = {f"num{i:02d}": (n * 7 + i) % 1000 + 0.5 for i in range(N_NUMERIC)}
    values.update({f"flag{i}": (n + i) % 2 == 0 for i in range(N_BOOLEAN)})
    values.update({f"text{i}": f"rhel{n % 10}" for i in range(N_STRING)})
    values.update({f"set{i}": ["c4", f"ds{n}", "imagenet"] for i in range(N_SET)})  # sorted
    return values


def is_full(host: int, n: int) -> bool:
    """Whether report `n` of host number `host` carries every value."""
    return n == 0 or (n + host) % FULL_EVERY == 0


class History:
    """The reports of `hosts` hosts × `events` each, as bytes built from per-report
    templates (building 2M JSON documents one by one would take longer than storing them)."""

    def __init__(self, hosts: int, events: int) -> None:
        self.hosts, self.events = hosts, events
        enc = msgspec.json.encode
        self._full = [enc(full_values(n)) for n in range(events)]
        self._partial = [enc({k: full_values(n)[k] for k in PARTIAL}) for n in range(events)]

    def __len__(self) -> int:
        return self.hosts * self.events

    def payload(self, host: int, n: int) -> bytes:
        """Report `n` (seq `n + 1`) of host number `host`."""
        values = self._full[n] if is_full(host, n) else self._partial[n]
        return b"".join((b'{"reporter":"bench","host":"', host_name(host).encode(),
                         b'","boot":"b","seq":', str(n + 1).encode(),
                         b',"observed_at":"', OBSERVED.encode(), b'","values":', values, b"}"))

    def expected(self, host: int) -> dict[str, Any]:
        """What host number `host` must hold at the end: the last full report's values,
        refreshed by the `PARTIAL` values of the last report."""
        last = self.events - 1
        full = max(n for n in range(self.events) if is_full(host, n))
        out = full_values(full)
        out.update({k: full_values(last)[k] for k in PARTIAL})
        return out

    def omitted_hosts(self) -> int:
        """Hosts whose last report was partial (their other values come from earlier)."""
        return sum(not is_full(h, self.events - 1) for h in range(self.hosts))


async def fill(nc: Client, history: History) -> tuple[int, float]:
    """The catalog, then every report round by round, acknowledged; (last seq, reports/s)."""
    await nc.jetstream().publish(CATALOG, encode(LONG_LIVED))
    subjects = [event_subject("report", "bench", host_name(h)) for h in range(history.hosts)]
    t = time.perf_counter()
    async with PipelinePublisher(nc, max_in_flight=4096) as pipe:
        for n in range(history.events):
            for h, subject in enumerate(subjects):
                await pipe.publish(subject, history.payload(h, n))
        await pipe.flush(600.0)
        if pipe.stats.failed or pipe.stats.rejected:
            raise CrrError(f"history not stored: {pipe.stats}")
        last = pipe.stats.last_seq
    return last, len(history) / (time.perf_counter() - t)


def vm_kib(field: str, pid: int | None = None) -> int:
    """A `/proc/<pid>/status` figure in bytes (`VmRSS`, `VmHWM`: the peak RSS)."""
    with open(f"/proc/{pid or os.getpid()}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


# -- the child processes -----------------------------------------------------------------


async def _child_raw(nc: Client, *, direct: bool) -> dict[str, Any]:
    count = 0

    def noop(_m: StoredMessage) -> None:
        nonlocal count
        count += 1

    t = time.perf_counter()
    reader = OrderedReader(nc, stream=EVENTS_STREAM, subject=EVERYTHING, handler=noop,
                           deliver=DeliverPolicy.ALL, backpressure=direct, direct=direct)
    await reader.start()
    try:
        await reader.wait_ready(3600)
    finally:
        await reader.stop()
    return {"seconds": time.perf_counter() - t, "messages": count, "peak_rss": vm_kib("VmHWM")}


async def _child_projector(nc: Client, last: int) -> dict[str, Any]:
    """A projector (as `crr projector` runs it: GC frozen) until ready at `last`; its RSS
    sampled meanwhile against the events it had read."""
    samples: list[tuple[int, int]] = []
    p = Projector(nc, status_interval=1.0, gc_freeze=True, projector_id="bench-rebuild")

    async def sample() -> None:
        while True:
            progress = p.rebuild_progress
            samples.append((progress.folded if progress is not None else -1, vm_kib("VmRSS")))
            await asyncio.sleep(SAMPLE_EVERY)  # sampling cadence, not synchronisation

    stop = asyncio.Event()
    t = time.perf_counter()
    sampler = asyncio.create_task(sample())
    task = asyncio.create_task(p.run(stop))
    try:
        ready = asyncio.create_task(p.ready.wait())
        await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():  # a run that crashed raises here instead of hanging
            ready.cancel()
            task.result()
            raise CrrError("the projector stopped before it was ready")
        await p.wait_until(last, timeout=3600)
        seconds = time.perf_counter() - t
        at_ready = vm_kib("VmHWM")
        # What a restore defers to after ready (first deadlines, digests) is part of its
        # start: wait until the projector has caught up with it before reading the peak.
        for _ in range(6000):  # polls the projector's own state, at most 5 minutes
            if not ((p._fold.lazy is not None and p._fold.lazy.unrefined > 0)
                    or p._writer.written.unhashed):
                break
            await asyncio.sleep(0.05)
        settled = time.perf_counter() - t
    finally:
        sampler.cancel()
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 60)
    return {"seconds": seconds, "settled_s": settled, "peak_rss_at_ready": at_ready,
            "peak_rss": vm_kib("VmHWM"), "restored": p.restored, "start": p.start_note,
            "hosts": p.host_count, "samples": samples}


async def _child(url: str, mode: str, last: int) -> dict[str, Any]:
    async with connect(url, name=f"crr-bench-rebuild-{mode}") as nc:
        await nc.flush()
        if mode == "projector":
            return await _child_projector(nc, last)
        return await _child_raw(nc, direct=mode == "raw-direct")


def child(url: str, mode: str, last: int = 0) -> dict[str, Any]:
    """Run `_child` in a fresh interpreter; its JSON result."""
    out = subprocess.run(
        [sys.executable, "-m", "tests.bench.rebuild", "--child", mode, "--server", url,
         "--last", str(last)],
        stdout=subprocess.PIPE, text=True, timeout=7200, check=True)
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


# -- checks and figures --------------------------------------------------------------------


def compare(reference: dict[str, tuple[int, bytes]], rebuilt: dict[str, tuple[int, bytes]],
            history: History) -> dict[str, Any]:
    """Host records that differ from the restore path's, and hosts whose values are not
    the expected ones (an omitted value lost, or a wrong one)."""
    differ = wrong = lost = 0
    first: str | None = None
    detail: dict[str, list[Any]] = {}
    for h in range(history.hosts):
        subject = host_snapshot_subject(host_name(h))
        ref, got = reference.get(subject), rebuilt.get(subject)
        if ref is None or got is None or ref[1] != got[1]:
            differ += 1
            first = first or host_name(h)
        if got is None:
            lost += 1
            continue
        values = {k: e.value for k, e in decode(got[1], HostSnapshot).values.items()}
        want = history.expected(h)
        if values != want:
            wrong += 1
            lost += bool(set(want) - set(values))
            first = first or host_name(h)
            detail = detail or {k: [want.get(k), values.get(k)] for k in {*want, *values}
                                if want.get(k) != values.get(k)}
    return {"hosts_differing": differ, "hosts_wrong_values": wrong,
            "hosts_missing_values": lost, "first_bad_host": first, "first_bad_values": detail}


def rss_trend(samples: list[list[int]], total: int) -> dict[str, int]:
    """The rebuilding child's RSS at half the history read and at its end (its peak too)."""
    during = [(k, rss) for k, rss in samples if k >= 0]
    half = next((rss for k, rss in during if k >= total // 2), 0)
    end = during[-1][1] if during else 0
    return {"rss_at_half": half, "rss_at_end": end,
            "rss_max_sampled": max((rss for _, rss in during), default=0)}


async def measure(nc: Client, url: str, hosts: int, events: int, *, rounds: int = 1,
                  log: Any = None) -> dict[str, Any]:
    """Fill, fold live, then the raw reads, the restore and the rebuild (best of `rounds`);
    each rebuild checked against the restore path's snapshot and the expected values."""
    say = log or (lambda text: print(text, file=sys.stderr, flush=True))
    history = History(hosts, events)
    live = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crr.cli", "projector", "--server", url,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        last, fill_rate = await fill(nc, history)
        say(f"rebuild: {len(history):,} reports stored ({fill_rate:,.0f}/s); the live "
            "projector folds them")
        t = time.perf_counter()
        await wait_covered(nc, last, None, 3600)
        live_s = time.perf_counter() - t
    finally:
        live.terminate()
        await asyncio.wait_for(live.wait(), 60)
    reference = await read_snapshot_bytes(nc, timeout=600)
    store = (await nc.jetstream().stream_info(EVENTS_STREAM)).state.bytes
    out: dict[str, Any] = {"hosts": hosts, "events_per_host": events, "events": len(history),
                           "events_bytes": store, "fill_rate": fill_rate,
                           "live_catch_up_s": live_s, "omitted_hosts": history.omitted_hosts()}
    raws, directs, restores, rebuilds, checks = [], [], [], [], []
    for k in range(rounds):
        raws.append(await asyncio.to_thread(child, url, "raw"))
        directs.append(await asyncio.to_thread(child, url, "raw-direct"))
        say(f"rebuild round {k + 1}: raw read {raws[-1]['seconds']:.1f} s, direct "
            f"{directs[-1]['seconds']:.1f} s")
        restores.append(await asyncio.to_thread(child, url, "projector", last))
        if not restores[-1]["restored"]:
            raise CrrError(f"the restore path rebuilt: {restores[-1]['start']}")
        await nc.jetstream().delete_stream(SNAPSHOT_STREAM)
        await provision(nc)  # (the projector would create it too)
        rebuilds.append(await asyncio.to_thread(child, url, "projector", last))
        if rebuilds[-1]["restored"]:
            raise CrrError("the rebuild restored from a deleted snapshot")
        checks.append(compare(reference, await read_snapshot_bytes(nc, timeout=600), history))
        say(f"rebuild round {k + 1}: restore {restores[-1]['seconds']:.1f} s, rebuild "
            f"{rebuilds[-1]['seconds']:.1f} s; {checks[-1]}")
    raw = min(raws, key=lambda r: r["seconds"])
    rebuild = min(rebuilds, key=lambda r: r["seconds"])
    restore = min(restores, key=lambda r: r["seconds"])
    out.update({
        "raw_read_s": raw["seconds"], "raw_messages": raw["messages"],
        "raw_direct_read_s": min(d["seconds"] for d in directs),
        "raw_peak_rss": raw["peak_rss"],
        "restore_s": restore["seconds"], "restore_peak_rss": max(r["peak_rss"] for r in restores),
        "restore_peak_rss_at_ready": max(r["peak_rss_at_ready"] for r in restores),
        "rebuild_s": rebuild["seconds"], "rebuild_peak_rss": max(r["peak_rss"] for r in rebuilds),
        "rebuild_start": rebuild["start"],
        "runs": {"raw_s": [r["seconds"] for r in raws],
                 "raw_direct_s": [d["seconds"] for d in directs],
                 "restore_s": [r["seconds"] for r in restores],
                 "rebuild_s": [r["seconds"] for r in rebuilds],
                 "rebuild_peak_rss": [r["peak_rss"] for r in rebuilds]},
        "rss": rss_trend(rebuild["samples"], len(history)),
        "hosts_differing": max(c["hosts_differing"] for c in checks),
        "hosts_wrong_values": max(c["hosts_wrong_values"] for c in checks),
        "hosts_missing_values": max(c["hosts_missing_values"] for c in checks),
        "first_bad_host": next((c["first_bad_host"] for c in checks if c["first_bad_host"]),
                               None),
    })
    out["rebuild_vs_raw"] = out["rebuild_s"] / out["raw_read_s"]
    out["rebuild_vs_raw_direct"] = out["rebuild_s"] / out["raw_direct_read_s"]
    out["rebuild_rss_vs_restore"] = out["rebuild_peak_rss"] / out["restore_peak_rss"]
    return out


async def bench_rebuild(hosts: int, events: int, *, rounds: int = 1,
                        log: Any = None) -> dict[str, Any]:
    """`measure` on its own embedded server (what `crr bench` calls)."""
    with (tempfile.TemporaryDirectory(prefix="crr-bench-rebuild-") as store,
          NatsServer(Path(store)) as server):
        async with connect(server.url, name="crr-bench-rebuild") as nc:
            await provision(nc)
            return await measure(nc, server.url, hosts, events, rounds=rounds, log=log)


def _mb(b: float) -> str:
    return f"{b / 1e6:,.0f} MB"


def table_rows(res: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """`crr bench` table rows (figure, crr, baseline, ratio, goal) of `res["rebuild"]`."""
    r = res.get("rebuild")
    if r is None:
        return []
    size = f"{r['hosts']:,} hosts × {r['events_per_host']} events"
    trend = r["rss"]
    return [
        (f"projector rebuild from CRR_EVENTS, {size}", f"{r['rebuild_s']:.1f} s",
         f"{r['raw_read_s']:.1f} s raw ordered read of the {r['raw_messages']:,} events",
         f"{r['rebuild_vs_raw']:.1f}x", "≤ 2x"),
        ("projector rebuild, beside a direct-path raw read", f"{r['rebuild_s']:.1f} s",
         f"{r['raw_direct_read_s']:.1f} s raw read, direct path",
         f"{r['rebuild_vs_raw_direct']:.1f}x", ""),
        ("projector rebuild peak RSS (VmHWM)", _mb(r["rebuild_peak_rss"]),
         f"{_mb(r['restore_peak_rss'])} restore path ({r['restore_s']:.1f} s)",
         f"{r['rebuild_rss_vs_restore']:.2f}x", "≤ 1.2x"),
        ("projector rebuild RSS at half / end of the history", _mb(trend["rss_at_half"]),
         _mb(trend["rss_at_end"]), "", "flat (bounded)"),
        ("rebuild: hosts ≠ restore path / omitted values lost",
         f"{r['hosts_differing']} / {r['hosts_missing_values']} of {r['hosts']:,} "
         f"({r['omitted_hosts']:,} ended partial)", "—", "", "0 / 0"),
    ]


def render(res: dict[str, Any]) -> str:
    """The rows as lines."""
    return "\n".join("  ".join(c for c in row if c) for row in table_rows({"rebuild": res}))


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m tests.bench.rebuild`."""
    parser = argparse.ArgumentParser(prog="python -m tests.bench.rebuild", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=50_000)
    parser.add_argument("--events", type=int, default=40, help="reports per host")
    parser.add_argument("--rounds", type=int, default=1, help="best of N (raw reads, restores, "
                                                              "rebuilds alternate)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--child", choices=["raw", "raw-direct", "projector"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--server", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--last", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(asyncio.run(_child(args.server, args.child, args.last))))
        return 0
    res = asyncio.run(bench_rebuild(args.hosts, args.events, rounds=args.rounds))
    print(json.dumps(res) if args.json else render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
