"""Running a per-host bridge: follow the host, reconcile its door, publish health, stop cleanly.

The composition of `HostSource`, `Engine`, `BridgeHealth` and `BridgeMetrics`
for `crr bridge nfd|condor|elim`; every wait is raced with the stop event, so
SIGTERM/SIGINT ends the bridge within a moment in every state (loading,
waiting for a catalog, between cycles, retrying a target).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TextIO, TypeVar

from crr.bridges.door import Door
from crr.bridges.engine import Engine
from crr.bridges.host_source import HostSource
from crr.bridges.status import BridgeHealth, BridgeMetrics
from crr.bus.connection import Connection
from crr.producers.external import ExternalPublisher

log = logging.getLogger("crr.bridge")

T = TypeVar("T")


async def until_stopped(work: Awaitable[T], stop: asyncio.Event) -> T | None:
    """`work`'s result, or None when `stop` is set first (`work` is then cancelled)."""
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([task, stopper], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


@dataclass(frozen=True, kw_only=True)
class HostBridgeOptions:
    """What `crr bridge <door> [--host H]` was asked (`host` None: a whole-cluster door)."""

    host: str | None
    dry_run: bool = False
    once: bool = False
    rate: float = 200.0
    heartbeat: float | None = None
    health: bool = True
    load_timeout: float = 30.0


async def run_host_bridge(nc: Connection, make_door: Callable[[HostSource], Door],
                          options: HostBridgeOptions, stop: asyncio.Event,
                          out: TextIO) -> int:
    """Run one per-host door until `stop` (or one pass with `once`); the exit status."""
    assert options.host is not None, "a per-host door needs its host"
    source = HostSource(nc, options.host)
    door = make_door(source)
    engine = Engine(door, dry_run=options.dry_run, out=out, rate=options.rate,
                    heartbeat=options.heartbeat)
    BridgeMetrics(engine)
    reporter = (ExternalPublisher(nc, reporter=f"bridge-{door.name}")
                if options.health and not options.dry_run else None)
    health = BridgeHealth(reporter, options.host, source.planner)
    if reporter is not None:
        await reporter.start()
    try:
        await until_stopped(source.start(options.load_timeout), stop)
        if stop.is_set():
            return 0
        if source.planner.exports is None:
            log.warning("bridge %s: the active catalog has no valid exports yet; waiting for "
                        "one (`crr catalog apply` a resources.yaml with `exports:`)", door.name)
            if options.once:
                return 1
        await engine.run(source, stop, once=options.once, on_cycle=health.cycle)
        return 0
    finally:
        await source.stop()
        if reporter is not None:
            await reporter.close(flush_timeout=1.0)
