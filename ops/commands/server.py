"""`crr server`: the embedded NATS server with JetStream, in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
from typing import Any

from crr.bus.server import NatsServer
from crr.commands import log_options
from crr.runtime.shutdown import stop_on_signals


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr server`."""
    p = sub.add_parser("server", parents=[log_options()],
                       help="run an embedded nats-server with JetStream")
    p.add_argument("--store", metavar="DIR", default=None,
                   help="JetStream store directory (default: a temporary directory, removed "
                        "on exit)")
    p.add_argument("--port", type=int, default=4222, help="client port (0 = any free port)")
    p.add_argument("--config", metavar="FILE", default=None, help="nats-server config file")
    p.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    """Run until SIGINT/SIGTERM."""
    store = args.store or tempfile.mkdtemp(prefix="crr-nats-")
    try:
        stop = stop_on_signals()
        server = NatsServer(store, port=args.port, config_file=args.config)
        await asyncio.to_thread(server.start)
        where = store if args.store else f"{store}, removed on exit"
        print(f"nats-server ready at {server.url} (store {where}); Ctrl-C to stop", flush=True)
        try:
            await stop.wait()
        finally:
            await asyncio.to_thread(server.stop)
    finally:
        if args.store is None:
            shutil.rmtree(store, ignore_errors=True)
    return 0
