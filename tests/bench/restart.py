"""Projector restart: restore from CRR_SNAPSHOT vs a raw read of CRR_SNAPSHOT.

`python -m tests.bench.restart [--hosts N]` (also a phase of `crr bench`)

One embedded server; the catalog and one 20-value report per host (the
`tests.bench.fold` workload), folded and written by a projector that then
stops.  Measured in this process, one after the other, on the same data:

- raw read: an ordered consumer (DeliverLastPerSubject) over CRR_SNAPSHOT
  that does nothing with the records — the floor any restore pays (nats-py's
  plain ordered consumer, the baseline; also on the direct receive path that
  the restore reads through, `crr.bus.natspy.ordered_consumer`, shown beside it);
- restore: a new projector from `run()` until `ready` — it reads its
  records and status, restores its fold state (the host records the status
  covers wait unread, bounded by its `next_due_ts`; their first deadlines
  are read in chunks after ready), folds the (no) events after the status's
  position and writes nothing (checked: its record writes);
- rebuild: the same with restoring switched off (the last event per
  subject of CRR_EVENTS, as before the snapshot was the checkpoint).

Issue 13's target: restore ≤ 1.5× the raw read.  The machine may be shared:
the figures that matter are the ratios, measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client

from crr.bus.connection import connect
from crr.bus.ordered import OrderedReader, StoredMessage
from crr.bus.server import NatsServer
from crr.bus.streams import provision
from crr.projector.service import Projector
from crr.schemas.catalog import ReporterSpec
from crr.schemas.subjects import EVENTS_STREAM, SNAPSHOT_ALL, SNAPSHOT_STREAM
from tests.bench.fold import bench_catalog
from tests.bench.partitions import publish_hosts, running

LONG_LIVED = msgspec.structs.replace(bench_catalog(), reporters={
    "bench": ReporterSpec(type="script", command=["bench.sh"], interval=3600.0)})
"""The `tests.bench.fold` catalog with values that outlive the run (no expiry at restart)."""


async def raw_read(nc: Client, *, direct: bool = False) -> tuple[float, int]:
    """Seconds to read every CRR_SNAPSHOT record (last per subject), and how many.

    `direct`: on the direct receive path (`crr.bus.natspy.ordered_consumer`, as the restore reads),
    else nats-py's plain ordered consumer (the baseline)."""
    count = 0

    def noop(_m: StoredMessage) -> None:
        nonlocal count
        count += 1

    t = time.perf_counter()
    reader = OrderedReader(nc, stream=SNAPSHOT_STREAM, subject=SNAPSHOT_ALL,
                           handler=noop, backpressure=direct, direct=direct)
    await reader.start()
    try:
        await reader.wait_ready(300)
    finally:
        await reader.stop()
    return time.perf_counter() - t, count


async def start_once(nc: Client, *, restore: bool) -> tuple[float, Projector]:
    """Seconds from `run()` until a new projector is ready (then it stops)."""
    gc.collect()
    p = Projector(nc, status_interval=60.0, restore=restore)
    async with running([p]) as seconds:
        pass
    return seconds, p


async def measure(nc: Client, hosts: int, rounds: int = 3) -> dict[str, Any]:
    """The three figures (best of `rounds`), after writing `hosts` records once."""
    await publish_hosts(nc, hosts, LONG_LIVED)
    last = (await nc.jetstream().stream_info(EVENTS_STREAM)).state.last_seq
    first = Projector(nc, status_interval=60.0)
    async with running([first]):
        await first.wait_until(last, timeout=300)
    raw, direct, restored, rebuilt = [], [], [], []
    writes = 0
    records = 0
    for _ in range(rounds):
        seconds, records = await raw_read(nc)
        raw.append(seconds)
        direct.append((await raw_read(nc, direct=True))[0])
        seconds, p = await start_once(nc, restore=True)
        if not p.restored:
            raise RuntimeError(f"the projector did not restore: {p.start_note}")
        writes = max(writes, p.writes - p.status_writes)
        restored.append(seconds)
        seconds, _ = await start_once(nc, restore=False)
        rebuilt.append(seconds)
    out = {"hosts": hosts, "records": records, "raw_read_s": min(raw),
           "raw_direct_read_s": min(direct),
           "restore_s": min(restored), "rebuild_s": min(rebuilt),
           "restore_record_writes": writes}
    out["restore_vs_raw"] = out["restore_s"] / out["raw_read_s"]
    out["rebuild_vs_raw"] = out["rebuild_s"] / out["raw_read_s"]
    out["restore_vs_direct_raw"] = out["restore_s"] / out["raw_direct_read_s"]
    return out


async def bench_restart(hosts: int) -> dict[str, Any]:
    """`measure` on its own embedded server (what `crr bench` calls)."""
    with (tempfile.TemporaryDirectory(prefix="crr-bench-restart-") as store,
          NatsServer(Path(store)) as server):
        async with connect(server.url, name="crr-bench-restart") as nc:
            await provision(nc)
            return await measure(nc, hosts)


def table_rows(res: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """`crr bench` table rows (figure, crr, baseline, ratio, goal) of `res["restart"]`."""
    r = res.get("restart")
    if r is None:
        return []
    return [(f"projector restart (restore), {r['hosts']:,} hosts", f"{r['restore_s']:.2f} s",
             f"{r['raw_read_s']:.2f} s raw read of CRR_SNAPSHOT", f"{r['restore_vs_raw']:.1f}x",
             "≤ 1.5x"),
            ("projector restart (restore), beside a direct-path raw read",
             f"{r['restore_s']:.2f} s", f"{r['raw_direct_read_s']:.2f} s raw read, direct path",
             f"{r['restore_vs_direct_raw']:.1f}x", ""),
            ("projector rebuild from CRR_EVENTS (no restore)", f"{r['rebuild_s']:.2f} s",
             f"{r['raw_read_s']:.2f} s raw read", f"{r['rebuild_vs_raw']:.1f}x", "")]


def render(res: dict[str, Any]) -> str:
    """One line per figure, each beside the raw read."""
    return (f"projector restart, {res['hosts']} hosts x 20 values: restore "
            f"{res['restore_s']:.2f} s ({res['restore_vs_raw']:.2f}x the raw read of "
            f"{res['records']} records, {res['raw_read_s']:.2f} s; "
            f"{res['restore_vs_direct_raw']:.2f}x a direct-path raw read, "
            f"{res['raw_direct_read_s']:.2f} s; record writes "
            f"{res['restore_record_writes']}); rebuild from CRR_EVENTS {res['rebuild_s']:.2f} s "
            f"({res['rebuild_vs_raw']:.2f}x)")


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m tests.bench.restart`."""
    parser = argparse.ArgumentParser(prog="python -m tests.bench.restart", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=50_000)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    res = asyncio.run(bench_restart(args.hosts))
    print(json.dumps(res) if args.json else render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
