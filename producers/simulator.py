"""Simulated reporters: many hosts per process, each with its own subject, boot and seq.

Used by `crr demo` (a few hosts beside the real agent: `simulated_hosts`,
`publish_round`) and by `crr sim reporters` and `crr bench` (tens of
thousands: `Fleet`).  Every simulated host publishes exactly what a real
agent would — a Report per reporter on `crr.v1.report.host.<host>.<reporter>`
with its own `boot` and `seq` and a `Nats-Msg-Id`, Health events on
lifecycle changes — so everything downstream (projector, view, select) runs
unmodified.

Values are realistic and deterministic for a seed: numeric random walks,
string sets that churn slowly, strings that change now and then, booleans
that flap rarely.  The `n`-th report of host `i` draws from its own
`random.Random(seed, i, n, reporter)`, so the same seed gives the same
values whatever the timing, the batching or the faults of a run.  `boot` is
random per run (as an agent's is): a re-run against the same server must
not be de-duplicated away by the stream's `Nats-Msg-Id` window.

Faults (`Faults.parse("silent=0.01,invalid=0.001,failing=0.001,burst=60")`):
silent hosts stop publishing after their first report (their values turn
stale, the reporter `silent`); an invalid value replaces one value of a
report with the given probability (the fold rejects it and keeps the
previous one, which is what `expected` keeps too); failing reporters
publish `Health(failed)` after their first report and nothing after; a
burst makes every live host report at once every `burst` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from crr.bus.outbox import Outbox
from crr.schemas.catalog import Catalog, ReporterSpec, ResourceSpec
from crr.schemas.codec import EventMessage, event_message
from crr.schemas.errors import CrrError
from crr.schemas.events import Health, Report
from crr.schemas.wire_time import format_time

DATASET_POOL = ("imagenet", "c4", "laion-5b", "the-pile", "redpajama", "openwebtext",
                "wikipedia", "coco", "librispeech", "fineweb")
STRING_POOL = ("ok", "ok", "ok", "drain", "degraded")

# ---------------------------------------------------------------------------
# The small simulator `crr demo` uses.


@dataclass
class SimulatedHost:
    """One simulated host's reporters and the evolving state of their values."""

    host: str
    boot: str
    rng: random.Random
    state: dict[str, Any] = field(default_factory=dict)
    seq: int = 0

    def next_values(self, catalog: Catalog, reporter: str) -> dict[str, Any]:
        """The next values of `reporter`'s host-scope resources on this host.

        Values of one reporter hang together as a real host's do (issue 40: the demo
        showed `scratch_free 953.9` beside `scratch_total 707.6`, `site_ok true` beside
        `site_state drain`): an `X_total` is a capacity, drawn once, and its `X_free`
        walks within it; a boolean `X_ok` is true exactly when its string `X_state` is
        `ok`.
        """
        out: dict[str, Any] = {}
        for name in sorted(catalog.resources_of(reporter), key=_dependency_order):
            spec = catalog.resources[name]
            if spec.scope != "host":
                continue
            prev = self.state.get(name)
            if spec.kind == "numeric":
                lo = spec.min if spec.min is not None else 0.0
                hi = spec.max if spec.max is not None else 1000.0
                capacity = out.get(name.removesuffix("_free") + "_total") \
                    if name.endswith("_free") else None
                if isinstance(capacity, float):
                    hi = max(lo, min(hi, capacity))
                if name.endswith("_total") and prev is not None:
                    v = float(prev)  # a capacity does not wander
                else:
                    v = float(prev) if prev is not None else self.rng.uniform(lo, hi)
                    v = min(hi, max(lo, v + self.rng.gauss(0, (hi - lo) * 0.02)))
                out[name] = min(round(v, 1), hi) if capacity is not None else round(v, 1)
            elif spec.kind == "boolean" and name.endswith("_ok") and isinstance(
                    out.get(name.removesuffix("_ok") + "_state"), str):
                out[name] = out[name.removesuffix("_ok") + "_state"] == "ok"
            elif spec.kind == "boolean":
                out[name] = (not prev) if prev is not None and self.rng.random() < 0.02 else (
                    prev if prev is not None else self.rng.random() < 0.9)
            elif spec.kind == "string":
                out[name] = prev if prev is not None else self.rng.choice(["ok", "ok", "drain"])
            else:
                members = set(prev if prev is not None else self.rng.sample(DATASET_POOL, 3))
                if self.rng.random() < 0.1:
                    members ^= {self.rng.choice(DATASET_POOL)}
                out[name] = sorted(members)
            self.state[name] = out[name]
        return out


def _dependency_order(name: str) -> tuple[int, str]:
    """Capacities (`X_total`) and states (`X_state`) before what follows from them."""
    return (0 if name.endswith(("_total", "_state")) else 1, name)


