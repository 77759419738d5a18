"""`crr explain EXPR --host H [--json]`: why a host matches a `select[]` expression or not."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import msgspec

from crr.admin.liveness import warn_if_holding, warn_unless_live
from crr.bus.connection import connect
from crr.schemas.errors import CrrError
from crr.view.scheduler_view import loaded_view


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr explain`."""
    p = sub.add_parser("explain", parents=[common],
                       help="why a host matches a select[] expression or not")
    p.add_argument("expr", metavar="EXPR",
                   help="a select[] expression (bare, select[...], or a whole LSF requirement "
                        "string: only its select section is evaluated)")
    p.add_argument("--host", required=True, help="the host to explain")
    p.add_argument("--json", action="store_true",
                   help="the explanation as JSON (terms, values, freshness, verdict)")
    p.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    """Load the snapshot once and explain the verdict for one host."""
    async with (connect(args.server, creds=args.creds, tls_ca=args.tls_ca,
                        name="crr-explain") as nc,
                loaded_view(nc) as view):
        if args.host not in view.table:  # as `crr hosts HOST` says it: not "not selected"
            raise CrrError(f"no snapshot for host(s): {args.host}")
        judged = view.judgement()
        why = view.explain(args.expr, args.host, judged.now)
        note = view.compile(args.expr).note
        warn_unless_live(view.projectors, "explain")
        warn_if_holding(judged, "explain")
    if note:
        print(f"crr explain: note: {note}", file=sys.stderr)
    if args.json:
        sys.stdout.buffer.write(msgspec.json.encode(why) + b"\n")
    else:
        print(why.render())
    return 0
