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
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TextIO, TypeVar

from crr.bridges.door import Door
from crr.bridges.engine import Engine
from crr.bridges.host_source import HostSource
from crr.bridges.status import BridgeHealth, BridgeMetrics
from crr.bus.connection import Connection
from crr.producers.external import ExternalPublisher
from crr.projections.exports import CompiledExports, NodeWant
from crr.schemas.errors import CrrError

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
    quiet: bool = False


NO_EXPORTS = ("the active catalog has no `exports:`, so the bridge has nothing to write: add "
              "an `exports:` section (features, drain, values) to resources.yaml and `crr "
              "catalog apply` it (docs/bridges.md)")


def has_exports(exports: CompiledExports) -> bool:
    """Whether the compiled `exports:` give a door anything to write."""
    return bool(exports.features or exports.drain or exports.values)


def written_line(door: str, host: str, want: NodeWant) -> str:
    """The one line a bridge says after writing: what the target was told for `host`."""
    features = ", ".join(sorted(want.features)) or "none"
    drain = f"drained ({want.drain})" if want.drain is not None else "not drained"
    unknown = sum(1 for v in want.values.values() if v.state != "fresh" or v.value is None)
    values = f"{len(want.values)} value(s)" + (f", {unknown} unknown" if unknown else "")
    return f"crr bridge {door}: wrote {host}: features: {features}; {drain}; {values}"


async def _wait_for_host(source: HostSource, options: HostBridgeOptions, door: str,
                         stop: asyncio.Event) -> None:
    """Return once the snapshot knows the host (`--once`: raise at once if it does not).

    A typo'd `--host` must not create a host: nothing is written or published for a
    host crr's snapshot does not have; a long-running bridge says so once and waits."""
    if source.record is not None:
        return
    problem = (f"host {source.host!r} is not in crr's snapshot (no reporter has reported for "
               "it): check --host against `crr hosts`")
    if options.once:
        raise CrrError(problem, where=f"crr bridge {door}")
    log.warning("bridge %s: %s; waiting for it", door, problem)
    while source.record is None and not stop.is_set():
        source.changed.clear()
        await until_stopped(source.changed.wait(), stop)
    if source.record is not None:
        log.warning("bridge %s: host %r is in crr's snapshot now", door, source.host)


async def run_host_bridge(nc: Connection, make_door: Callable[[HostSource], Door],
                          options: HostBridgeOptions, stop: asyncio.Event,
                          out: TextIO, *, note: TextIO | None = None) -> int:
    """Run one per-host door until `stop` (or one pass with `once`); the exit status.

    `note` (stderr): the line saying what was written (a stream door's stdout is its
    target's), unless `options.quiet`.  A trial (`once`, `dry_run`) publishes no health:
    it would go `silent` when the trial ends and mark the host failing."""
    assert options.host is not None, "a per-host door needs its host"
    source = HostSource(nc, options.host)
    door = make_door(source)
    engine = Engine(door, dry_run=options.dry_run, out=out, rate=options.rate,
                    heartbeat=options.heartbeat)
    BridgeMetrics(engine)
    reporter = (ExternalPublisher(nc, reporter=f"bridge-{door.name}")
                if options.health and not options.dry_run and not options.once else None)
    health = BridgeHealth(reporter, options.host, source.planner)
    said = [False]

    def on_cycle(e: Engine) -> None:
        if source.record is not None:  # health for a host the snapshot has: never a new one
            health.cycle(e)
        want = e.last.get(options.host or "")
        if e.stats.applied and want is not None and not said[0] and not options.dry_run:
            said[0] = True
            if not options.quiet:
                print(written_line(door.name, source.host, want), file=note or sys.stderr,
                      flush=True)
        elif e.stats.applied and want is not None:
            log.info("%s", written_line(door.name, source.host, want))

    if reporter is not None:
        await reporter.start()
    try:
        await until_stopped(source.start(options.load_timeout), stop)
        if stop.is_set():
            return 0
        if source.planner.exports is None:
            if options.once:
                raise CrrError("no active catalog with valid exports: " + (
                    source.planner.problem or "`crr catalog apply` a resources.yaml with "
                    "`exports:` (docs/bridges.md)"), where=f"crr bridge {door.name}")
            log.warning("bridge %s: the active catalog has no valid exports yet; waiting for "
                        "one (`crr catalog apply` a resources.yaml with `exports:`)", door.name)
        elif not has_exports(source.planner.exports):
            raise CrrError(NO_EXPORTS, where=f"crr bridge {door.name}")
        await _wait_for_host(source, options, door.name, stop)
        if stop.is_set():
            return 0
        await engine.run(source, stop, once=options.once, on_cycle=on_cycle)
        return 0
    finally:
        await source.stop()
        if reporter is not None:
            await reporter.close(flush_timeout=1.0)