def simulated_hosts(names: list[str], seed: int) -> list[SimulatedHost]:
    """Hosts with per-host RNGs derived from `seed` (deterministic values)."""
    return [SimulatedHost(host=n, boot=secrets.token_hex(4), rng=random.Random(f"{seed}/{n}"))
            for n in names]


def reports(
    hosts: list[SimulatedHost], catalog: Catalog, reporters: list[str], observed_at: str
) -> Iterator[EventMessage]:
    """(subject, payload, msg id) of one round of reports from every host and reporter."""
    for h in hosts:
        for r in reporters:
            values = h.next_values(catalog, r)
            if not values:
                continue
            h.seq += 1
            rep = Report(reporter=r, host=h.host, boot=h.boot, seq=h.seq,
                         observed_at=observed_at, values=values)
            yield event_message(rep)


def publish_round(
    outbox: Outbox, hosts: list[SimulatedHost], catalog: Catalog, reporters: list[str],
    observed_at: str,
) -> int:
    """Queue one round of reports on `outbox`; returns how many."""
    n = 0
    for subject, payload, mid in reports(hosts, catalog, reporters, observed_at):
        outbox.put(subject, payload, msg_id=mid, keep="latest")
        n += 1
    return n


# ---------------------------------------------------------------------------
# The fleet: thousands of hosts for `crr sim reporters` and `crr bench`.

KIND_PATTERN = ("numeric",) * 16 + ("boolean", "boolean", "string", "string_set")
"""Kinds of generated resources, cycled: 20 resources = 16 numeric, 2 boolean, 1 string, 1 set."""

_PREFIX = {"numeric": "num", "boolean": "flag", "string": "text", "string_set": "set"}
NUMERIC_MAX = 1000.0


def sim_catalog(resources: int, interval: float, reporters: int = 1) -> Catalog:
    """A catalog of `resources` host-scope resources owned round-robin by `reporters` reporters.

    Reporters are external (`sim0`, `sim1`, …) with `interval`; numerics are
    bounded `[0, 1000]` so an out-of-bounds value is an invalid one.
    """
    if resources < 1 or reporters < 1 or interval <= 0:
        raise CrrError("sim catalog: need at least one resource and reporter, interval > 0")
    res: dict[str, ResourceSpec] = {}
    for i in range(resources):
        kind = KIND_PATTERN[i % len(KIND_PATTERN)]
        owner = f"sim{i % reporters}"
        if kind == "numeric":
            res[f"num{i:03d}"] = ResourceSpec(kind="numeric", reporter=owner, min=0,
                                              max=NUMERIC_MAX, unit="GiB")
        else:
            res[f"{_PREFIX[kind]}{i:03d}"] = ResourceSpec(kind=kind, reporter=owner)  # type: ignore[arg-type]
    reps = {f"sim{j}": ReporterSpec(type="external", interval=interval,
                                    description="crr sim reporters")
            for j in range(min(reporters, resources))}
    return Catalog(resources=res, reporters=reps)


@dataclass(frozen=True)
class Faults:
    """Injected faults; see the module doc."""

    silent: float = 0.0
    """Fraction of hosts that go quiet after their first report."""
    invalid: float = 0.0
    """Probability that a report carries one invalid value."""
    failing: float = 0.0
    """Fraction of hosts whose reporters fail (Health `failed`) after their first report."""
    burst: float = 0.0
    """Every `burst` seconds every live host reports at once (0: never)."""

    @classmethod
    def parse(cls, text: str | None) -> Faults:
        """`silent=0.01,invalid=0.001,failing=0.001,burst=60` (any subset; empty: none)."""
        if not text:
            return cls()
        kw: dict[str, float] = {}
        for part in text.split(","):
            name, sep, raw = part.strip().partition("=")
            if not sep or name not in {"silent", "invalid", "failing", "burst"}:
                raise CrrError(f"--faults: bad item {part!r}: expected silent=F, invalid=P, "
                               "failing=F or burst=SECONDS")
            try:
                value = float(raw)
            except ValueError:
                raise CrrError(f"--faults: {name}={raw!r} is not a number") from None
            if value < 0 or (name != "burst" and value > 1):
                raise CrrError(f"--faults: {name}={raw} out of range")
            kw[name] = value
        if kw.get("silent", 0) + kw.get("failing", 0) > 1:
            raise CrrError("--faults: silent + failing must not exceed 1")
        return cls(**kw)


@dataclass(slots=True)
class _ResourceGen:
    name: str
    kind: str
    index: int


NORMAL, SILENT, FAILING = 0, 1, 2

