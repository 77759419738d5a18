"""`crr doctor`: what this installation runs on — nats-py and its fast paths, the server.

The fast paths are crr's reach into nats-py's internals (`crr.bus.natspy`); each one that is
off (another nats-py, `CRR_NATS_FAST=0`) runs on nats-py's public path, slower but the
same.  This says which are on, and why not where not, for the connection it opens.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from crr.bus import jetstream, natspy
from crr.bus.connection import connect, display_url
from crr.bus.natspy import parser
from crr.bus.natspy.framing import Framer
from crr.schemas.errors import BusError
from crr.schemas.subjects import EVENTS_STREAM, SNAPSHOT_STREAM


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr doctor`."""
    p = sub.add_parser("doctor", parents=[common],
                       help="nats-py, its fast paths (on, or why not) and the server")
    p.add_argument("--json", action="store_true", help="a JSON object instead of lines")
    p.set_defaults(func=run)


def _dotted(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v)) or "?"


async def run(args: argparse.Namespace) -> int:
    """Print what `crr doctor` finds; exit 0 (a public path is slower, not wrong)."""
    async with connect(args.server, creds=args.creds, tls_ca=args.tls_ca,
                       name="crr-doctor") as nc:
        server = natspy.server_version(nc)
        streams: dict[str, bool] = {}
        for name in (EVENTS_STREAM, SNAPSHOT_STREAM):
            try:
                await jetstream.stream_state(nc, name)
                streams[name] = True
            except BusError:  # absent, or not readable with these credentials
                streams[name] = False
        # The connection-level paths, checked on this connection as the services do.
        parser.reader(nc)
        Framer(nc)
        states = natspy.report()
    supported = f">={_dotted(natspy.SUPPORTED[0])},<{_dotted(natspy.SUPPORTED[1])}"
    if args.json:
        print(json.dumps({
            "nats_py": _dotted(natspy.version()), "supported": supported,
            "server": display_url(args.server), "server_version": server,
            "streams": streams,
            "fast_paths": [{"path": s.path, "fast": s.fast, "reason": s.reason}
                           for s in states]}, indent=2))
        return 0
    print(f"nats-py {_dotted(natspy.version())} (crr's fast paths are written for {supported})")
    print(f"server {display_url(args.server)}: nats-server {server}; "
          + ", ".join(f"{n} {'present' if ok else 'absent'}" for n, ok in streams.items()))
    print("fast paths:")
    for s in states:
        print(f"  {s.path:<17} {'fast' if s.fast else 'public path: ' + (s.reason or '?')}")
    return 0
