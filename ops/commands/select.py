"""`crr select EXPR [--json]`: the hosts that match a `select[]` expression now (judged at
the projector's watermark: a warning line on stderr says when it is holding)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from crr.admin.liveness import warn_if_holding, warn_unless_live
from crr.bus.connection import connect
from crr.view.scheduler_view import loaded_view


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr select`."""
    p = sub.add_parser("select", parents=[common],
                       help="hosts matching a select[] expression (bare, select[...], or a "
                            "whole LSF requirement string)")
    p.add_argument("expr", metavar="EXPR",
                   help="e.g. 'scratch_free > 100 && datasets has \"c4\"', or what you give "
                        "bsub -R: 'select[...] rusage[...] order[...]' (only the select "
                        "section is evaluated; a note on stderr names the others)")
    p.add_argument("--json", action="store_true", help="a JSON array of host names, sorted")
    p.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    """Load the snapshot once, evaluate, print the sorted host names."""
    async with (connect(args.server, creds=args.creds, tls_ca=args.tls_ca,
                        name="crr-select") as nc,
                loaded_view(nc) as view):
        compiled = view.compile(args.expr)
        judged = view.judgement()
        hosts = view.select(compiled, judged.now)  # judged at judged.judged_at
        warn_unless_live(view.projectors, "select")
        warn_if_holding(judged, "select")
    if compiled.note:
        print(f"crr select: note: {compiled.note}", file=sys.stderr)
    if args.json:
        print(json.dumps(hosts))
    elif hosts:
        print("\n".join(hosts))
    return 0
