"""Test support for the agent: a recorder of what reached the real server, scripts, /proc checks.

The recorder is a core-NATS subscription on `crr.v1.>` on the per-test
nats-server: what the agent published is observed on the broker itself,
never through a mock.  Tests wait on recorded messages with bounded
timeouts, never on sleeps.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import stat
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from crr.bus.streams import provision
from crr.producers.agent import Agent
from crr.schemas.catalog import Catalog, ReporterSpec, ResourceSpec
from crr.schemas.codec import decode, encode
from crr.schemas.events import Health, Inventory, Report
from crr.schemas.subjects import SNAPSHOT_CATALOG, parse_event_subject

HOST = "node1"
GOOD_INTERVAL = 0.25
GOOD_MAX_GAP = 1.0
"""Slack for 'on time': a good reporter's reports must never be further apart than this."""

GOOD_SCRIPT = """#!/bin/sh
printf '{"values": {"good_n": 1}}\\n'
"""

SAFE_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}


def write_script(directory: Path, name: str, body: str, *, executable: bool = True) -> Path:
    """Write `body` to `directory/name`, executable unless told otherwise."""
    path = directory / name
    path.write_text(body)
    mode = stat.S_IRUSR | stat.S_IWUSR | (stat.S_IXUSR if executable else 0)
    path.chmod(mode)
    return path


@dataclass
class Received:
    """One event as the broker delivered it, with the monotonic time it arrived."""

    at: float
    subject: str
    event: Report | Inventory | Health


@dataclass
class Recorder:
    """Everything published on `crr.v1.>` (except snapshots), decoded, in arrival order."""

    events: list[Received] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def on_msg(self, msg: Msg) -> None:
        """Subscription callback."""
        if ".snapshot." in msg.subject or msg.subject in ("crr.v1.catalog", "crr.v1.deadletter"):
            return
        addr = parse_event_subject(msg.subject)
        types: dict[str, type[Report] | type[Inventory] | type[Health]] = {
            "report": Report, "inventory": Inventory, "health": Health}
        event = decode(msg.data, types[addr.kind])
        async with self.changed:
            self.events.append(Received(time.monotonic(), msg.subject, event))
            self.changed.notify_all()

    def reports(self, reporter: str) -> list[Received]:
        """Reports of `reporter`, oldest first."""
        return [r for r in self.events
                if isinstance(r.event, Report) and r.event.reporter == reporter]

    def inventories(self, reporter: str) -> list[Inventory]:
        """Inventories of `reporter`, oldest first."""
        return [r.event for r in self.events
                if isinstance(r.event, Inventory) and r.event.reporter == reporter]

    def health(self, reporter: str) -> list[Health]:
        """Health events of `reporter`, oldest first."""
        return [r.event for r in self.events
                if isinstance(r.event, Health) and r.event.reporter == reporter]

    def states(self, reporter: str) -> list[str]:
        """The Health states of `reporter`, in order."""
        return [h.state for h in self.health(reporter)]

    async def wait(self, what: str, predicate: Callable[[], bool], within: float = 10.0) -> None:
        """Wait until `predicate()` holds (re-checked on every message), or fail saying `what`."""
        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(predicate), within)
            except TimeoutError:
                summary = [(type(r.event).__name__, r.subject.split(".")[-1],
                            getattr(r.event, "state", ""), getattr(r.event, "detail", ""))
                           for r in self.events[-15:]]
                raise AssertionError(f"timed out after {within}s waiting for {what}; "
                                     f"last events: {summary}") from None

    async def wait_state(self, reporter: str, state: str, within: float = 10.0) -> Health:
        """Wait for a Health `state` of `reporter`; return that event."""
        await self.wait(f"{reporter} health {state}",
                        lambda: state in self.states(reporter), within)
        return next(h for h in self.health(reporter) if h.state == state)

    async def wait_reports(self, reporter: str, count: int, within: float = 10.0) -> None:
        """Wait until `reporter` has published at least `count` reports."""
        await self.wait(f"{count} reports of {reporter}",
                        lambda: len(self.reports(reporter)) >= count, within)

    async def wait_more_reports(self, reporter: str, more: int, within: float = 10.0) -> None:
        """Wait for `more` reports of `reporter` beyond those already received."""
        await self.wait_reports(reporter, len(self.reports(reporter)) + more, within)

    def max_gap(self, reporter: str) -> float:
        """Longest time between consecutive reports of `reporter` (0 if fewer than two)."""
        times = [r.at for r in self.reports(reporter)]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def good_catalog(reporters_dir: Path, **extra: ReporterSpec) -> Catalog:
    """A catalog with the well-behaved `good` reporter plus `extra` reporters.

    Each extra reporter owns a numeric resource `<name>_v` (so CRR_RESOURCES is not empty).
    """
    write_script(reporters_dir, "good.sh", GOOD_SCRIPT)
    resources = {"good_n": ResourceSpec(kind="numeric", reporter="good")}
    for name in extra:
        resources[f"{name}_v"] = ResourceSpec(kind="numeric", reporter=name)
    reporters = {
        "good": ReporterSpec(command=["good.sh"], interval=GOOD_INTERVAL, timeout=2.0),
        **extra,
    }
    return Catalog(resources=resources, reporters=reporters)


