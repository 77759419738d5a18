"""`crr bridge slurm`'s loop: follow the scheduler view, reconcile Slurm on every change.

One bridge per cluster.  It keeps the whole snapshot in a `SchedulerView` (as a
scheduler would), so the wanted state of every node comes from the view's columnar
`select[]` — one vectorised evaluation per export expression for all hosts, not a
record decode per host — and staleness follows each resource's `on_stale` exactly as
`crr select` does (they run the same compiled expression at the same `now`).

A cycle runs when the view applies a record (a report, an expiry the projector wrote,
a forgotten host's delete marker), no sooner than `min_gap` after the previous one
(rate limit; changes arriving meanwhile are folded into the next cycle), and at least
every `interval` even without changes: slurmctld forgets scontrol-set features on a
restart or `scontrol reconfigure`, and only reading the nodes again notices.  A cycle
that cannot reach Slurm is retried after a back-off (`crr.bus.retry.Backoff`), counted in
the status; the loop never ends on it.

Between the wants and Slurm sits the gate (`crr.projections.guard`): a drain waits for its
rule's `for:`, a resume for `resume_after:`, a feature change for its `settle` (a cycle
is due at the earliest such moment), and the guard caps what one burst may change
(`exports.guard`): what does not fit is held, the bridge's Health says `held` with the
numbers, until the change fits again or `crr bridge release slurm` (an admin event this
loop listens for, `release`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TextIO

from crr.bridges.engine import Planner
from crr.bridges.slurm import Reconciled, SlurmDoor, SlurmNode, Update
from crr.bus.retry import Backoff
from crr.producers.external import ExternalPublisher
from crr.projections.exports import CompiledExports, NodeWant
from crr.projections.guard import Change, Gate, GateResult, Limits, Timing
from crr.schemas.catalog import EMPTY_EXPORTS, Catalog
from crr.schemas.errors import SchedulerCommandError
from crr.schemas.events import HealthState
from crr.view.scheduler_view import SchedulerView

log = logging.getLogger("crr.bridge.slurm")

RETRY = Backoff(first=1.0, cap=60.0, jitter=0.5)
"""Back-off after a cycle that could not reach Slurm (slurmctld down, refused)."""

HEALTH_REPORTER = "bridge-slurm"
"""The reporter name the bridge's own health goes out under (cluster scope), so that
`crr health` lists it beside the reporters: `failed` with the last error while Slurm
cannot be read or refuses updates, `ok` otherwise, `stopped` when it ends."""

HEARTBEAT = 15.0
"""Seconds between the bridge's empty cluster reports (its liveness: without them a
reporter seen only through Health turns `silent` after 45 s)."""


def wants_from_view(view: SchedulerView, exports: CompiledExports, now: float,
                    ) -> dict[str, NodeWant]:
    """host → what crr wants on it at `now`, for every host in the view.

    The same `NodeWant` as `crr.projections.exports.plan_table`, computed column-wise: each
    export's compiled expression is run once with `view.select` over all hosts (the
    vectorised evaluator, which the select[] property tests hold to the reference one
    that `plan_table` uses per host) instead of once per host.  Raw values are not
    exported to Slurm, so they are left out.  `now` is the clock: `view.select` judges
    at the view's `judged_at` for it (the projector's watermark, at most `outage_hold`
    back: docs/contract.md, "Freshness at the watermark").
    """
    feats: dict[str, set[str]] = {h: set() for h in view.table.hosts()}
    for name, compiled in exports.features.items():
        for host in view.select(compiled, now):
            feats.setdefault(host, set()).add(name)
    drain: dict[str, str] = {}
    for rule in exports.drain:
        for host in view.select(rule.when, now):
            drain.setdefault(host, rule.reason)
    return {h: NodeWant(features=frozenset(f), drain=drain.get(h)) for h, f in feats.items()}


@dataclass
class BridgeStatus:
    """The loop's own findings beside the door's: plan problems, lag behind the view."""

    cycles: int = 0
    plan_error: str | None = None
    last_cycle_at: float | None = None
    last_cycle_seconds: float = 0.0
    view_position: int = 0
    applied_position: int = 0
    extra: dict[str, object] = field(default_factory=dict)


class SlurmBridge:
    """The reconcile loop over one `SlurmDoor` and one ready `SchedulerView`.

    The exports come from the view's catalog (`exports:` in resources.yaml; none: the
    bridge clears crr's features and drains).  `out`: where `--dry-run` prints each cycle's updates.
    """

    def __init__(self, view: SchedulerView, door: SlurmDoor, *,
                 interval: float = 30.0, min_gap: float = 0.5, dry_run: bool = False,
                 out: TextIO | None = None, clock: Callable[[], float] = time.time,
                 health: ExternalPublisher | None = None) -> None:
        self.view = view
        self.door = door
        self.interval = interval
        self.min_gap = min_gap
        self.dry_run = dry_run
        self.out = out
        self.clock = clock
        self.status = BridgeStatus()
        self.health = health
        self._said: tuple[str, str] | None = None
        self._beat = 0.0
        self.last: Reconciled | None = None
        self._planner = Planner()
        self._wants: dict[str, NodeWant] = {}
        self._catalog: Catalog | None = None
        self.gate = Gate()
        self.gated: GateResult | None = None
        """The last cycle's gate decision: applied, held, pending, trips."""
        self.released_by: str | None = None
        self.holding: str | None = None
        """Set (with why: the watermark, the lag, `N s of outage_hold left`) while crr's own
        input is behind and the bridge holds the last state: its Health says `holding`.
        The freshness judgement sets it (docs/contract.md, "Freshness at the watermark");
        None: not holding."""
        self._expired: str | None = None
        """The judgement's detail while crr's own outage outlasted `outage_hold` (said once)."""
        self.history: deque[tuple[float, Change]] = deque(maxlen=1024)
        """The latest changes the gate let through, with the cycle's time (newest last)."""
        self._changed = asyncio.Event()
        self.cycled = asyncio.Condition()
        """Notified after every cycle (tests and the bench wait on it, not on time)."""

    def _exports(self) -> CompiledExports | None:
        """The current catalog's exports (the engine's `Planner`, recompiled when the
        catalog changes); None while they do not compile — the last good *wants* are then
        kept (the old expressions would misread the new catalog's values), said once per
        catalog in the status and the log."""
        catalog = self.view.catalog
        if catalog is None or catalog is self._catalog:
            return None if self.status.plan_error else self._planner.exports
        self._catalog = catalog
        self.status.plan_error = self._planner.set_catalog(catalog)
        if self.status.plan_error is not None or self._planner.exports is None:
            return None
        self.door.owned = self._planner.exports.features.keys()
        return self._planner.exports

    def note_judgement(self, now: float) -> None:
        """Set `holding` from the view's judgement at `now` (docs/contract.md, "Freshness
        at the watermark"), said in the log at once when it starts or ends."""
        judged = self.view.judgement(now)
        holding = judged.detail if judged.holding else None
        expired = judged.detail if judged.expired else None
        if (holding is None) != (self.holding is None) or (
                (expired is None) != (self._expired is None)):
            if holding is not None:
                log.warning("bridge slurm: %s", holding)
            elif expired is not None:
                log.warning("bridge slurm: %s; the state the values now say goes through the "
                            "guard like any change", expired)
            else:
                log.warning("bridge slurm: caught up with the projector's watermark; no "
                            "longer holding")
        self.holding, self._expired = holding, expired

    async def cycle(self) -> Reconciled:
        """Read the view, reconcile Slurm once.  Raises `SchedulerCommandError` when Slurm
        cannot be read."""
        started = time.monotonic()
        position = self.view.projector_position
        exports = self._exports()
        now = self.clock()
        self.note_judgement(now)
        if exports is not None:
            self._wants = wants_from_view(self.view, exports, now)
        wants = self._wants
        try:
            done = await self.door.reconcile(
                wants, dry_run=self.dry_run,
                decide=lambda observed, named: self._decide(named, observed, now))
        finally:
            self.status.cycles += 1
            self.status.last_cycle_at = now
            self.status.last_cycle_seconds = time.monotonic() - started
            self.status.view_position = self.view.projector_position
        self.status.applied_position = position
        self.last = done
        if self.dry_run and self.out is not None:
            _print_updates(done.updates, self.out)
            if self.gated is not None:
                _print_gate(self.gated, now, self._window(), self.out)
        async with self.cycled:
            self.cycled.notify_all()
        return done

    def _window(self) -> float:
        exports = self._catalog.exports_or_empty() if self._catalog else EMPTY_EXPORTS
        return exports.guard_or_default().window

    def _decide(self, wants: Mapping[str, NodeWant], observed: Mapping[str, SlurmNode],
                now: float) -> dict[str, NodeWant]:
        """What Slurm should show: `wants` through the settle delays and the guard, which
        counts the nodes Slurm has (the first cycle takes crr's drains Slurm shows)."""
        exports = self._catalog.exports_or_empty() if self._catalog else EMPTY_EXPORTS
        shown = ({n: node.crr_drain for n, node in observed.items()}
                 if self.gate.decided is None else None)
        raw = {**{n: _NOTHING for n in observed}, **wants}
        res = self.gate.step(raw, now, Timing.of(exports),
                             Limits.for_nodes(exports, len(observed)), shown_drains=shown)
        self.gated = res
        self.history.extend((now, c) for c in res.applied)
        if res.released:
            log.warning("released by %s: %d held change(s) applied", self.released_by or "?",
                        len(res.applied))
        for trip in res.trips:
            log.warning("held: %s", trip.describe(exports.guard_or_default().window))
        return res.wants

    def release(self, for_seconds: float = 0.0, by: str | None = None) -> bool:
        """An admin's `crr bridge release slurm [--for D]`: the held changes at the next
        cycle (once), or no guard for `for_seconds`; the next cycle comes at once."""
        self.released_by = by
        ok = self.gate.release(self.clock(), for_seconds)
        if ok:
            log.warning("release by %s: %s", by or "?",
                        f"guard off for {for_seconds:g}s" if for_seconds > 0
                        else "the held changes, once")
        else:
            log.warning("release by %s: nothing is held", by or "?")
        self._changed.set()
        return ok

    def next_due(self) -> float | None:
        """Seconds until the earliest pending change is due (None: none pending)."""
        if self.gated is None or not self.gated.pending:
            return None
        return max(0.0, min(c.due_at for c in self.gated.pending) - self.clock())

    async def run(self, stop: asyncio.Event, *, once: bool = False) -> None:
        """Cycle until `stop` is set (or once).  Never raises on Slurm failures."""
        unsubscribe = self.view.subscribe(lambda _subject: self._changed.set())
        try:
            while not stop.is_set():
                self._changed.clear()
                try:
                    if not await self._cycle_unless_stopped(stop):
                        return
                    delay = self.interval
                    due = self.next_due()
                    if due is not None:
                        delay = min(delay, max(due, 0.05))
                except SchedulerCommandError:
                    delay = RETRY.delay(max(1, self.door.status.consecutive_failures))
                    async with self.cycled:
                        self.cycled.notify_all()
                self._tell_health()
                if once:
                    return
                await self._wait(stop, min(delay, HEARTBEAT) if self.health else delay)
        finally:
            unsubscribe()
            if self.health is not None and not self.dry_run:
                self.health.health("stopped", "crr bridge slurm stopped")

    def _tell_health(self) -> None:
        """Publish the bridge's state when it changed, and a heartbeat now and then."""
        if self.health is None or self.dry_run:
            return
        st = self.door.status
        said: tuple[HealthState, str]
        if not st.healthy:
            said = ("failed", f"{st.last_error} ({st.consecutive_failures} failing cycle(s))")
        elif self.status.plan_error:
            said = ("failed", self.status.plan_error)
        elif self.gated is not None and self.gated.trips:
            said = ("held", self.held_detail())
        elif self.holding is not None:
            said = ("holding", self.holding)
        else:
            unknown = f", {len(st.unknown_nodes)} unknown to Slurm" if st.unknown_nodes else ""
            said = ("ok", f"{st.nodes} Slurm nodes{unknown}{self._pending_note()}")
        if said != self._said:
            self._said = said
            self.health.health(said[0], said[1])
        now = time.monotonic()
        if now - self._beat >= HEARTBEAT:
            self._beat = now
            self.health.report({})

    async def _cycle_unless_stopped(self, stop: asyncio.Event) -> bool:
        """One cycle, abandoned (its scontrol/sinfo child killed) when `stop` is set
        meanwhile: a hung slurmctld must not keep SIGTERM waiting for the command timeout.
        False when stopped."""
        cycle = asyncio.ensure_future(self.cycle())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({cycle, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if not cycle.done():
            cycle.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await cycle
            return False
        cycle.result()
        return True

    async def _wait(self, stop: asyncio.Event, delay: float) -> None:
        """Until `stop`, a view change (but at least `min_gap` from now), or `delay`."""
        deadline = time.monotonic() + delay
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), min(self.min_gap, delay))
        if stop.is_set():
            return
        waits = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._changed.wait())}
        try:
            await asyncio.wait(waits, timeout=max(0.0, deadline - time.monotonic()),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    def held_detail(self) -> str:
        """`412 of 2,000 nodes would drain; limit 200 (…)`, and what is pending."""
        window = self._window()
        gated = self.gated
        parts = [t.describe(window) for t in gated.trips] if gated else []
        parts.append("release: crr bridge release slurm")
        return ("; ".join(parts) + self._pending_note())[:1000]

    def _pending_note(self) -> str:
        """`; 3 pending, next: node017 drains (…) at <RFC 3339> unless the rule clears`
        (a time of day, so the Health is said again only when it changes)."""
        gated = self.gated
        if gated is None or not gated.pending:
            return ""
        first = min(gated.pending, key=lambda c: (c.due_at, c.node))
        return f"; {len(gated.pending)} pending, next: {first.describe(first.due_at, at=True)}"

    def status_dict(self) -> dict[str, object]:
        """The bridge's status: the door's counters and the loop's own."""
        gated, now = self.gated, self.clock()
        return {**self.door.status.as_dict(), "cycles": self.status.cycles,
                "held": [c.describe(now) for c in gated.held] if gated else [],
                "pending": [c.describe(now) for c in gated.pending] if gated else [],
                "trips": [t.describe(self._window()) for t in gated.trips] if gated else [],
                "guard_suspended": self.gate.suspended(now),
                "plan_error": self.status.plan_error,
                "last_cycle_seconds": round(self.status.last_cycle_seconds, 4),
                "lag_events": max(0, self.status.view_position - self.status.applied_position),
                "dry_run": self.dry_run}


_NOTHING = NodeWant(features=frozenset(), drain=None)


def _print_gate(gated: GateResult, now: float, window: float, out: TextIO) -> None:
    """`--dry-run`: the trips, the held changes and the pending ones with their time."""
    for trip in gated.trips:
        print(f"# held: {trip.describe(window)}", file=out)
    for change in gated.held:
        print(f"# held: {change.describe(now)}", file=out)
    for change in sorted(gated.pending, key=lambda c: (c.due_at, c.node)):
        print(f"# pending: {change.describe(now)}", file=out)
    out.flush()


def _print_updates(updates: Sequence[Update], out: TextIO) -> None:
    if not updates:
        print("# slurm: nothing to change", file=out, flush=True)
        return
    for update in updates:
        print(update.describe(), file=out)
    out.flush()
