"""A cluster-wide bridge's brakes: settling (`for:`, `resume_after:`, `settle`) and the guard.

`Gate.step(raw, now, …)` turns what crr wants on every node *now* (the `NodeWant`s of
`crr.projections.exports`) into what the bridge should show (`GateResult.wants`):

- **Settling** (damping flaps): a change is *pending* until its new state has held
  continuously for its delay — a drain rule's `for:`, the `resume_after:` of the rule
  that drained the node, a feature's `settle` — then it is *due*.  A state that goes
  back before its delay ran out cancels the change (the next change starts afresh).
- **The guard** (no storms): due drains count toward `max_drained` (nodes drained by crr
  at any moment), due feature changes toward `max_changed` (nodes whose crr features
  changed within `window`).  A step whose due changes do not fit applies what fits,
  oldest condition first, holds the rest and *trips*; while tripped it applies none of
  that kind until all of them fit again, or an admin releases it (`release`: the held
  changes once; `release(for_seconds=…)`: no guard for that long).  Resumes are never
  held: they give capacity back.  The first step takes the target's drains and the
  wanted features as they are (the baseline), so starting a bridge is no mass change.

Pure: no IO, no clock (`now` is an argument); docs/contract.md (`exports:`) states the
rules and docs/bridges.md the reasons for the defaults.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from crr.projections.exports import NodeWant
from crr.schemas.catalog import Exports, limit_of
from crr.schemas.wire_time import format_time

ChangeKind = Literal["drain", "resume", "features"]
NOTHING = NodeWant(features=frozenset(), drain=None)


@dataclass(frozen=True, slots=True)
class Limits:
    """The guard's limits as node counts (`for_nodes` resolves percentages)."""

    max_drained: int
    max_changed: int
    window: float

    @classmethod
    def for_nodes(cls, exports: Exports, nodes: int) -> Limits:
        """The catalog's guard for a bridge managing `nodes` nodes."""
        g = exports.guard_or_default()
        return cls(limit_of(g.max_drained, nodes), limit_of(g.max_changed, nodes), g.window)


UNLIMITED = Limits(max_drained=1 << 62, max_changed=1 << 62, window=1.0)


@dataclass(frozen=True, slots=True)
class Timing:
    """The settling delays, by drain reason and feature name (defaults for the others)."""

    drain_for: Mapping[str, float] = field(default_factory=dict)
    resume_after: Mapping[str, float] = field(default_factory=dict)
    settle: Mapping[str, float] = field(default_factory=dict)
    default_for: float = 0.0
    default_resume_after: float = 0.0
    default_settle: float = 0.0

    @classmethod
    def of(cls, exports: Exports) -> Timing:
        """The catalog's delays (a reason two rules share: the first rule's)."""
        drain_for: dict[str, float] = {}
        resume: dict[str, float] = {}
        for rule in exports.drain:
            drain_for.setdefault(rule.reason, rule.hold_for)
            resume.setdefault(rule.reason, rule.resume_delay)
        first = exports.drain[0] if exports.drain else None
        return cls(drain_for=drain_for, resume_after=resume,
                   settle={f: exports.settle_of(f) for f in exports.features},
                   default_for=first.hold_for if first else 0.0,
                   default_resume_after=first.resume_delay if first else 0.0,
                   default_settle=exports.settle_of(""))

    def of_drain(self, reason: str) -> float:
        return self.drain_for.get(reason, self.default_for)

    def of_resume(self, reason: str) -> float:
        return self.resume_after.get(reason, self.default_resume_after)

    def of_feature(self, name: str) -> float:
        return self.settle.get(name, self.default_settle)


@dataclass(frozen=True, slots=True)
class Change:
    """One node's change: pending (`due_at` in the future), applied or held."""

    node: str
    kind: ChangeKind
    since: float
    """When the condition began (the guard applies the oldest first)."""
    due_at: float
    drain: str | None = None
    """The drain reason (a drain), or the reason being lifted (a resume)."""
    features: frozenset[str] = frozenset()
    """The node's crr features after the change (a feature change)."""

    def describe(self, now: float, *, at: bool = False) -> str:
        """One line: `node017 drains (reason) in 20s unless the rule clears` (with `at`:
        `… at 2026-12-07T22:01:05.000Z unless …`), or, when due, what it does."""
        wait = (1.0 if at else self.due_at - now)
        verb = {"drain": f"drains ({self.drain})", "resume": f"resumes (was: {self.drain})",
                "features": f"features -> {','.join(sorted(self.features)) or '(none)'}"}
        if wait > 0:
            cond = {"drain": "unless the rule clears", "resume": "unless the rule holds again",
                    "features": "unless the value goes back"}
            when = (f"at {format_time(self.due_at)}" if at
                    else f"in {wait:.0f}s")
            return f"{self.node} {verb[self.kind]} {when} {cond[self.kind]}"
        return f"{self.node} {verb[self.kind]}"