def fast(command: list[str], **kw: Any) -> ReporterSpec:
    """A reporter spec with test-friendly timings (short interval, backoff, timeout)."""
    defaults: dict[str, Any] = {
        "interval": 0.3, "timeout": 1.0, "backoff_floor": 0.05, "backoff_cap": 0.2,
        "quarantine_after": 1000,
    }
    defaults.update(kw)
    return ReporterSpec(command=command, **defaults)


@dataclass
class AgentRig:
    """A running agent on the test server, its recorder and a way to change the catalog."""

    nc: Client
    agent: Agent
    recorder: Recorder
    publishes: int = 0

    async def set_catalog(self, catalog: Catalog) -> None:
        """Publish `catalog` as the active one and wait until the agent applied it."""
        await self.nc.jetstream().publish(SNAPSHOT_CATALOG, encode(catalog))
        self.publishes += 1
        await self.agent.wait_applied(self.publishes)


@asynccontextmanager
async def running_agent(
    url: str,
    catalog: Catalog,
    reporters_dir: Path,
    *,
    environ: Mapping[str, str] | None = None,
    exit_grace: float = 0.2,
) -> AsyncIterator[AgentRig]:
    """An agent on `url` running `catalog`, stopped (and checked clean) on exit."""
    nc = await nats.connect(url)
    try:
        await provision(nc)
        recorder = Recorder()
        await nc.subscribe("crr.v1.>", cb=recorder.on_msg)
        agent = Agent(nc, HOST, reporters_dir, environ=dict(environ or SAFE_ENV),
                      kill_grace=0.3, exit_grace=exit_grace)
        rig = AgentRig(nc, agent, recorder)
        await agent.start()
        try:
            await rig.set_catalog(catalog)
            yield rig
        finally:
            await agent.stop()
    finally:
        await nc.drain()


# -- /proc --------------------------------------------------------------------------------

def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgrp) of `pid` from /proc, or None if it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[2])


def processes_in_groups(pgids: set[int]) -> list[int]:
    """Pids of every live (or zombie) process whose group is one of `pgids`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = proc_stat(int(entry))
            if st is not None and st[2] in pgids:
                found.append(int(entry))
    return found


def zombie_children() -> list[int]:
    """Children of this (test) process that exited and were not reaped."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = proc_stat(int(entry))
            if st is not None and st[1] == me and st[0] == "Z":
                found.append(int(entry))
    return found


def read_pids(path: Path) -> set[int]:
    """The pids a test script appended (one per line) to `path`."""
    if not path.exists():
        return set()
    return {int(x) for x in path.read_text().split()}


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def wait_gone(pids: set[int], within: float = 5.0) -> None:
    """Wait (on pidfds, not sleeps) until none of `pids` runs any more; fail if one does."""
    loop = asyncio.get_running_loop()
    waits: list[asyncio.Future[None]] = []
    fds: list[int] = []
    for pid in pids:
        st = proc_stat(pid)
        if st is None or st[0] == "Z":
            continue
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        fds.append(fd)
        fut: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, _resolve, fut)
        waits.append(fut)
    try:
        if waits:
            await asyncio.wait_for(asyncio.gather(*waits), within)
    except TimeoutError:
        alive = [p for p in pids if (st := proc_stat(p)) is not None and st[0] != "Z"]
        raise AssertionError(f"processes still running after {within}s: {alive}") from None
    finally:
        for fd in fds:
            loop.remove_reader(fd)
            os.close(fd)


def live_in_groups(pgids: set[int]) -> list[int]:
    """Processes (not zombies) of the given groups that are still alive."""
    return [p for p in processes_in_groups(pgids) if (st := proc_stat(p)) and st[0] != "Z"]


@dataclass
class MemorySink:
    """An in-memory EventSink (a real class, not a mock): what `put` was given, in order."""

    puts: list[tuple[str, bytes, str, str]] = field(default_factory=list)

    def put(self, subject: str, payload: bytes, *, msg_id: str, keep: str = "latest") -> None:
        """Record one message."""
        self.puts.append((subject, payload, msg_id, keep))
