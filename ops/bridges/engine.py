"""The bridge engine: the loop of the per-host doors (`crr bridge nfd|condor|elim`).

It follows a `Source` (a per-host follower, `crr.bridges.host_source`),
plans each node's `NodeWant` with `crr.projections.exports`, compares it with what
the target shows (`Door.observe`) and applies only the nodes that differ —
rate-limited, `--dry-run` printing the diff instead, `--once` for one pass.  It
wakes on a snapshot change or at the plan's `expires_at` (a value going stale),
never by polling; a door that must speak at least every so often (an elim)
sets `heartbeat`.

Faults: a target command that fails (`BridgeError`, or per-node failures in
`Applied.failed`) is counted and retried with back-off (`crr.bus.retry.BRIDGE_APPLY`),
the loop never exits on it; a node the target does not know is said once, not
per cycle; an `exports:` that stops compiling after a catalog change keeps the
last good plan and says so (`Planner`).

Slurm, a whole-cluster door, has a loop of its own (`crr.bridges.slurm_bridge`) over the
same `Door` port and this module's `Planner`: it must reconcile every Slurm node (not only
the snapshot's hosts) and re-read slurmctld periodically (docs/bridges-slurm.md, "Design
notes").  The engine drives `SlurmDoor` too in tests/bridges/test_slurm_door.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TextIO

from crr.bridges.door import Applied, Door, Observed
from crr.bus.retry import BRIDGE_APPLY, Backoff
from crr.projections.exports import CompiledExports, NodeWant, compile_exports, earliest
from crr.schemas.catalog import Catalog
from crr.schemas.errors import CatalogError, CrrError

log = logging.getLogger("crr.bridge")

Clock = Callable[[], float]


class Planner:
    """The compiled exports of the active catalog, or the last good ones (see module doc)."""

    def __init__(self) -> None:
        self.exports: CompiledExports | None = None
        self.problem: str | None = None
        """Why the active catalog's exports are not the ones in use (None: they are)."""

    def set_catalog(self, catalog: Catalog) -> str | None:
        """Follow `catalog`; returns what to tell the operator when its exports do not compile."""
        try:
            self.exports = compile_exports(catalog)
        except CatalogError as exc:
            kept = "keeping the last good plan" if self.exports is not None else "nothing to plan"
            self.problem = (f"the catalog's exports do not type-check ({kept}): "
                            + "; ".join(exc.problems))
        else:
            self.problem = None
        if self.problem is not None:
            log.error("%s", self.problem)
        return self.problem


class Source(Protocol):
    """Where the wants come from: the snapshot as one door sees it."""

    changed: asyncio.Event
    """Set when a record (host, cluster or catalog) arrived; the engine clears it."""

    def wants(self, now: float) -> dict[str, NodeWant]:
        """Every node's want at `now` (empty while no exports are known)."""
        ...

    @property
    def changed_at(self) -> float | None:
        """Clock time the oldest change not yet planned arrived (for the lag figure)."""
        ...


@dataclass
class Stats:
    """What the bridge did; the metrics and the health record read it."""

    reconciles: int = 0
    applied: int = 0
    """Node changes the target accepted."""
    errors: int = 0
    """Failed target commands and per-node failures."""
    unknown: set[str] = field(default_factory=set)
    """Nodes the target does not know (each said once)."""
    failures: int = 0
    """Consecutive failed cycles (back-off)."""
    last_error: str | None = None
    lag: float = 0.0
    """Seconds from a snapshot change to the target showing it, last cycle."""
    calls: int = 0


def diff_line(node: str, want: NodeWant, seen: NodeWant | Observed | None) -> str:
    """One line of `--dry-run` output: what would change on `node`."""
    have_f = seen.features if seen is not None else frozenset()
    have_d = seen.drain if seen is not None else None
    parts = [f"+{f}" for f in sorted(want.features - have_f)]
    parts += [f"-{f}" for f in sorted(have_f - want.features)]
    if want.drain != have_d:
        parts.append(f"drain: {have_d!r} -> {want.drain!r}")
    old = seen.matches if isinstance(seen, Observed) else seen
    for name, v in want.values.items():
        before = old.values.get(name) if old is not None else None
        if before is None or (before.value, before.state) != (v.value, v.state):
            parts.append(f"{name}={v.value!r} ({v.state})")
    return f"{node}: " + (" ".join(parts) if parts else "(rewrite)")


def differs(want: NodeWant, seen: Observed) -> bool:
    """Whether the target must be told `want`, given what it shows."""
    if seen.matches is not None:
        return not want.same_as(seen.matches) or (
            seen.timed and want.expires_at != seen.matches.expires_at)
    return want.features != seen.features or want.drain != seen.drain


