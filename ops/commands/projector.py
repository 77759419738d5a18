"""`crr projector`: fold CRR_EVENTS into CRR_SNAPSHOT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import Any

from bus.connection import connect
from bus.streams import StreamSettings
from ops.projector import Projector
from schemas.duration import parse_duration

log = logging.getLogger("crr.projector")


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr projector`."""
    p = sub.add_parser("projector", parents=[common], help="run the projector")
    p.add_argument("--retention", default="24h",
                   help="CRR_EVENTS max age when the stream is created (default 24h)")
    p.add_argument("--replicas", type=int, default=1, help="stream replicas (3 on a cluster)")
    p.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    """Run until SIGINT/SIGTERM; reconnects forever."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    settings = StreamSettings(events_max_age=parse_duration(args.retention),
                              replicas=args.replicas)
    async with connect(args.server, creds=args.creds, tls_ca=args.tls_ca, name="crr-projector",
                       attempts=None) as nc:
        projector = Projector(nc, settings=settings)
        await projector.run(stop)
    return 0
