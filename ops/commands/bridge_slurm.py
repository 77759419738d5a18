"""`crr bridge slurm`: keep Slurm's node features and drains in line with crr's exports.

One per cluster, on a host with Slurm operator rights (it runs `scontrol update`).
`ops/commands/bridge.py` adds it under `crr bridge` through its hook for whole-cluster
doors (`register_bridge`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

from crr.bridges.release import listen_releases, running_suspension
from crr.bridges.slurm import DEFAULT_TIMEOUT, SlurmCommands, SlurmDoor
from crr.bridges.slurm_bridge import HEALTH_REPORTER, SlurmBridge
from crr.bridges.slurm_metrics import register_metrics
from crr.bus.connection import Connection, connect
from crr.bus.listen import Listening
from crr.producers.external import ExternalPublisher
from crr.runtime.shutdown import stopping
from crr.schemas.duration import parse_duration
from crr.view.scheduler_view import SchedulerView

log = logging.getLogger("crr.bridge.slurm")


def register_bridge(doors: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr bridge slurm` (called by `ops/commands/bridge.py` with its doors)."""
    p = doors.add_parser(
        "slurm", parents=[common],
        help="Slurm node features and drain state from the catalog's exports (one per "
             "cluster; needs Slurm operator rights)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the scontrol updates each cycle would run; change nothing")
    p.add_argument("--once", action="store_true", help="one reconcile, then exit")
    p.add_argument("--json", action="store_true",
                   help="with --once: print the bridge's status as JSON at the end")
    p.add_argument("--interval", type=parse_duration, default=30.0, metavar="DURATION",
                   help="re-read Slurm at least this often, to repair features a slurmctld "
                        "restart or `scontrol reconfigure` wiped (default 30s)")
    p.add_argument("--min-gap", type=parse_duration, default=0.5, metavar="DURATION",
                   help="at most one reconcile per this long; changes in between are "
                        "folded into the next (default 0.5s)")
    p.add_argument("--timeout", type=parse_duration, default=DEFAULT_TIMEOUT,
                   metavar="DURATION", help="kill a scontrol/sinfo call after this long "
                   f"(default {DEFAULT_TIMEOUT:g}s)")
    p.add_argument("--scontrol", default="scontrol", metavar="PATH", help="scontrol program")
    p.add_argument("--sinfo", default="sinfo", metavar="PATH", help="sinfo program")
    p.add_argument("--read", choices=["scontrol", "sinfo-json"], default="scontrol",
                   help="how nodes are read: `scontrol show node --oneliner` (default; any "
                        "Slurm, fastest) or `sinfo --json` (Slurm >= 21.08)")
    p.add_argument("--no-batch", action="store_true",
                   help="one scontrol call per node instead of hostlist expressions "
                        "(for comparison; slow on large clusters)")
    p.set_defaults(func=run, serve_metrics=True)


async def run(args: argparse.Namespace) -> int:
    """Follow the snapshot until SIGINT/SIGTERM (or one cycle with --once)."""
    commands = SlurmCommands(scontrol=args.scontrol, sinfo=args.sinfo, timeout=args.timeout,
                             reader=args.read)
    door = SlurmDoor(commands, batch=not args.no_batch)
    bridge: SlurmBridge | None = None
    releases: Listening | None = None
    async with stopping() as stop, connect(
            args.server, creds=args.creds, tls_ca=args.tls_ca, name="crr-bridge-slurm",
            attempts=None if not args.once else 3) as nc:
        stop.serving()
        view = SchedulerView(nc, pack_records=not args.once)
        health = ExternalPublisher(nc, reporter=HEALTH_REPORTER)
        await health.start()
        await view.start()
        try:
            await view.wait_ready()
            bridge = SlurmBridge(view, door, interval=args.interval,
                                 min_gap=args.min_gap, dry_run=args.dry_run, out=sys.stdout,
                                 health=health)
            register_metrics(bridge)
            if not args.once:
                releases = await _follow_releases(nc, bridge)
            if not args.once:
                print("crr bridge slurm: following the snapshot"
                      f"{' (dry run)' if args.dry_run else ''}; Ctrl-C to stop",
                      file=sys.stderr, flush=True)
            await bridge.run(stop, once=args.once)
        finally:
            if releases is not None:
                await releases.close()
            await view.stop()
            await health.close()
    if bridge is None:  # stopped before the snapshot was loaded
        return 0
    status = bridge.status_dict()
    if args.once and args.json:
        print(json.dumps(status, sort_keys=True))
    if args.once and not door.status.healthy:
        print(f"crr bridge slurm: error: {door.status.last_error}", file=sys.stderr)
        return 1
    if bridge.status.plan_error:
        print(f"crr bridge slurm: error: {bridge.status.plan_error}", file=sys.stderr)
    return 0


async def _follow_releases(nc: Connection, bridge: SlurmBridge) -> Listening:
    """Listen for `crr bridge release slurm`; resume a `--for` still running."""
    left, by = await running_suspension(nc, "slurm", time.time())
    if left > 0:
        bridge.release(left, by=by)
    return await listen_releases(
        nc, "slurm", lambda e: bridge.release(e.for_seconds, by=e.by))
