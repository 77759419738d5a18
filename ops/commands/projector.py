"""`crr projector`: fold CRR_EVENTS into CRR_SNAPSHOT."""

from __future__ import annotations

import argparse
import logging
import os
import secrets
from typing import Any

from bus.connection import connect, display_url
from bus.streams import StreamSettings, provision
from ops.services.lease import DEFAULT_TTL, Lease, check_server_version
from ops.services.projector import Projector
from ops.shutdown import stop_on_signals
from schemas.duration import parse_duration
from schemas.errors import CrrError

log = logging.getLogger("crr.projector")


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr projector`."""
    p = sub.add_parser("projector", parents=[common], help="run the projector")
    p.add_argument("--retention", default="24h",
                   help="CRR_EVENTS max age when the stream is created (default 24h)")
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
    stop = stop_on_signals()
    if args.partitions == 1 and args.partition == 0:
        args.partition = None  # "partition 0 of 1" is one projector (the systemd template)
    if args.partitions < 1 or (args.partitions > 1) != (args.partition is not None) or (
            args.partition is not None and not 0 <= args.partition < args.partitions):
        raise CrrError("--partition K (0 <= K < N) goes with --partitions N > 1")
    settings = StreamSettings(events_max_age=parse_duration(args.retention),
                              replicas=args.replicas, partitions=args.partitions)
    async with connect(args.server, creds=args.creds, tls_ca=args.tls_ca, name="crr-projector",
                       attempts=None) as nc:
        if args.update:
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
        await projector.run(stop)
    return 0