@dataclass(frozen=True, slots=True)
class Trip:
    """Why a kind of change is held, with the numbers."""

    kind: Literal["drain", "features"]
    would: int
    """Nodes that would be drained (or have changed features within the window)."""
    limit: int
    nodes: int
    held: int

    def describe(self, window: float) -> str:
        if self.kind == "drain":
            return (f"{self.would:,} of {self.nodes:,} nodes would drain; limit "
                    f"{self.limit:,} ({self.held:,} held)")
        return (f"{self.would:,} of {self.nodes:,} nodes would change features within "
                f"{window:g}s; limit {self.limit:,} ({self.held:,} held)")


@dataclass(frozen=True, slots=True)
class GateResult:
    """What one step decided."""

    wants: dict[str, NodeWant]
    """What the bridge should show on every node it knows."""
    applied: tuple[Change, ...]
    held: tuple[Change, ...]
    pending: tuple[Change, ...]
    trips: tuple[Trip, ...]
    released: bool = False
    """This step applied changes an admin released."""


@dataclass(slots=True)
class _Candidate:
    value: object
    since: float


class Gate:
    """The settle and guard state of one bridge (see the module doc)."""

    def __init__(self) -> None:
        self.decided: dict[str, NodeWant] | None = None
        self._drain: dict[str, _Candidate] = {}
        self._feature: dict[str, dict[str, _Candidate]] = {}
        self._changed: deque[tuple[float, str]] = deque()
        self.tripped: dict[str, Trip] = {}
        self.suspended_until = float("-inf")
        self._release_once = False

    # -- admin -----------------------------------------------------------------------

    def release(self, now: float, for_seconds: float = 0.0) -> bool:
        """An admin's release: the held changes at the next step (once), or no guard until
        `now + for_seconds`.  False when a once-release finds nothing held."""
        if for_seconds > 0:
            self.suspended_until = max(self.suspended_until, now + for_seconds)
            return True
        if not self.tripped:
            return False
        self._release_once = True
        return True

    def suspended(self, now: float) -> bool:
        """Whether a `release --for` is in force at `now`."""
        return now < self.suspended_until

    # -- the step --------------------------------------------------------------------

    def step(self, raw: Mapping[str, NodeWant], now: float, timing: Timing, limits: Limits,
             *, shown_drains: Mapping[str, str | None] | None = None) -> GateResult:
        """Decide what to show at `now`.  `raw`: what crr wants on each node (a node left
        out wants nothing of crr); `shown_drains`: crr's drains the target shows (read at
        the first step only: the baseline)."""
        if self.decided is None:
            drains = shown_drains or {}
            self.decided = {n: NodeWant(features=w.features, drain=drains.get(n))
                            for n, w in raw.items()}
            for n, reason in drains.items():
                if n not in self.decided and reason is not None:
                    self.decided[n] = NodeWant(features=frozenset(), drain=reason)
        decided = self.decided
        nodes = sorted(decided.keys() | raw.keys())
        due_drain: list[Change] = []
        resumes: list[Change] = []
        due_feat: list[Change] = []
        pending: list[Change] = []
        for node in nodes:
            want = raw.get(node, NOTHING)
            cur = decided.get(node, NOTHING)
            d = self._drain_change(node, want, cur, now, timing)
            if d is not None:
                (pending if d.due_at > now else
                 resumes if d.kind == "resume" else due_drain).append(d)
            pend_f, due_f = self._feature_change(node, want, cur, now, timing)
            pending.extend(pend_f)
            if due_f is not None:
                due_feat.append(due_f)
        for r in resumes:
            self._set_drain(r.node, None)
        released = self._release_once
        self._release_once = False
        free = not released and not self.suspended(now)
        managed = len(nodes)
        drained = sum(1 for w in decided.values() if w.drain is not None)
        apply_d, held_d = self._guard("drain", due_drain, drained, limits.max_drained,
                                      managed, free=free)
        for c in apply_d:
            self._set_drain(c.node, c.drain)
        while self._changed and self._changed[0][0] <= now - limits.window:
            self._changed.popleft()
        recent = {n for _, n in self._changed}
        fresh = [c for c in due_feat if c.node not in recent]
        again = [c for c in due_feat if c.node in recent]
        apply_f, held_f = self._guard("features", fresh, len(recent), limits.max_changed,
                                      managed, free=free)
        apply_f = [*again, *apply_f]  # nodes counted in this window already: always fit
        for c in apply_f:
            self._set_features(c.node, c.features)
            self._changed.append((now, c.node))
        applied = (*resumes, *apply_d, *apply_f)
        return GateResult(wants=dict(decided), applied=tuple(applied),
                          held=(*held_d, *held_f), pending=tuple(pending),
                          trips=tuple(self.tripped.values()), released=released and bool(applied))

    def _guard(self, kind: Literal["drain", "features"], due: list[Change], used: int,
               limit: int, managed: int, *, free: bool) -> tuple[list[Change], list[Change]]:
        """Split `due` into applied and held under `limit` (`used` already counted).
        `free` False (released, suspended): everything, and the trip ends."""
        if not due or not free:
            self.tripped.pop(kind, None)
            return due, []
        room = max(0, limit - used)
        if len(due) <= room:
            self.tripped.pop(kind, None)
            return due, []
        ordered = sorted(due, key=lambda c: (c.since, c.node))
        take = 0 if kind in self.tripped else room
        held = ordered[take:]
        self.tripped[kind] = Trip(kind=kind, would=used + len(due), limit=limit,
                                  nodes=managed, held=len(held))
        return ordered[:take], held

    def _set_drain(self, node: str, drain: str | None) -> None:
        assert self.decided is not None
        cur = self.decided.get(node, NOTHING)
        self.decided[node] = NodeWant(features=cur.features, drain=drain)
        self._drain.pop(node, None)

    def _set_features(self, node: str, features: frozenset[str]) -> None:
        """Show `features` on `node`; the candidates it fulfils are done."""
        assert self.decided is not None
        cur = self.decided.get(node, NOTHING)
        self.decided[node] = NodeWant(features=features, drain=cur.drain)
        cands = self._feature.get(node)
        if cands:
            for name in [n for n, c in cands.items() if (n in features) == c.value]:
                del cands[name]

    def _drain_change(self, node: str, want: NodeWant, cur: NodeWant, now: float,
                      timing: Timing) -> Change | None:
        if want.drain == cur.drain:
            self._drain.pop(node, None)
            return None
        if cur.drain is not None and want.drain is not None:
            # Another rule's reason while drained: no state change, shown at once.
            self._set_drain(node, want.drain)
            return None
        cand = self._drain.get(node)
        if cand is None or cand.value != want.drain:
            cand = self._drain[node] = _Candidate(want.drain, now)
        if want.drain is not None:
            return Change(node, "drain", cand.since, cand.since + timing.of_drain(want.drain),
                          drain=want.drain)
        assert cur.drain is not None
        return Change(node, "resume", cand.since,
                      cand.since + timing.of_resume(cur.drain), drain=cur.drain)

    def _feature_change(self, node: str, want: NodeWant, cur: NodeWant, now: float,
                        timing: Timing) -> tuple[list[Change], Change | None]:
        differ = want.features ^ cur.features
        cands = self._feature.get(node)
        if cands:
            for name in [n for n in cands if n not in differ]:
                del cands[name]
        if not differ:
            return [], None
        if cands is None:
            cands = self._feature[node] = {}
        pending: list[Change] = []
        due: set[str] = set()
        since = now
        for name in sorted(differ):
            on = name in want.features
            cand = cands.get(name)
            if cand is None or cand.value != on:
                cand = cands[name] = _Candidate(on, now)
            due_at = cand.since + timing.of_feature(name)
            if due_at > now:
                pending.append(Change(node, "features", cand.since, due_at,
                                      features=cur.features ^ {name}))
            else:
                due.add(name)
                since = min(since, cand.since)
        if not due:
            return pending, None
        return pending, Change(node, "features", since, since,
                               features=cur.features ^ frozenset(due))
