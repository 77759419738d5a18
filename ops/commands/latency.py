"""`crr latency`: per reporter p50/p95/p99 of observed → stored → snapshot, as a table.

The table is rendered here; the figures come from `crr.history.latency`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import msgspec

from crr.bus.connection import connect
from crr.history.latency import ReporterLatency, measure
from crr.schemas.duration import parse_duration


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def render(rows: list[ReporterLatency]) -> str:
    """A table in milliseconds: per reporter, each leg's p50/p95/p99 and sample count."""
    head = ["REPORTER", "REPORTS"]
    for leg in ("OBSERVED→STORED", "STORED→SNAPSHOT", "OBSERVED→SNAPSHOT"):
        head += [f"{leg} p50", "p95", "p99", "n"]
    cells = [head]
    for r in rows:
        line = [r.reporter, str(r.reports)]
        for p in (r.observed_to_stored, r.stored_to_snapshot, r.observed_to_snapshot):
            line += [_ms(p.p50), _ms(p.p95), _ms(p.p99), str(p.n)]
        cells.append(line)
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines = ["  ".join(v.rjust(w) if i else v.ljust(w)
                       for i, (v, w) in enumerate(zip(c, widths, strict=True))).rstrip()
             for c in cells]
    notes = [f"{r.reporter}: {r.note}" for r in rows if r.note]
    return "\n".join([*lines, "(milliseconds)", *notes])


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr latency`."""
    p = sub.add_parser("latency", parents=[common],
                       help="per reporter p50/p95/p99 of observed→stored→snapshot latency")
    p.add_argument("--since", default="15m",
                   help="reports stored within this long ago (default 15m)")
    p.add_argument("--watch", type=float, default=0.0, metavar="S",
                   help="also follow both streams live for S seconds (every new report timed)")
    p.add_argument("--reporter", action="append", default=None, metavar="NAME",
                   help="only this reporter (repeatable)")
    p.add_argument("--json", action="store_true", help="a JSON array, one object per reporter")
    p.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    """Print the table or JSON."""
    since = parse_duration(args.since.removeprefix("-"))  # `15m` and `-15m` both mean ago
    async with connect(args.server, creds=args.creds, tls_ca=args.tls_ca,
                       name="crr-latency") as nc:
        rows = await measure(nc, since=since, watch=args.watch,
                             reporters=set(args.reporter) if args.reporter else None)
    if args.json:
        sys.stdout.buffer.write(msgspec.json.encode(rows) + b"\n")
    elif not rows:
        print(f"no reports stored in the last {args.since}")
    else:
        print(render(rows))
    return 0
