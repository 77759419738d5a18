"""`crr sim …`: simulators — `sim scheduler` (here) and `sim reporters` (`sim_reporters.py`).

`crr sim scheduler [--jobs FILE | --generate N] [--duration S]` plays a job
stream (one `select[]` per line) against the LIVE scheduler view, as a
scheduler's placement loop would, and reports decisions/s and the
distribution of candidate counts.  The view keeps applying snapshot changes
while the jobs run (the loop yields to it after every decision).

`crr sim reporters` is `crr.commands.sim_reporters` (its
`add_arguments(parser)` and `async run_reporters(args) -> int`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

from crr.bus.connection import connect
from crr.commands import sim_reporters
from crr.projections.host_table import HostTable
from crr.projections.percentile import percentiles
from crr.projections.record.codes import FRESH
from crr.schemas.catalog import Catalog
from crr.schemas.errors import CrrError, ExpressionError
from crr.view.scheduler_view import SchedulerView, loaded_view


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr sim scheduler` and `crr sim reporters`."""
    p = sub.add_parser("sim", help="simulated reporters and a scheduler simulator")
    sims = p.add_subparsers(dest="sim", metavar="SIMULATOR", parser_class=type(p))
    sims.required = True

    s = sims.add_parser("scheduler", parents=[common],
                        help="play a job stream of select[] expressions against the live view")
    src = s.add_mutually_exclusive_group()
    src.add_argument("--jobs", metavar="FILE", type=Path,
                     help="one select[] expression per line ('-' = stdin; # comments)")
    src.add_argument("--generate", metavar="N", type=int, default=None,
                     help="generate N random jobs from the catalog and the current values "
                          "(default: 1000 when --jobs is not given)")
    s.add_argument("--duration", metavar="S", type=float, default=None,
                   help="replay the jobs in a loop for S seconds (default: one pass)")
    s.add_argument("--seed", type=int, default=1, help="random seed for --generate")
    s.add_argument("--json", action="store_true", help="print the summary as JSON")
    s.set_defaults(func=run_scheduler)

    r = sims.add_parser("reporters", parents=[common],
                        help="simulated reporters for many hosts, publishing through the real bus")
    sim_reporters.add_arguments(r)
    r.set_defaults(func=sim_reporters.run_reporters)


# -- sim scheduler ------------------------------------------------------------


def read_jobs(path: Path) -> list[str]:
    """Expressions from a file, one per line; blank lines and `#` comments skipped."""
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CrrError(f"cannot read jobs file {path}: {exc.strerror}") from None
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def _quote(text: str) -> str:
    return json.dumps(text)


def _fresh_values(table: HostTable, name: str) -> list[Any]:
    """Some fresh values of a host-scope resource (for realistic thresholds and members)."""
    col = table.column(name)
    if col is None:
        return []
    rows = [int(r) for r in table.sorted_rows() if col.state[r] == FRESH][:2000]
    if col.kind == "string":
        pool = table.strings()
        return [pool[int(col.values[r])] for r in rows]
    if col.kind == "string_set":
        return sorted({m for r in rows for m in (col.sets[r] or ())})
    return [col.values[r].item() for r in rows]


def generate_jobs(n: int, catalog: Catalog, table: HostTable, seed: int) -> list[str]:
    """`n` random, well-typed expressions over the catalog's resources and current values.

    Each job is one to three terms joined mostly by `&&`; numeric thresholds,
    strings and set members are drawn from the values the view holds, so the
    candidate counts are spread rather than all or nothing.
    """
    rng = random.Random(seed)  # noqa: S311 - reproducible test data, not security
    samples: dict[str, list[Any]] = {}
    for name, spec in sorted(catalog.resources.items()):
        if spec.scope == "host":
            samples[name] = _fresh_values(table, name)
        else:
            entry = table.cluster_value(name)
            samples[name] = [entry.value] if entry is not None and entry.value is not None else []
    names = sorted(catalog.resources)
    if not names:
        raise CrrError("the catalog has no resources: nothing to generate jobs from")

    def term(name: str) -> str:
        kind = catalog.resources[name].kind
        seen = samples[name]
        if kind == "numeric":
            pick = rng.choice(seen) if seen else float(rng.randint(0, 100))
            op = rng.choice([">", ">=", "<", "<="])
            return f"{name} {op} {math.floor(pick) if math.isfinite(pick) else 0}"
        if kind == "boolean":
            return name if rng.random() < 0.7 else f"!{name}"
        if kind == "string":
            value = rng.choice(seen) if seen else "x"
            return f"{name} {'==' if rng.random() < 0.8 else '!='} {_quote(value)}"
        members = seen or ["x"]
        roll = rng.random()
        if roll < 0.6:
            return f"{name} has {_quote(rng.choice(members))}"
        if roll < 0.8:
            picked = rng.sample(members, min(len(members), 2))
            op = "has_any" if rng.random() < 0.5 else "has_all"
            return f"{name} {op} [{', '.join(_quote(m) for m in picked)}]"
        return f"count({name}) >= {rng.randint(0, 3)}"

    jobs = []
    for _ in range(n):
        terms = [term(rng.choice(names)) for _ in range(rng.choice([1, 1, 2, 2, 3]))]
        joined = terms[0]
        for t in terms[1:]:
            joined += f" {'&&' if rng.random() < 0.8 else '||'} {t}"
        jobs.append(joined)
    return jobs


