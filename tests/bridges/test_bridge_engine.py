"""The bridge engine against a door that is a real class keeping its node facts in memory.

Given wants and what the target shows, when the engine reconciles, then only
the difference is applied (idempotent), a reset target is re-applied, a failing
target is counted and retried with back-off without raising, a node unknown to
the target is said once, `--dry-run` prints instead of applying, the rate limit
batches, and a catalog whose exports stop compiling keeps the last good plan.
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgspec
import pytest

from crr.bridges.door import Applied, Observed
from crr.bridges.engine import Engine, Planner
from crr.bridges.status import health_of
from crr.bus.retry import Backoff
from crr.projections.exports import NodeWant
from crr.schemas.catalog import Exports
from crr.schemas.errors import BridgeError
from tests.support.select import CATALOG


def want(*features: str, drain: str | None = None, expires: float | None = None) -> NodeWant:
    """A want with these features."""
    return NodeWant(features=frozenset(features), drain=drain, expires_at=expires)


@dataclass
class MemoryDoor:
    """A target holding features and drains per node, like a scheduler that can be read back."""

    name: str = "memory"
    nodes: dict[str, tuple[frozenset[str], str | None]] = field(default_factory=dict)
    fail: int = 0
    """Fail this many apply calls with a BridgeError."""
    applies: list[list[str]] = field(default_factory=list)

    async def observe(self, nodes: Sequence[str]) -> Mapping[str, Observed]:
        return {n: Observed(features=self.nodes[n][0], drain=self.nodes[n][1])
                for n in nodes if n in self.nodes}

    async def apply(self, changes: Mapping[str, NodeWant]) -> Applied:
        if self.fail:
            self.fail -= 1
            raise BridgeError("target down")
        self.applies.append(sorted(changes))
        for node, w in changes.items():
            self.nodes[node] = (w.features, w.drain)
        return Applied(done=frozenset(changes), calls=1)


def _door(*names: str) -> MemoryDoor:
    return MemoryDoor(nodes={n: (frozenset(), None) for n in names})


async def test_only_the_difference_is_applied_and_twice_is_nothing() -> None:
    """Two nodes, one already right: one applied; the same wants again: nothing applied."""
    door = _door("a", "b")
    door.nodes["b"] = (frozenset({"x"}), None)
    engine = Engine(door)
    wants = {"a": want("x"), "b": want("x")}
    assert await engine.reconcile(wants)
    assert door.applies == [["a"]]
    assert await engine.reconcile(wants)
    assert door.applies == [["a"]]
    assert engine.stats.applied == 1


async def test_a_target_that_lost_its_state_is_reapplied() -> None:
    """A restart of the target wiped what crr set: the next pass puts it back."""
    door = _door("a")
    engine = Engine(door)
    await engine.reconcile({"a": want("x", drain="crr: fs")})
    door.nodes["a"] = (frozenset(), None)  # e.g. `scontrol reconfigure`
    await engine.reconcile({"a": want("x", drain="crr: fs")})
    assert door.applies == [["a"], ["a"]]
    assert door.nodes["a"] == (frozenset({"x"}), "crr: fs")


async def test_failures_are_counted_retried_with_backoff_and_never_raised() -> None:
    """A failing target: False, counted, a retry time from the back-off; then it recovers."""
    door = _door("a")
    door.fail = 2
    clock = [100.0]
    engine = Engine(door, backoff=Backoff(first=1.0, cap=4.0), clock=lambda: clock[0])
    wants = {"a": want("x")}
    assert not await engine.reconcile(wants)
    assert engine.next_wake(wants) == 101.0
    assert not await engine.reconcile(wants)
    assert engine.next_wake(wants) == 102.0  # 2 s after the second failure
    assert engine.stats.errors == 2
    assert health_of(engine, None)[0] == "failed"
    assert "target down" in (health_of(engine, None)[1] or "")
    assert await engine.reconcile(wants)
    assert engine.stats.failures == 0
    assert engine.next_wake(wants) is None
    assert health_of(engine, None) == ("ok", None)


async def test_unknown_node_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """A node the target does not know: one warning over many passes, and in the health."""
    door = _door("a")
    engine = Engine(door)
    with caplog.at_level(logging.WARNING, logger="crr.bridge"):
        for _ in range(3):
            await engine.reconcile({"a": want("x"), "ghost": want("x")})
    said = [r for r in caplog.records if "ghost" in r.getMessage()]
    assert len(said) == 1
    assert door.applies == [["a"]]
    assert "unknown to the target: ghost" in (health_of(engine, None)[1] or "")


async def test_dry_run_prints_the_diff_and_changes_nothing() -> None:
    """`--dry-run`: a line per node that would change; the target keeps what it had."""
    door = _door("a")
    door.nodes["a"] = (frozenset({"old"}), None)
    out = io.StringIO()
    engine = Engine(door, dry_run=True, out=out)
    await engine.reconcile({"a": want("new", drain="crr: x")})
    assert out.getvalue() == "a: +new -old drain: None -> 'crr: x'\n"
    assert door.applies == []
    assert door.nodes["a"] == (frozenset({"old"}), None)


async def test_rate_limit_batches_changes() -> None:
    """At 2 changes per second, 5 changes go in 3 apply calls of at most 2 nodes."""
    door = _door(*"abcde")
    engine = Engine(door, rate=200.0)
    engine.rate = 2.0  # keep the batches small; the waits between them are 1 s at most
    await engine.reconcile({n: want("x") for n in "abcde"})
    assert door.applies == [["a", "b"], ["c", "d"], ["e"]]


async def test_expiry_wakes_the_engine() -> None:
    """The next wake is the earliest `expires_at` of the wants (no polling)."""
    engine = Engine(_door("a", "b"))
    wants = {"a": want("x", expires=50.0), "b": want(expires=20.0)}
    await engine.reconcile(wants)
    assert engine.next_wake(wants) == 20.0


async def test_run_stops_on_the_stop_event() -> None:
    """`run` returns promptly once stop is set while it waits for a change."""

    class Idle:
        changed = asyncio.Event()
        changed_at = None

        def wants(self, now: float) -> dict[str, NodeWant]:
            return {}

    stop = asyncio.Event()
    task = asyncio.create_task(Engine(_door()).run(Idle(), stop))
    await asyncio.sleep(0)  # let it reach its wait (not a synchronisation: stop is checked)
    stop.set()
    await asyncio.wait_for(task, 2.0)


def test_planner_keeps_the_last_good_plan() -> None:
    """A catalog whose exports stop type-checking: the previous plan stays, and it says so."""
    planner = Planner()
    good = msgspec.structs.replace(CATALOG, exports=Exports(features={"f": "free > 1"}))
    assert planner.set_catalog(good) is None
    kept = planner.exports
    bad = msgspec.structs.replace(CATALOG, exports=Exports(features={"f": "nosuch > 1"}))
    problem = planner.set_catalog(bad)
    assert problem is not None
    assert "keeping the last good plan" in problem
    assert "exports.features.f: unknown resource 'nosuch'" in problem
    assert planner.exports is kept
    state, detail = health_of(Engine(_door()), planner)
    assert state == "failed"
    assert detail is not None
    assert "do not type-check (keeping the last good plan)" in detail
    assert planner.set_catalog(good) is None
    assert planner.problem is None
