"""`crr bridge release DOOR [--for DURATION]`: let a held bridge apply what its guard holds.

Without `--for`: the changes held by the current trip, once.  With `--for`: the guard is
off for that long.  An admin event in `CRR_EVENTS` (docs/contract.md), so the history
shows who released what, and when.  `ops/commands/bridge.py` adds it under `crr bridge`
through its hook for whole-cluster doors (`register_bridge`).
"""

from __future__ import annotations

import argparse
from typing import Any

from crr.bridges.release import publish_release
from crr.bus.connection import connect
from crr.schemas.duration import parse_duration
from crr.schemas.subjects import release_subject

DOORS = ("slurm",)
"""The doors with a guard (the cluster-wide ones)."""


def register_bridge(doors: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr bridge release`."""
    p = doors.add_parser(
        "release", parents=[common],
        help="let a held bridge apply the changes its guard holds (an admin event)")
    p.add_argument("target", choices=DOORS, metavar="DOOR",
                   help=f"the bridge to release ({', '.join(DOORS)})")
    p.add_argument("--for", dest="for_seconds", type=parse_duration, default=0.0,
                   metavar="DURATION",
                   help="suspend the guard this long (default: apply the held changes once)")
    p.add_argument("--reason", default=None, help="why, for the record")
    p.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    """Publish the release; say where it went."""
    async with connect(args.server, creds=args.creds, tls_ca=args.tls_ca,
                       name="crr-bridge-release", attempts=3) as nc:
        seq, event = await publish_release(nc, args.target, for_seconds=args.for_seconds,
                                           reason=args.reason)
    how = (f"guard suspended for {event.for_seconds:g}s" if event.for_seconds > 0
           else "the held changes, once")
    print(f"released bridge {args.target}: {how} (by {event.by or '?'}; "
          f"{release_subject(args.target)}, CRR_EVENTS seq {seq})")
    return 0