async def play(view: SchedulerView, jobs: list[str], duration: float | None) -> dict[str, Any]:
    """Run `jobs` (one pass, or in a loop for `duration` s) and summarise the decisions."""
    counts: list[int] = []
    invalid: dict[str, str] = {}
    started = time.perf_counter()
    deadline = None if duration is None else started + duration
    busy = 0.0
    i = 0
    while jobs:
        if deadline is None and i >= len(jobs):
            break
        if deadline is not None and time.perf_counter() >= deadline:
            break
        expr = jobs[i % len(jobs)]
        i += 1
        if expr in invalid:
            continue
        t0 = time.perf_counter()
        try:
            hosts = view.select(expr)
        except ExpressionError as exc:
            invalid[expr] = exc.pretty()
            continue
        busy += time.perf_counter() - t0
        counts.append(len(hosts))
        await asyncio.sleep(0)  # let the view apply live snapshot changes between decisions
    elapsed = time.perf_counter() - started
    counts.sort()
    p50, p90 = percentiles(counts, (50, 90)) if counts else (0, 0)
    return {
        "hosts": len(view.table),
        "jobs": len(jobs),
        "decisions": len(counts),
        "invalid_jobs": len(invalid),
        "elapsed_s": round(elapsed, 3),
        "decisions_per_s": round(len(counts) / busy, 1) if busy > 0 else None,
        "wall_decisions_per_s": round(len(counts) / elapsed, 1) if elapsed > 0 else None,
        "candidates": {
            "min": counts[0] if counts else 0,
            "p50": p50,
            "p90": p90,
            "max": counts[-1] if counts else 0,
            "mean": round(sum(counts) / len(counts), 1) if counts else 0,
            "zero": sum(1 for c in counts if c == 0),
        },
        "view_position": view.position,
        "errors": list(invalid.values())[:5],
    }


def render(summary: dict[str, Any]) -> str:
    """The summary for people."""
    c = summary["candidates"]
    lines = [
        f"hosts in view      {summary['hosts']}",
        f"jobs               {summary['jobs']} ({summary['invalid_jobs']} invalid)",
        f"decisions          {summary['decisions']} in {summary['elapsed_s']} s",
        f"decisions/s        {summary['decisions_per_s']} (select only); "
        f"{summary['wall_decisions_per_s']} wall-clock",
        f"candidates/job     min {c['min']}  p50 {c['p50']}  p90 {c['p90']}  max {c['max']}  "
        f"mean {c['mean']}",
        f"zero-candidate     {c['zero']} of {summary['decisions']} decisions",
    ]
    for err in summary["errors"]:
        lines.append("invalid job: " + err.replace("\n", "\n  "))
    return "\n".join(lines)


async def run_scheduler(args: argparse.Namespace) -> int:
    """Load the live view, build or read the jobs, play them, print the summary."""
    if args.generate is not None and args.generate < 1:
        raise CrrError("--generate needs a positive number of jobs")
    if args.duration is not None and args.duration <= 0:
        raise CrrError("--duration must be positive")
    file_jobs = read_jobs(args.jobs) if args.jobs is not None else None
    async with (connect(args.server, creds=args.creds, tls_ca=args.tls_ca,
                        name="crr-sim-scheduler") as nc,
                loaded_view(nc) as view):
        if view.catalog is None:
            raise CrrError("no catalog in CRR_SNAPSHOT yet: apply one with `crr catalog apply`")
        jobs = file_jobs if file_jobs is not None else generate_jobs(
            args.generate or 1000, view.catalog, view.table, args.seed)
        if not jobs:
            raise CrrError(f"no jobs in {args.jobs}")
        summary = await play(view, jobs, args.duration)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(render(summary))
    return 1 if summary["decisions"] == 0 else 0
