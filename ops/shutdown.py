"""Graceful shutdown of long-running commands: one event set by SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import signal


def stop_on_signals(after: float | None = None) -> asyncio.Event:
    """An event set on SIGINT or SIGTERM (or after `after` seconds), for `run(stop)` loops.

    Must be called from inside the running event loop.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if after is not None:
        loop.call_later(after, stop.set)
    return stop
