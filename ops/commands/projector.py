"""`crr projector`: fold CRR_EVENTS into CRR_SNAPSHOT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
from typing import Any

from crr.bus.connection import connect, display_url
from crr.bus.errors import nats_errors
from crr.bus.retry import START
from crr.bus.streams import StreamSettings, provision
from crr.progress import show_rebuild
from crr.projector.lease import DEFAULT_TTL, Lease, check_server_version
from crr.projector.service import Projector
from crr.runtime.shutdown import STOP_EPILOG, stopping
from crr.schemas.duration import parse_duration
from crr.schemas.errors import CrrError

log = logging.getLogger("crr.projector")

START_PATHS = """\
Fold CRR_EVENTS into CRR_SNAPSHOT.

How it starts:
  restore   from its own CRR_SNAPSHOT records and status (the snapshot is the
            checkpoint), then fold the events after the position they cover;
            after --partitions changed, each new partition restores from the old
            layout's host records.
  rebuild   where it cannot restore (first start over stored events, CRR_SNAPSHOT
            lost, a checkpoint format it does not know, the server lost
            acknowledged messages): fold every event CRR_EVENTS retains, in
            order, then go live.  Meanwhile its status says `rebuilding` with
            progress (crr hosts, /healthz and the status page show it) and no
            record is written, so readers keep the previous snapshot.

Retention: a value whose last report is older than CRR_EVENTS's max age
(--retention) lives only in CRR_SNAPSHOT.  Losing both the snapshot and that
history is the one way to lose a value; size --retention above the longest
declared interval + grace.
"""


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr projector`."""
    p = sub.add_parser("projector", parents=[common], help="run the projector",
                       description=START_PATHS, epilog=STOP_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--retention", default="24h",
                   help="CRR_EVENTS max age when the stream is created (default 24h); size "
                        "it above the longest declared interval + grace (a warning at start "
                        "says when it is not)")
    p.add_argument("--replicas", type=int, default=1, help="stream replicas (3 on a cluster)")
    p.add_argument("--ha", action="store_true",
                   help="high availability: run several; the lease holder writes, the others "
                        "follow as warm standbys and take over within --lease-ttl (+~1s)")
    p.add_argument("--lease-ttl", default=f"{DEFAULT_TTL:g}s",
                   help=f"HA lease time-to-live (default {DEFAULT_TTL:g}s)")
    p.add_argument("--partitions", type=int, default=1,
                   help="number of projector partitions N (CRR_EVENTS stores host events "
                        "with partition(N, host); needs --update on an existing stream)")
    p.add_argument("--partition", type=int, default=None,
                   help="the partition this projector folds, 0..N-1 (with --partitions; "
                        "0 of 1 is one projector, as the systemd template runs it)")
    p.add_argument("--update", action="store_true",
                   help="change an existing stream's settings (e.g. to repartition)")
    p.add_argument("--id", dest="projector_id", default=None,
                   help="projector id in status and lease records (default host-random)")
    p.set_defaults(func=run, serve_metrics=True)


async def run(args: argparse.Namespace) -> int:
    """Run until SIGINT/SIGTERM; reconnects forever."""
    if args.partitions == 1 and args.partition == 0:
        args.partition = None  # "partition 0 of 1" is one projector (the systemd template)
    if args.partitions < 1 or (args.partitions > 1) != (args.partition is not None) or (
            args.partition is not None and not 0 <= args.partition < args.partitions):
        raise CrrError("--partition K (0 <= K < N) goes with --partitions N > 1")
    settings = StreamSettings(events_max_age=parse_duration(args.retention),
                              replicas=args.replicas, partitions=args.partitions)
    async with stopping() as stop, connect(
            args.server, creds=args.creds, tls_ca=args.tls_ca, name="crr-projector",
            attempts=None) as nc:
        if args.update:  # (retried as the projector's own start-up steps are)
            async for attempt in START.retrying(
                    log=log, what="crr projector --update: cannot update the streams yet"):
                with attempt, nats_errors():
                    await provision(nc, settings, update=True)
        pid = args.projector_id or f"{os.uname().nodename}-{secrets.token_hex(3)}"
        lease = None
        if args.ha:
            check_server_version(nc)
            lease = Lease(nc, pid, ttl=parse_duration(args.lease_ttl), partition=args.partition)
        part = ("" if args.partition is None
                else f", partition {args.partition} of {args.partitions}")
        ha = ", HA" if args.ha else ""
        print(f"crr projector: {pid} on {display_url(args.server)}{part}{ha}; folding CRR_EVENTS "
              "into CRR_SNAPSHOT (it creates both streams)", flush=True)
        projector = Projector(nc, settings=settings, projector_id=pid, partition=args.partition,
                              lease=lease, gc_freeze=True)
        # Its loop watches `stop` once the initial load (rebuild or restore) is folded;
        # until then a signal cancels the load.
        stop.serving(when=projector.warm.is_set)
        bar = asyncio.create_task(show_rebuild(lambda: projector.rebuild_progress,
                                               projector.ready))
        try:
            await projector.run(stop)
        finally:
            bar.cancel()
    return 0