class Engine:
    """Reconcile a door with its source (see module doc)."""

    def __init__(self, door: Door, *, dry_run: bool = False, out: TextIO | None = None,
                 rate: float = 200.0, backoff: Backoff = BRIDGE_APPLY,
                 heartbeat: float | None = None, clock: Clock = time.time) -> None:
        """`rate`: node changes per second at most; `heartbeat`: rewrite every node at
        least this often (seconds) even when nothing changed."""
        self.door = door
        self.dry_run = dry_run
        self.out = out
        self.rate = rate
        self.backoff = backoff
        self.heartbeat = heartbeat
        self.clock = clock
        self.stats = Stats()
        self.last: dict[str, NodeWant] = {}
        """What each node was last told (applied, or printed in a dry run)."""
        self._last_write = 0.0
        self._retry_at: float | None = None

    async def reconcile(self, wants: Mapping[str, NodeWant], *,
                        changed_at: float | None = None) -> bool:
        """One pass: observe, diff, apply the difference.  False when the target failed."""
        self.stats.reconciles += 1
        nodes = sorted(wants)
        try:
            seen = await self.door.observe(nodes)
        except CrrError as exc:
            self._failed(f"observe: {exc}")
            return False
        force = (self.heartbeat is not None
                 and self.clock() - self._last_write >= self.heartbeat)
        changes: dict[str, NodeWant] = {}
        for node in nodes:
            obs = seen.get(node)
            if obs is None or not obs.known:
                self._unknown(node)
                continue
            self.stats.unknown.discard(node)
            if force or differs(wants[node], obs):
                changes[node] = wants[node]
        if not changes:
            self._ok(changed_at)
            return True
        if self.dry_run:
            for node, want in changes.items():
                self._say(diff_line(node, want, seen.get(node)))
                self.last[node] = want
            self._last_write = self.clock()
            return True
        return await self._apply(changes, changed_at)

    async def _apply(self, changes: dict[str, NodeWant], changed_at: float | None) -> bool:
        batch = max(1, int(self.rate))
        items = list(changes.items())
        ok = True
        for start in range(0, len(items), batch):
            chunk = dict(items[start:start + batch])
            if start:
                await asyncio.sleep(len(chunk) / self.rate)  # the rate limit, not a sync
            try:
                result: Applied = await self.door.apply(chunk)
            except CrrError as exc:
                self._failed(f"apply: {exc}")
                return False
            self.stats.calls += result.calls
            for node in result.unknown:
                self._unknown(node)
            for node, why in result.failed.items():
                self.stats.errors += 1
                self.stats.last_error = f"{node}: {why}"
                log.warning("bridge %s: %s: %s", self.door.name, node, why)
                ok = False
            for node in result.done:
                self.last[node] = chunk[node]
            self.stats.applied += len(result.done)
        self._last_write = self.clock()
        if ok:
            self._ok(changed_at)
        else:
            self._count_failure()
        return ok

    def _ok(self, changed_at: float | None) -> None:
        self.stats.failures = 0
        self._retry_at = None
        self.stats.last_error = None
        if changed_at is not None:
            self.stats.lag = max(0.0, self.clock() - changed_at)

    def _count_failure(self) -> None:
        self.stats.failures += 1
        self._retry_at = self.clock() + self.backoff.delay(self.stats.failures)

    def _failed(self, why: str) -> None:
        self.stats.errors += 1
        self.stats.last_error = why
        log.warning("bridge %s: %s (retrying)", self.door.name, why)
        self._count_failure()

    def _unknown(self, node: str) -> None:
        if node not in self.stats.unknown:
            self.stats.unknown.add(node)
            log.warning("bridge %s: node %s is in crr's snapshot but unknown to the target; "
                        "skipping it (said once)", self.door.name, node)

    def _say(self, line: str) -> None:
        if self.out is not None:
            print(line, file=self.out, flush=True)

    def next_wake(self, wants: Mapping[str, NodeWant]) -> float | None:
        """When to look again without a snapshot change: expiry, retry or heartbeat."""
        times = [t for t in (earliest(wants), self._retry_at) if t is not None]
        if self.heartbeat is not None:
            times.append(self._last_write + self.heartbeat)
        return min(times) if times else None

    async def run(self, source: Source, stop: asyncio.Event, *, once: bool = False,
                  on_cycle: Callable[[Engine], None] | None = None) -> None:
        """Reconcile on every change and at every `next_wake` until `stop` (or once)."""
        while not stop.is_set():
            source.changed.clear()
            changed_at = source.changed_at
            now = self.clock()
            wants = source.wants(now)
            await self.reconcile(wants, changed_at=changed_at)
            if on_cycle is not None:
                on_cycle(self)
            if once:
                return
            wake = self.next_wake(wants)
            timeout = None if wake is None else max(0.0, wake - self.clock()) + 0.001
            await _first(stop, source.changed, timeout)


async def _first(stop: asyncio.Event, changed: asyncio.Event, timeout: float | None) -> None:
    """Wait until `stop` or `changed` is set, or `timeout` seconds passed."""
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(changed.wait())]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await w