Event = tuple[str, bytes, dict[str, str]]
"""(subject, payload, headers) of one event to publish."""


class Fleet:
    """`hosts` simulated hosts, each with every reporter of `catalog` that owns host resources."""

    def __init__(
        self,
        catalog: Catalog,
        hosts: int,
        *,
        seed: int = 0,
        faults: Faults | None = None,
        host_prefix: str = "sim",
        boot: str | None = None,
    ) -> None:
        self.catalog = catalog
        self.seed = seed
        self.faults = faults or Faults()
        width = max(5, len(str(hosts - 1)))
        self.names = [f"{host_prefix}{i:0{width}d}" for i in range(hosts)]
        self.boots = [boot or secrets.token_hex(4) for _ in range(hosts)]
        owners = sorted({s.reporter for s in catalog.resources.values() if s.scope == "host"})
        self.reporters = owners
        self._gens = {
            r: [_ResourceGen(n, catalog.resources[n].kind, j)
                for j, n in enumerate(catalog.resources_of(r))
                if catalog.resources[n].scope == "host"]
            for r in owners
        }
        self._bounds = {n: (s.min if s.min is not None else 0.0,
                            s.max if s.max is not None else NUMERIC_MAX)
                        for n, s in catalog.resources.items() if s.kind == "numeric"}
        self.seqs = [0] * hosts
        self.rounds = [0] * hosts
        self.expected: list[dict[str, Any]] = [{} for _ in range(hosts)]
        """Per host, the last VALID value sent of every resource (what the snapshot must show)."""
        self.role = [NORMAL] * hosts
        picker = random.Random(f"{seed}/faults")
        order = list(range(hosts))
        picker.shuffle(order)
        n_silent = round(self.faults.silent * hosts)
        n_failing = round(self.faults.failing * hosts)
        for i in order[:n_silent]:
            self.role[i] = SILENT
        for i in order[n_silent:n_silent + n_failing]:
            self.role[i] = FAILING
        self.last_invalid = [False] * hosts
        """Per host, whether its last report carried an invalid value."""
        self.invalid_sent = 0
        self.health_sent = 0

    def __len__(self) -> int:
        return len(self.names)

    def _rng(self, i: int, rnd: int, r: int) -> random.Random:
        return random.Random(((self.seed * 1_000_003 + i) * 1_000_003 + rnd) * 64 + r)

    def values(self, i: int, reporter_index: int, reporter: str, rnd: int) -> dict[str, Any]:
        """The values of host `i`'s `rnd`-th report of `reporter` (updates `expected`)."""
        rng = self._rng(i, rnd, reporter_index)
        prev = self.expected[i]
        out: dict[str, Any] = {}
        for g in self._gens[reporter]:
            old = prev.get(g.name)
            if g.kind == "numeric":
                lo, hi = self._bounds[g.name]
                if old is None:
                    v = lo + rng.random() * (hi - lo)
                else:
                    v = old + (rng.random() - 0.5) * (hi - lo) * 0.04
                    v = hi if v > hi else (lo if v < lo else v)
                out[g.name] = round(v, 1)
            elif g.kind == "boolean":
                x = rng.random()
                out[g.name] = (x < 0.9) if old is None else ((not old) if x < 0.002 else old)
            elif g.kind == "string":
                x = rng.random()
                out[g.name] = (STRING_POOL[int(x * 1000) % len(STRING_POOL)]
                               if old is None or x < 0.01 else old)
            elif old is None:
                out[g.name] = sorted(rng.sample(DATASET_POOL, 3))
            elif rng.random() < 0.05:
                out[g.name] = sorted(set(old) ^ {rng.choice(DATASET_POOL)})
            else:
                out[g.name] = old
        spoil = bool(self.faults.invalid) and rng.random() < self.faults.invalid
        if spoil:
            before = dict(out)
            name = self._spoil(out, rng)
            before.pop(name)  # `expected` keeps the previous valid value (if any)
            prev.update(before)
        else:
            prev.update(out)
        self.last_invalid[i] = spoil
        return out

    def _spoil(self, out: dict[str, Any], rng: random.Random) -> str:
        """Replace one value by an invalid one; returns its name."""
        name = rng.choice(sorted(out))
        spec = self.catalog.resources[name]
        if spec.kind == "numeric":
            lo, _ = self._bounds[name]
            out[name] = lo - 1.0 - rng.random() * 100  # out of bounds
        elif spec.kind == "boolean":
            out[name] = "maybe"
        elif spec.kind == "string":
            out[name] = 42
        else:
            out[name] = "not-a-list"
        self.invalid_sent += 1
        return name

    def events(self, i: int, observed_at: str) -> list[Event]:
        """What host `i` publishes in its next round, faults applied."""
        rnd = self.rounds[i]
        self.rounds[i] = rnd + 1
        role = self.role[i]
        if rnd > 0 and role == SILENT:
            return []
        host, boot = self.names[i], self.boots[i]
        out: list[Event] = []
        if rnd > 0 and role == FAILING:
            if rnd == 1:
                for r in self.reporters:
                    self.seqs[i] += 1
                    seq = self.seqs[i]
                    ev = Health(reporter=r, host=host, boot=boot, at=observed_at, seq=seq,
                                state="failed", detail="exit 3: simulated failure",
                                exit_code=3)
                    msg = event_message(ev)
                    out.append((msg.subject, msg.payload, msg.headers))
                    self.health_sent += 1
            return out
        for j, r in enumerate(self.reporters):
            self.seqs[i] += 1
            seq = self.seqs[i]
            rep = Report(reporter=r, host=host, boot=boot, seq=seq, observed_at=observed_at,
                         values=self.values(i, j, r, rnd))
            msg = event_message(rep)
            out.append((msg.subject, msg.payload, msg.headers))
        return out

    def live(self, i: int) -> bool:
        """Whether host `i` still reports values (not silent or failing after round 0)."""
        return self.role[i] == NORMAL or self.rounds[i] == 0


