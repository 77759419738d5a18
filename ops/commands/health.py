"""`crr health [--json]`: reporters × hosts with their state; exit 1 when any is failing.

Usable from monitoring (Nagios-style checks, cron): the exit status says
whether any reporter is failing (failed, timeout, bad_output, crashed,
quarantined, silent, rejecting, a bridge `held` by its guard, or missing declared
resources) or the projector is silent or absent (`crr.projections.freshness`: then
nobody marks reporters silent either); the output says which, failing rows first (in red
on a terminal), and ends with the projector's liveness (on stderr with
`--json`, whose stdout stays the array of rows).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from typing import Any

import msgspec

from crr.admin.liveness import judgement, liveness_now, warn_if_holding, warn_unless_live
from crr.admin.reporter_health import ReporterHealth, reporter_rows, with_deadletters
from crr.bus.connection import connect
from crr.bus.errors import describe, nats_errors
from crr.projector.deadletters import count_deadletters, read_deadletters
from crr.schemas.duration import parse_duration
from crr.schemas.errors import BusError
from crr.view.snapshot_reader import read_snapshot

log = logging.getLogger("crr.health")

_RED = "\x1b[1;31m"
_RESET = "\x1b[0m"
_MIN_DETAIL = 20
_DEADLETTER_WINDOW = 3600.0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr health`."""
    p = sub.add_parser("health", parents=[common],
                       help="reporter health per host and projector liveness; exit 1 when any "
                        "reporter is failing or the projector is silent")
    p.add_argument("--json", action="store_true",
                   help="a JSON array of {reporter, host, state, failing, since, detail, …}")
    p.add_argument("--reporter", action="append", default=None, metavar="NAME",
                   help="only this reporter (repeatable)")
    p.add_argument("--deadletters-since", type=parse_duration, default=_DEADLETTER_WINDOW,
                   metavar="DURATION", help="count dead letters of this long ago and since "
                   "(default 1h; the DEAD column and `deadletters` in --json)")
    p.set_defaults(func=run)


def render(rows: list[ReporterHealth], *, color: bool, width: int | None = None) -> str:
    """A table: REPORTER HOST STATE SINCE EXIT REJECTED DEAD DETAIL, failing rows highlighted.

    REJECTED is `last/total` (the latest report's, and since the reporter's first event);
    DETAIL starts with the declared resources it misses, if any, and is cut to fit
    `width` columns (the terminal's; None: never cut).
    """
    header = ("REPORTER", "HOST", "STATE", "SINCE", "EXIT", "REJECTED", "DEAD", "DETAIL")
    cells = [header]
    for r in rows:
        detail = " ".join((r.detail or "; ".join(r.rejections) or r.last_deadletter
                           or "").split())
        if r.missing:
            detail = f"missing {', '.join(r.missing)}" + (f"; {detail}" if detail else "")
        cells.append((r.reporter, r.host if r.host is not None else "(cluster)", r.state,
                      r.since or "-", "-" if r.exit_code is None else str(r.exit_code),
                      f"{r.rejected}/{r.rejected_total}",
                      str(r.deadletters) if r.deadletters else "-", detail))
    widths = [max(len(c[i]) for c in cells) for i in range(len(header) - 1)]
    room = None if width is None else max(_MIN_DETAIL, width - sum(widths) - 2 * len(widths))
    lines = []
    for i, c in enumerate(cells):
        detail = c[-1]
        if room is not None and len(detail) > room:
            detail = detail[:room - 1] + "…"
        line = "  ".join(v.ljust(w) for v, w in zip(c, widths, strict=False)) + "  " + detail
        line = line.rstrip()
        if color and i > 0 and rows[i - 1].failing:
            line = _RED + line + _RESET
        lines.append(line)
    failing = sum(r.failing for r in rows)
    lines.append(f"{failing} failing of {len(rows)} reporter(s) × host(s)")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> int:
    """Print the rows; 1 when any reporter is failing, else 0."""
    async with connect(args.server, creds=args.creds, tls_ca=args.tls_ca,
                       name="crr-health") as nc:
        contents = await read_snapshot(nc)
        try:
            window = getattr(args, "deadletters_since", _DEADLETTER_WINDOW)
            with nats_errors():
                letters = await read_deadletters(nc, time.time() - window)
        except (BusError, TimeoutError) as exc:
            print(f"crr health: dead letters not read ({describe(exc)})", file=sys.stderr)
            letters = []
    live = (warn_unless_live(contents.projectors, "health") if args.json
            else liveness_now(contents.projectors))
    judged = judgement(contents.projectors, contents.catalog)
    if args.json:
        warn_if_holding(judged, "health")
    rows = with_deadletters(reporter_rows(contents.hosts.values(), contents.cluster),
                            count_deadletters(letters))
    if args.reporter:
        rows = [r for r in rows if r.reporter in set(args.reporter)]
    if args.json:
        sys.stdout.buffer.write(msgspec.json.encode(rows) + b"\n")
    else:
        if not rows:
            print("no reporter has reported yet (is a projector running, and a catalog applied?)")
        else:
            tty = sys.stdout.isatty()
            print(render(rows, color=tty,
                         width=shutil.get_terminal_size().columns if tty else None))
        print(f"projector: {live.detail}")
        if judged.detail:  # holding at the watermark, or past outage_hold
            print(f"freshness: {judged.detail}")
    return 1 if live.state != "live" or any(r.failing for r in rows) else 0
