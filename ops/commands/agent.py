"""`crr agent`: the worker agent — runs this host's script reporters (docs/contract.md,
"`resources.yaml`" and "CLI")."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path
from typing import Any

from crr.bus.connection import connect, display_url
from crr.producers.agent import Agent
from crr.runtime.shutdown import STOP_EPILOG, stopping


def short_hostname() -> str:
    """This host's name up to the first dot (LSF's convention)."""
    return socket.gethostname().split(".", 1)[0]


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr agent`."""
    p = sub.add_parser("agent", parents=[common],
                       help="run the worker agent (this host's script reporters)",
                       epilog=STOP_EPILOG)
    p.add_argument("--host", default=None,
                   help="host name to report as (default: the short host name)")
    p.add_argument("--reporters-dir", type=Path, default=Path(),
                   help="directory relative reporter commands are resolved against "
                        "(default: the current directory)")
    p.set_defaults(func=run, serve_metrics=True)


async def run(args: argparse.Namespace) -> int:
    """Run until SIGINT/SIGTERM; reconnects forever; leaves no script running."""
    host = args.host or short_hostname()
    async with stopping() as stop, connect(
            args.server, creds=args.creds, tls_ca=args.tls_ca, name=f"crr-agent-{host}",
            attempts=None) as nc:
        agent = Agent(nc, host, args.reporters_dir)
        print(f"crr agent: host {host} on {display_url(args.server)} (reporters dir "
              f"{args.reporters_dir.resolve()}); following the active catalog", flush=True)
        stop.serving()
        await agent.run(stop)
    return 0
