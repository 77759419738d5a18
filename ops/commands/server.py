"""`crr server`: the embedded NATS server with JetStream, in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import signal
import tempfile
from typing import Any

from bus.server import NatsServer


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr server`."""
    p = sub.add_parser("server", parents=[common],
                       help="run an embedded nats-server with JetStream")
    p.add_argument("--store", metavar="DIR", default=None,
                   help="JetStream store directory (default: a new temporary directory)")
    p.add_argument("--port", type=int, default=4222, help="client port (0 = any free port)")
    p.add_argument("--config", metavar="FILE", default=None, help="nats-server config file")
    p.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    """Run until SIGINT/SIGTERM."""
    store = args.store or tempfile.mkdtemp(prefix="crr-nats-")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    server = NatsServer(store, port=args.port, config_file=args.config)
    await asyncio.to_thread(server.start)
    print(f"nats-server ready at {server.url} (store {store}); Ctrl-C to stop", flush=True)
    try:
        await stop.wait()
    finally:
        await asyncio.to_thread(server.stop)
    return 0
