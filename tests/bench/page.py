"""Benchmark of the status page's server side (a command, not a test).

    python -m tests.bench.page [--hosts 50000] [--events 14400]

The host table (`crr.rest.host_query.query`: one page of 60 rows, several
filters and sorts) and the summary over `--hosts` synthetic hosts, beside a
baseline measured in the same run: encoding every host record, which is
what a page that loads all hosts (the earlier status page, `/v1/hosts`)
pays before it shows anything.  And a host's timeline over `--events`
events (24 h of three reporters every 18 s) beside `crr replay --at` of the
same events (one cut).  Times are the mean of 5 runs; the machine may be
shared, so compare the ratios.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import msgspec

from crr.projections.envelope import Envelope
from crr.projections.history import CapturePoint, Replay
from crr.projections.host_table import HostTable
from crr.projections.timeline import replay_timeline
from crr.rest.host_query import HostFacts, query, summarize
from crr.schemas.catalog_loader import load_catalog_text
from crr.schemas.codec import encode
from crr.schemas.snapshot import AsOf, HostSnapshot, ReporterStatus, ValueEntry
from crr.schemas.subjects import CATALOG, event_subject
from crr.schemas.wire_time import format_time

CATALOG_YAML = """
version: 1
resources:
  scratch_free: {kind: numeric, reporter: scratch}
  datasets:     {kind: string_set, reporter: datasets}
  blink:        {kind: numeric, reporter: blinker}
reporters:
  scratch:  {type: script, command: [s], interval: 6s}
  datasets: {type: script, command: [d], interval: 6s}
  blinker:  {type: script, command: [b], interval: 6s}
"""


def _mean(f: Callable[[], Any], n: int = 5) -> float:
    f()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n


def _hosts(n: int, now: float) -> list[HostSnapshot]:
    later, past = format_time(now + 3600), format_time(now - 10)
    out = []
    for i in range(n):
        def entry(value: Any, reporter: str, expires: str = later) -> ValueEntry:
            return ValueEntry(value=value, state="fresh", reporter=reporter, observed_at=later,
                              received_at=later, expires_at=expires)
        out.append(HostSnapshot(
            host=f"node{i:05d}", as_of=AsOf(seq=i, time=later),
            values={"scratch_free": entry(float(i % 977), "scratch",
                                          later if i % 50 else past),
                    "datasets": entry(["c4", "x"], "datasets"), "blink": entry(1.0, "blinker")},
            reporters={"scratch": ReporterStatus(state="ok"),
                       "datasets": ReporterStatus(state="failed" if i % 97 == 0 else "ok")}))
    return out


def bench_table(n: int) -> None:
    """The host table and summary at `n` hosts."""
    now = time.time()
    catalog = load_catalog_text(CATALOG_YAML)
    table = HostTable(catalog)
    table.load(_hosts(n, now))
    facts = HostFacts()
    res = sorted(catalog.resources)

    def every() -> list[HostSnapshot]:
        return [s for s in map(table.get, table.hosts()) if s is not None]

    base = _mean(lambda: msgspec.json.encode(every()))
    print(f"{n} hosts; baseline, every record encoded: {base * 1000:.1f} ms")
    cases: list[tuple[str, dict[str, Any]]] = [
        ("page by host", {}), ("page by -scratch_free", {"sort": "-scratch_free"}),
        ("page match=node1*", {"match": "node1*"}), ("page status=stale", {"status": "stale"}),
        ("page reporter_state=failing sort=status",
         {"reporter_state": "failing", "sort": "status"})]
    for label, kw in cases:
        dt = _mean(lambda kw=kw: msgspec.json.encode(  # type: ignore[misc]
            query(table, facts, time.time(), resources=res, limit=60, **kw)))
        print(f"  {label}: {dt * 1000:.1f} ms ({dt / base:.2f}x the baseline)")
    dt = _mean(lambda: summarize(table, facts, time.time()))
    print(f"  summary: {dt * 1000:.1f} ms ({dt / base:.2f}x the baseline)")


def bench_timeline(n: int) -> None:
    """A host's timeline over `n` events."""
    base_t = 1_800_000_000.0
    catalog = load_catalog_text(CATALOG_YAML)
    envs = [Envelope(seq=1, subject=CATALOG, received_at=base_t - 1, data=encode(catalog))]
    values: dict[str, dict[str, Any]] = {
        "scratch": {"scratch_free": 1.0}, "datasets": {"datasets": ["c4"]},
        "blinker": {"blink": 1.0}}
    for i in range(n):
        rep = ("scratch", "datasets", "blinker")[i % 3]
        body = {"reporter": rep, "host": "h", "boot": "b", "seq": i,
                "observed_at": "2027-01-15T08:00:00.000Z",
                "values": {**values[rep], **({"scratch_free": float(i)} if i % 3 == 0 else {})}}
        envs.append(Envelope(seq=i + 2, subject=event_subject("report", rep, "h"),
                             received_at=base_t + i * 6.0, data=json.dumps(body).encode()))
    until = base_t + n * 6.0

    def one_cut() -> None:
        replay = Replay([CapturePoint(time=until)], hosts=["h"])
        for env in envs:
            replay.feed(env)
        replay.finish()

    base = _mean(one_cut, 2)
    dt = _mean(lambda: replay_timeline("h", envs, base_t, until), 2)
    print(f"timeline of one host, {n} events: {dt * 1000:.0f} ms; crr replay --at of the "
          f"same events {base * 1000:.0f} ms ({dt / base:.1f}x)")


def main() -> None:
    """Run both benchmarks."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=50_000)
    p.add_argument("--events", type=int, default=14_400)
    args = p.parse_args()
    bench_table(args.hosts)
    bench_timeline(args.events)


if __name__ == "__main__":
    main()
