"""`crr external run --reporter R`: run an external reporter's command centrally (docs/contract.md,
"Subjects and streams" and "`resources.yaml`").

The LSF `[all]` / license-poller pattern: one machine runs the reporter's
`command` (script protocol, the agent's containment) and publishes its
values on the reporter's cluster subjects, with the reporter's own
credentials (`--creds`, from `crr nats-config`).  The reporter comes from
`--catalog FILE` or, by default, from the active catalog, whose changes are
followed without a restart.  Each report it publishes gets a line on stdout with
the projector's verdict (`crr.sdk.external_reporter.CycleLog`), and each
health change one; `--quiet` leaves only warnings and errors (stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

from crr.bus.catalog_watch import follow_catalog
from crr.producers.external import CentralRunner
from crr.runtime import shutdown
from crr.schemas.catalog_loader import load_catalog
from crr.schemas.errors import CrrError
from crr.sdk.external_reporter import CycleLog, ExternalReporter

log = logging.getLogger("crr.external")


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr external run`."""
    p = sub.add_parser("external", help="external reporters: run one centrally")
    esub = p.add_subparsers(dest="external_command", metavar="ACTION", parser_class=type(p))
    esub.required = True
    r = esub.add_parser("run", parents=[common],
                        help="run an external reporter's command and publish its values "
                             "on the cluster subjects", epilog=shutdown.STOP_EPILOG)
    r.add_argument("--reporter", required=True,
                   help="the reporter (type: external, with a command)")
    r.add_argument("--catalog", metavar="FILE", default=None,
                   help="resources.yaml to take the reporter from (default: the active catalog, "
                        "followed live)")
    r.add_argument("--reporters-dir", type=Path, default=None,
                   help="directory relative commands are resolved against (default: the "
                        "catalog file's directory with --catalog, else the current directory)")
    r.add_argument("--duration", type=float, default=None, metavar="S",
                   help="stop after S seconds (default: run until SIGINT/SIGTERM)")
    r.add_argument("--quiet", action="store_true",
                   help="no line per published report and health change (errors still go "
                        "to stderr)")
    r.set_defaults(func=run)


async def _follow(central: CentralRunner) -> None:
    """Apply every active catalog; a NATS error or a missing stream is retried."""
    await follow_catalog(central.rep.nc, central.apply)


async def run(args: argparse.Namespace) -> int:
    """Run until SIGINT/SIGTERM (or --duration); the command's group is killed on exit."""
    catalog = load_catalog(args.catalog) if args.catalog else None
    reporters_dir = args.reporters_dir or (
        Path(args.catalog).parent if args.catalog else Path())
    async with shutdown.stopping(after=args.duration) as stop, ExternalReporter.connect(
            reporter=args.reporter, url=args.server, creds=args.creds,
            tls_ca=args.tls_ca) as rep:
        cycles = None if args.quiet else CycleLog(
            rep.nc, args.reporter, out=lambda line: print(line, flush=True))
        rep.outbox.on_ack = cycles.acked if cycles is not None else None
        central = CentralRunner(rep, reporters_dir=reporters_dir)
        stop.serving()
        try:
            if catalog is not None:
                await central.apply(catalog)
                await stop.wait()
            else:
                follow = asyncio.create_task(_follow(central))
                stopping = asyncio.create_task(stop.wait())
                await asyncio.wait([follow, stopping], return_when=asyncio.FIRST_COMPLETED)
                stopping.cancel()
                follow.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await follow  # re-raises a CrrError of the first catalog
        finally:
            await central.stop()
            if cycles is not None:
                with contextlib.suppress(CrrError):  # NATS away: the lines are not the point
                    await rep.flush(2.0)  # the `stopped` health is the last line
                await cycles.close()
    return 0
