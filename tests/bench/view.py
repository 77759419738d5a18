"""Benchmark of the scheduler view against a real embedded nats-server (a command, not a test).

    python -m tests.bench.view [--hosts 50000] [--select-hosts 10000] [--updates 20000]

Fills CRR_SNAPSHOT directly (catalog + N HostSnapshots, as the projector
would write them) and prints, each beside a baseline measured in the same
run, and the ratio:

- cold start: `SchedulerView` start → ready, vs a raw ordered consumer that
  only counts the same messages (goal ≤ 2×);
- apply rate: host updates/s through the view's live apply path (the lean
  decode, staging, and the staged rows written to the columns, as a query
  writes them) vs a full `HostSnapshot` decode alone, in process; and
  live, with updates published while the view runs, vs a raw counting
  consumer on the same updates;
- `crr select … --json` end to end (a new process: start-up, connect, load,
  evaluate, print) at `--select-hosts` hosts, vs `crr hosts --json` (the
  plain snapshot read) and the bare interpreter start-up.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from crr.bus.connection import connect
from crr.bus.ordered import StoredMessage, parse_ack_reply
from crr.bus.server import NatsServer
from crr.bus.streams import provision
from crr.schemas.codec import DECODERS, encode
from crr.schemas.snapshot import HostSnapshot
from crr.schemas.subjects import (
    SNAPSHOT_ALL,
    SNAPSHOT_CATALOG,
    SNAPSHOT_STREAM,
    host_snapshot_subject,
)
from crr.view.scheduler_view import SchedulerView
from tests.bench.select import CATALOG, make_hosts

WINDOW = 2000
SELECT_EXPR = 'site_ok && scratch_free > 200 && datasets has "imagenet" && os == "rhel9"'


async def publish_all(nc: Client, items: list[tuple[str, bytes]]) -> float:
    """Publish (acked) in windows; returns the seconds it took."""
    js = nc.jetstream(timeout=30.0)
    start = time.perf_counter()
    for i in range(0, len(items), WINDOW):
        await asyncio.gather(*(js.publish(s, d) for s, d in items[i:i + WINDOW]))
    return time.perf_counter() - start


def host_records(start: int, stop: int, seed: int) -> list[tuple[str, bytes]]:
    """Encoded HostSnapshot records for hosts `start`..`stop-1` (names node00000…)."""
    snaps, _ = make_hosts(stop, seed)
    return [(host_snapshot_subject(s.host), encode(s)) for s in snaps[start:stop]]


async def raw_read(nc: Client, expected_last: int) -> float:
    """Seconds for a bare ordered consumer to receive the stream up to `expected_last`."""
    done = asyncio.Event()
    count = 0

    async def on_msg(msg: Msg) -> None:
        nonlocal count
        count += 1
        seq, _, pending = parse_ack_reply(msg.reply)
        if pending == 0 or seq >= expected_last:
            done.set()

    start = time.perf_counter()
    sub = await nc.jetstream().subscribe(
        SNAPSHOT_ALL, stream=SNAPSHOT_STREAM, cb=on_msg, ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.LAST_PER_SUBJECT),
        idle_heartbeat=2.0, pending_msgs_limit=1_000_000,
        pending_bytes_limit=1024 * 1024 * 1024)
    await asyncio.wait_for(done.wait(), 300)
    elapsed = time.perf_counter() - start
    await sub.unsubscribe()
    return elapsed


async def view_cold_start(nc: Client, hosts: int) -> float:
    """Seconds from `SchedulerView.start()` to ready; checks every host is there."""
    view = SchedulerView(nc)
    start = time.perf_counter()
    await view.start()
    await view.wait_ready(300)
    elapsed = time.perf_counter() - start
    assert len(view.table) == hosts, (len(view.table), hosts)
    await view.stop()
    return elapsed


def best(xs: list[float]) -> float:
    """Best (lowest) of repeated timings."""
    return min(xs)


def line(label: str, value: float, unit: str, base_label: str, base: float) -> None:
    """One figure beside its baseline and the ratio."""
    print(f"  {label:<34} {value:>12,.3f} {unit:<10} | {base_label:<30} {base:>12,.3f} "
          f"{unit:<10} | ratio {value / base:.2f}")


def apply_in_process(records: list[tuple[str, bytes]]) -> tuple[float, float]:
    """(view apply updates/s, decode-only updates/s) over the same records, in process."""
    view = SchedulerView(None)  # type: ignore[arg-type]  # the apply path does no IO
    view.table.set_catalog(CATALOG)
    view.catalog = CATALOG
    # More records pending behind each (the view applies them in batches), none after the last.
    msgs = [StoredMessage(i + 1, 0.0, s, d, None, len(records) - i - 1)
            for i, (s, d) in enumerate(records)]
    dec = DECODERS[HostSnapshot]
    apply_times, decode_times = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        for m in msgs:
            view._live_record(m)  # measuring the live apply path itself
        view.table.apply_staged()  # what the next query would do
        apply_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for m in msgs:
            dec.decode(m.data)
        decode_times.append(time.perf_counter() - t0)
    return len(msgs) / best(apply_times), len(msgs) / best(decode_times)


async def live_apply(nc: Client, updates: list[tuple[str, bytes]]) -> tuple[float, float]:
    """(view updates/s, raw counting consumer updates/s) while `updates` are published."""
    view = SchedulerView(nc)
    await view.start()
    await view.wait_ready(300)
    raw_count = 0
    raw_done = asyncio.Event()
    target = len(updates)

    async def on_raw(_msg: Msg) -> None:
        nonlocal raw_count
        raw_count += 1
        if raw_count >= target:
            raw_done.set()

    info = await nc.jetstream().stream_info(SNAPSHOT_STREAM)
    first = info.state.last_seq + 1
    sub = await nc.jetstream().subscribe(
        SNAPSHOT_ALL, stream=SNAPSHOT_STREAM, cb=on_raw, ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                              opt_start_seq=first),
        idle_heartbeat=2.0, pending_msgs_limit=1_000_000,
        pending_bytes_limit=1024 * 1024 * 1024)
    view_done = asyncio.Event()
    last = first + target - 1
    view_t: list[float] = []
    raw_t: list[float] = []

    def on_view(_subject: str) -> None:
        if view.position >= last and not view_done.is_set():
            view_t.append(time.perf_counter())
            view_done.set()

    unsubscribe = view.subscribe(on_view)
    start = time.perf_counter()
    await publish_all(nc, updates)
    await asyncio.wait_for(raw_done.wait(), 300)
    raw_t.append(time.perf_counter())
    await asyncio.wait_for(view_done.wait(), 300)
    unsubscribe()
    await sub.unsubscribe()
    await view.stop()
    return target / (view_t[0] - start), target / (raw_t[0] - start)


def cli_time(args: list[str], runs: int = 3) -> float:
    """Median wall seconds of `python -m crr.cli ARGS` (stdout discarded)."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "crr.cli", *args], check=True,
                       stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interpreter_time(runs: int = 3) -> float:
    """Median wall seconds of a bare `python -c pass` (start-up floor)."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def bench(hosts: int, select_hosts: int, updates: int, seed: int, store: Path) -> int:
    """Run every measurement; returns the exit status."""
    select_hosts = min(select_hosts, hosts)
    with NatsServer(store) as server:
        async with connect(server.url, name="bench-view") as nc:
            await provision(nc)
            await publish_all(nc, [(SNAPSHOT_CATALOG, encode(CATALOG))])
            print(f"filling CRR_SNAPSHOT with {select_hosts} host snapshots …", flush=True)
            await publish_all(nc, host_records(0, select_hosts, seed))

            print(f"\n`crr select` end to end at {select_hosts} hosts "
                  "(new process each time, median of 3)")
            url = ["--server", server.url]
            t_select = cli_time(["select", SELECT_EXPR, "--json", *url])
            t_hosts = cli_time(["hosts", "--json", *url])
            t_python = interpreter_time()
            line("crr select EXPR --json", t_select, "s", "crr hosts --json", t_hosts)
            line("crr select EXPR --json", t_select, "s", "python -c pass", t_python)

            if hosts > select_hosts:
                print(f"\nfilling CRR_SNAPSHOT up to {hosts} host snapshots …", flush=True)
                await publish_all(nc, host_records(select_hosts, hosts, seed))
            info = await nc.jetstream().stream_info(SNAPSHOT_STREAM)
            last = info.state.last_seq

            print(f"\ncold start over {hosts} hosts + catalog ({info.state.messages} records; "
                  "best of 3, alternating)")
            raw_times, view_times = [], []
            for _ in range(3):
                raw_times.append(await raw_read(nc, last))
                view_times.append(await view_cold_start(nc, hosts))
            line("view start → ready", best(view_times), "s",
                 "raw ordered consumer (count)", best(raw_times))
            print(f"  view records/s {info.state.messages / best(view_times):,.0f}   "
                  f"raw records/s {info.state.messages / best(raw_times):,.0f}   "
                  f"(goal: ratio ≤ 2)")

            print(f"\napply rate ({updates} host updates)")
            recs = host_records(0, min(updates, hosts), seed + 1)
            recs = (recs * (updates // max(1, len(recs)) + 1))[:updates]
            view_rate, decode_rate = apply_in_process(recs)
            line("view apply path (updates/s)", view_rate, "/s",
                 "full decode only (updates/s)", decode_rate)
            live_view, live_raw = await live_apply(nc, recs)
            line("live: view applied (updates/s)", live_view, "/s",
                 "live: raw consumer (updates/s)", live_raw)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m tests.bench.view`."""
    parser = argparse.ArgumentParser(prog="python -m tests.bench.view", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=50_000, help="hosts for the cold start")
    parser.add_argument("--select-hosts", type=int, default=10_000,
                        help="hosts in the stream when `crr select` is timed")
    parser.add_argument("--updates", type=int, default=20_000, help="host updates to apply")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="crr-bench-view-") as tmp:
        return asyncio.run(bench(args.hosts, args.select_hosts, args.updates, args.seed,
                                 Path(tmp) / "store"))


if __name__ == "__main__":
    sys.exit(main())