Send = Callable[[str, bytes, dict[str, str]], Awaitable[None]]
Progress = Callable[["RunStats"], None]


@dataclass
class RunStats:
    """What a fleet run did."""

    hosts: int
    offered_rate: float
    started: float = 0.0
    elapsed: float = 0.0
    events: int = 0
    reports: int = 0
    rounds: int = 0
    bursts: int = 0
    behind: float = 0.0
    """How far (seconds) the publisher lagged its schedule at the end."""

    @property
    def rate(self) -> float:
        """Achieved events/s."""
        return self.events / self.elapsed if self.elapsed > 0 else 0.0


async def run_fleet(
    fleet: Fleet,
    send: Send,
    *,
    interval: float,
    duration: float | None = None,
    rounds: int | None = None,
    stop: asyncio.Event | None = None,
    progress: Progress | None = None,
    progress_every: float = 1.0,
    on_sent: Callable[[int, float], None] | None = None,
    batch: int = 256,
) -> RunStats:
    """Publish `fleet`'s reports on schedule: each host once per `interval`, spread evenly.

    Host `i` reports at `start + (k·N + i)·interval/N`.  Runs until
    `duration` seconds, `rounds` full rounds or `stop`.  When the publisher
    cannot keep up, it publishes as fast as it can and `behind` says by how
    much it missed the schedule.  `on_sent(i, t)` is called after host `i`'s
    events were handed to `send` (t: `time.time()`), when it sent any.
    """
    n = len(fleet)
    step = interval / n
    stats = RunStats(hosts=n, offered_rate=n * len(fleet.reporters) / interval)
    start = time.monotonic()
    stats.started = time.time()
    slot = 0
    total = rounds * n if rounds is not None else None
    next_progress = start + progress_every
    burst = fleet.faults.burst
    next_burst = start + burst if burst > 0 else float("inf")
    while True:
        now = time.monotonic()
        if stop is not None and stop.is_set():
            break
        if duration is not None and now - start >= duration:
            break
        if total is not None and slot >= total:
            break
        due = int((now - start) / step) + 1
        if total is not None:
            due = min(due, total)
        if due <= slot:
            delay = start + slot * step - now
            wait = min(max(delay, 0.0005), 0.05)
            if stop is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
            else:
                await asyncio.sleep(wait)
            continue
        observed_at = format_time(time.time())
        end = min(due, slot + batch)
        for k in range(slot, end):
            i = k % n
            evs = fleet.events(i, observed_at)
            for subject, payload, headers in evs:
                await send(subject, payload, headers)
                stats.events += 1
            if on_sent is not None and evs:
                on_sent(i, time.time())
        stats.reports = stats.events
        slot = end
        if now >= next_burst:
            next_burst = now + burst
            stats.bursts += 1
            for i in range(n):
                if fleet.live(i):
                    evs = fleet.events(i, observed_at)
                    for subject, payload, headers in evs:
                        await send(subject, payload, headers)
                        stats.events += 1
                    if on_sent is not None and evs:
                        on_sent(i, time.time())
        await asyncio.sleep(0)
        stats.rounds = slot // n
        if progress is not None and now >= next_progress:
            stats.elapsed = now - start
            stats.behind = max(0.0, now - (start + slot * step))
            progress(stats)
            next_progress = now + progress_every
    now = time.monotonic()
    stats.elapsed = now - start
    stats.rounds = slot // n
    stats.behind = max(0.0, now - (start + slot * step))
    return stats
