"""A seeded chaos run: real nats-servers, real `crr` processes, random faults, two checks.

Reporters (in-process, publishing as an external reporter or an agent does:
one JetStream publish per report, `Nats-Msg-Id` of reporter/host/boot/seq)
send full and partial reports for N hosts with one-hour intervals, so nothing
expires during a run.  Between rounds of reports, faults drawn from
`random.Random(seed)` hit the system:

- `late_start`: the first projector starts over events already stored (agents
  first: the usual rollout order);
- `projector_kill`: `kill -9` of the projector (of one partition of two),
  reports while it is down, a new one started;
- `server_kill`: `kill -9` of a nats-server (a node of the R3 cluster, or the
  single server), restarted on its store;
- `snapshot_delete`: the projectors killed, CRR_SNAPSHOT deleted, projectors started;
- `snapshot_delete_live`: CRR_SNAPSHOT deleted under the running projectors, which
  must rebuild it within `RECOVER` seconds without a restart;
- `repartition`: 1 <-> 2 projector partitions (`crr projector --partitions N
  --update`), the old projectors stopped or killed;
- `agent_restart`: some hosts' reporters restart: a new boot id, seq from 1,
  a report at once;
- `forget`: `crr hosts forget H`;
- `catalog`: `crr catalog apply` of another catalog (`tests.support.chaos_oracle.CATALOGS`);
- `malformed`: a burst of garbage on report and health subjects (raw publishes).

Every enabled fault is injected at least once (a seeded permutation first),
then random ones until the duration is spent.  The schedule depends on the seed
only (the random stream is consumed the same way however fast the machine
is); how far a rebuild had got when a kill came does not.

At the end, with every server up and the projector layout of the moment running
(a projector that exited on its own is restarted, as systemd would, and
reported), the run waits until the projectors cover the last CRR_EVENTS
sequence and checks, independently:

(a) `crr replay --verify`: the snapshot equals the replay of the retained history;
(b) every host's values equal `tests.support.chaos_oracle.Oracle`, folded with plain dictionaries.

Nothing synchronises with sleep: waits are on stream acks, projector positions
(`tests.support.faults.caught_up`) and bounded retries.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client

from crr.bus.connection import connect
from crr.bus.retry import PUBLISH
from crr.bus.server import NatsServer
from crr.bus.streams import StreamSettings, provision
from crr.schemas.errors import CrrError
from crr.schemas.subjects import (
    DEADLETTER,
    EVENTS_STREAM,
    MSG_ID_HEADER,
    SNAPSHOT_HOST_PREFIX,
    SNAPSHOT_STREAM,
    EventType,
    event_subject,
    msg_id,
    untoken,
)
from crr.schemas.wire_time import format_time
from crr.view.snapshot_reader import SnapshotContents, read_snapshot
from tests.support.chaos_oracle import CATALOGS, REPORTERS, Oracle, catalog_yaml
from tests.support.cli import crr
from tests.support.cluster import NatsCluster, all_replicas_current
from tests.support.faults import CrrProcess, caught_up, eventually

FAULTS = ("late_start", "projector_kill", "server_kill", "snapshot_delete",
          "snapshot_delete_live", "repartition", "agent_restart", "forget", "catalog",
          "malformed")
"""Every fault the run knows (`late_start` is drawn once, at the start, when enabled)."""

CATCH_UP = 60.0
"""Bound on a wait for the projectors to cover the last event (seconds)."""
RECOVER = 15.0
"""Bound on a projector's recovery from a fault it must handle while running (seconds):
longer, and the run records the fault as not recovered and restarts the projectors."""
MAX_STUCK = 3
"""After this many faults not recovered from, the run stops injecting and checks."""


@dataclass(frozen=True)
class ChaosConfig:
    """One run: the seed decides the reports and the faults; `duration` how many."""

    seed: int
    duration: float = 10.0
    """Seconds of random faults after each enabled one has been injected once."""
    hosts: int = 24
    cluster: bool = False
    """A 3-node cluster with R3 streams instead of one server."""
    faults: tuple[str, ...] = FAULTS
    rate: float = 0.5
    """Chance that a round of reports is followed by a fault."""


@dataclass
class ChaosResult:
    """What a run did and found; `ok` only when both checks passed."""

    config: ChaosConfig
    schedule: list[str] = field(default_factory=list)
    """Each injected fault, with its step, time and details."""
    injected: list[str] = field(default_factory=list)
    """The names of the injected faults, in order."""
    counts: Counter[str] = field(default_factory=Counter)
    incidents: list[str] = field(default_factory=list)
    """What happened on the way without failing the run (a projector exiting on its own)."""
    stuck: list[str] = field(default_factory=list)
    """Faults the running projectors did not recover from within `RECOVER` (a failure)."""
    verify_ok: bool = False
    verify_output: str = ""
    differing: list[str] = field(default_factory=list)
    """Hosts whose values differ from the oracle, sorted."""
    first_difference: str = ""
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        """Both checks passed."""
        return self.verify_ok and not self.differing and not self.stuck

    def summary(self) -> str:
        """Seed, faults, counts and the outcome of each check, for people."""
        c = self.config
        where = "an R3 cluster of 3 nats-servers" if c.cluster else "one nats-server"
        faults = Counter(self.injected)
        lines = [
            f"crr chaos: seed {c.seed}, {c.hosts} hosts, {where}, {self.elapsed:.1f}s "
            f"(--duration {c.duration:g}); faults enabled: {', '.join(c.faults)}",
            f"faults injected ({len(self.schedule)}): "
            + ", ".join(f"{k}×{v}" for k, v in sorted(faults.items())),
            *(f"  {s}" for s in self.schedule),
            "counts: " + ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items())),
            *(f"incident: {i}" for i in self.incidents),
            *(f"NOT RECOVERED: {i}" for i in self.stuck),
            f"check (a) crr replay --verify: {'ok' if self.verify_ok else 'FAILED'}",
        ]
        if not self.verify_ok:
            out = self.verify_output.splitlines()
            shown = out if len(out) <= 40 else [*out[:30], "…", *out[-10:]]
            lines += [f"    {line}" for line in shown]
        if self.differing:
            more = " …" if len(self.differing) > 8 else ""
            lines.append(f"check (b) oracle: FAILED, {len(self.differing)} of "
                         f"{self.counts['hosts at end']} host(s) differ "
                         f"({', '.join(self.differing[:8])}{more})")
            lines.append(f"    first differing host: {self.first_difference}")
        else:
            lines.append(f"check (b) oracle: ok, all {self.counts['hosts at end']} host(s) equal")
        lines.append(f"crr chaos: seed {c.seed} {'PASSED' if self.ok else 'FAILED'}")
        return "\n".join(lines)


def first_difference(want: dict[str, dict[str, Any]], got: dict[str, dict[str, Any]]
                     ) -> tuple[list[str], str]:
    """(hosts that differ, a description of the first of them: expected vs got)."""
    differing = sorted(h for h in set(want) | set(got) if want.get(h) != got.get(h))
    if not differing:
        return [], ""
    h = differing[0]
    w, g = want.get(h), got.get(h)
    if w is None or g is None:
        return differing, (f"{h}: expected {'no host' if w is None else json.dumps(w)}, "
                           f"got {'no host' if g is None else json.dumps(g)}")
    names = sorted(set(w) | set(g))
    parts = [f"{n}: expected {json.dumps(w[n]) if n in w else 'absent'}, "
             f"got {json.dumps(g[n]) if n in g else 'absent'}"
             for n in names if w.get(n, ...) != g.get(n, ...)]
    return differing, f"{h}: " + "; ".join(parts)


def snapshot_values(snap: SnapshotContents) -> dict[str, dict[str, Any]]:
    """host -> resource -> value of the snapshot (a value that is not fresh or unknown
    shows as its state: nothing may have expired in a run)."""
    out: dict[str, dict[str, Any]] = {}
    for host, rec in snap.hosts.items():
        out[host] = {n: e.value if e.state in ("fresh", "unknown") else f"<{e.state}>"
                     for n, e in rec.values.items()}
    return out


class Reporters:
    """The reporters of every host: boots, seqs, and the values they send (seeded)."""

    def __init__(self, rng: random.Random, hosts: list[str]) -> None:
        self.rng = rng
        self.hosts = hosts
        self.boot = {(h, r): self.new_boot() for h in hosts for r in REPORTERS}
        self.seq: Counter[tuple[str, str]] = Counter()

    def new_boot(self) -> str:
        """A boot id, as an agent draws one at start."""
        return f"b{self.rng.getrandbits(32):08x}"

    def values(self, reporter: str, full: bool) -> tuple[dict[str, Any], int]:
        """A report's values (all the reporter measures, or a random subset) and how many
        of them are invalid on purpose."""
        names = REPORTERS[reporter]
        if not full:
            names = self.rng.sample(names, self.rng.randint(1, len(names) - 1))
        out = {n: self.value(n) for n in names}
        invalid = 0
        if self.rng.random() < 0.08:
            numeric = "r_free" if reporter == "sys" else "d_free"
            out[numeric] = -5.0  # below min 0: rejected, the previous value stays
            invalid = 1
        return out, invalid

    def value(self, name: str) -> Any:
        """One valid value (sometimes null: the reporter cannot tell)."""
        rng = self.rng
        if rng.random() < 0.04:
            return None
        if name in ("r_free", "d_free"):
            return round(rng.uniform(0, 1000), 1)
        if name == "r_os":
            return rng.choice(["rhel8", "rhel9", "ubuntu22", "sles15"])
        if name == "r_ok":
            return rng.random() < 0.5
        pool = ["a", "b", "c", "d", "e"] if name == "r_sets" else ["imagenet", "c4", "laion"]
        return sorted(rng.sample(pool, rng.randint(0, 3)))

    def message(self, host: str, reporter: str, values: dict[str, Any]
                ) -> tuple[str, bytes, str]:
        """(subject, payload, Nats-Msg-Id) of the next report of `reporter` on `host`."""
        self.seq[host, reporter] += 1
        boot, seq = self.boot[host, reporter], self.seq[host, reporter]
        body = json.dumps({"reporter": reporter, "host": host, "boot": boot, "seq": seq,
                           "observed_at": format_time(time.time()), "values": values})
        return (event_subject("report", reporter, host), body.encode(),
                msg_id(reporter, host, boot, seq))


class ChaosRun:
    """One seeded run in `workdir` (server stores, projector logs, catalog files)."""

    def __init__(self, config: ChaosConfig, workdir: Path) -> None:
        self.config = config
        self.workdir = workdir
        self.rng = random.Random(config.seed)
        self.host_names = [f"h{i:03d}" for i in range(config.hosts)]
        self.reporters = Reporters(self.rng, self.host_names)
        self.oracle = Oracle()
        self.result = ChaosResult(config)
        self.cluster: NatsCluster | None = None
        self.server: NatsServer | None = None
        self.projectors: dict[int | None, CrrProcess] = {}
        """The running layout: partition (None: unpartitioned) -> process."""
        self.started_procs: list[CrrProcess] = []
        """Every projector process started (all are stopped at the end, whatever happened)."""
        self.partitions = 1
        self.update = False
        """Every start carries `--update` once the layout was changed (as the unit file
        an operator edits for a repartition does, so a restart keeps the new layout)."""
        self.generation = 0
        self.started = 0.0

    # -- infrastructure -----------------------------------------------------------------

    @property
    def url(self) -> str:
        """Client URL(s) of the servers."""
        if self.cluster is not None:
            return self.cluster.url
        assert self.server is not None
        return self.server.url

    @property
    def settings(self) -> StreamSettings:
        """Stream settings of the run (replicas, current partitions)."""
        return StreamSettings(replicas=3 if self.config.cluster else 1,
                              partitions=self.partitions)

    def note(self, fault: str, detail: str = "") -> None:
        """Record (and print at once, for a run that hangs) one injected fault."""
        entry = (f"step {len(self.result.schedule) + 1:>3} {fault} "
                 f"(t={time.monotonic() - self.started:5.1f}s){': ' + detail if detail else ''}")
        self.result.schedule.append(entry)
        self.result.injected.append(fault)
        print(f"crr chaos: {entry}", flush=True)

    def start_projector(self, partition: int | None) -> None:
        """A `crr projector` process for `partition` of the current layout."""
        self.generation += 1
        pid = f"chaos-{self.generation}" + ("" if partition is None else f"-p{partition}")
        args = ["projector", "--server", self.url, "--id", pid,
                "--replicas", str(self.settings.replicas)]
        if partition is not None:
            args += ["--partitions", str(self.partitions), "--partition", str(partition)]
        if self.update:
            args.append("--update")
        log = self.workdir / f"projector-{self.generation}.log"
        proc = CrrProcess(args, log)
        self.started_procs.append(proc)
        self.projectors[partition] = proc.start()
        self.result.counts["projector starts"] += 1

    def start_layout(self) -> None:
        """Every projector of the current layout."""
        for k in ([None] if self.partitions == 1 else range(self.partitions)):
            self.start_projector(k)

    def ids(self) -> set[str]:
        """Projector ids of the running layout."""
        return {p.args[p.args.index("--id") + 1] for p in self.projectors.values()}

    def supervise(self) -> None:
        """Restart a projector that exited on its own (systemd's `Restart=always`); each
        such exit is an incident of the run, with the last lines of its log."""
        for k, proc in list(self.projectors.items()):
            if not proc.alive():
                code = proc.proc.returncode if proc.proc is not None else None
                tail = " | ".join(proc.output().strip().splitlines()[-3:])
                self.result.incidents.append(
                    f"projector {proc.args[proc.args.index('--id') + 1]} exited ({code}) on "
                    f"its own: {tail[-400:]}")
                self.start_projector(k)

    async def settle(self, nc: Client, timeout: float = CATCH_UP) -> SnapshotContents | None:
        """Wait until the running projectors cover the last CRR_EVENTS sequence; None (and
        a `stuck` entry, and the projectors restarted) when they do not within `timeout`."""
        last = self.result.schedule[-1] if self.result.schedule else "the start"
        began = time.monotonic()
        while True:
            self.supervise()  # a projector that exits meanwhile is restarted, as systemd would
            left = began + timeout - time.monotonic()
            try:
                snap = await caught_up(nc, max(0.5, min(5.0, left)), projector_id=self.ids())
                break
            except AssertionError as exc:
                if left > 5.0:
                    continue
                problem = exc
            tails = "; ".join(
                f"{p.args[p.args.index('--id') + 1]}: "
                + " | ".join(p.output().strip().splitlines()[-2:])[-300:]
                for p in self.projectors.values())
            self.result.stuck.append(f"after {last}: {problem}; projector logs end: {tails}")
            print(f"crr chaos: NOT RECOVERED after {last}; restarting the projectors",
                  flush=True)
            for k, p in list(self.projectors.items()):
                p.kill()
                self.start_projector(k)
            return None
        took = time.monotonic() - began
        if took > RECOVER:
            self.result.incidents.append(
                f"the projectors took {took:.1f}s to cover the last event after {last}")
        return snap

    async def crr_ok(self, *args: str, timeout: float = 60.0) -> str:
        """`crr <args>` that must succeed (the run stops with its output otherwise)."""
        ran = await crr(*args, "--server", self.url, timeout=timeout)
        if ran.code != 0:
            raise AssertionError(f"seed {self.config.seed}: crr {' '.join(args)} exited "
                                 f"{ran.code}:\n{ran.out}{ran.err}")
        return ran.out

    async def publish(self, nc: Client, subject: str, payload: bytes,
                      msg_id_: str | None = None) -> None:
        """One JetStream publish, retried (same `Nats-Msg-Id`) across a server's death."""
        headers = {MSG_ID_HEADER: msg_id_} if msg_id_ is not None else None
        async for attempt in PUBLISH.retrying(seconds=60):
            with attempt:
                await nc.jetstream().publish(subject, payload, headers=headers, timeout=2)

    # -- reports --------------------------------------------------------------------------

    async def report(self, nc: Client, host: str, reporter: str, *, full: bool) -> None:
        """Publish one report and fold it into the oracle (acked: stream order = our order)."""
        values, invalid = self.reporters.values(reporter, full)
        await self.publish(nc, *self.reporters.message(host, reporter, values))
        self.oracle.report(host, reporter, values)
        self.result.counts["reports full" if full else "reports partial"] += 1
        self.result.counts["invalid values"] += invalid

    async def traffic(self, nc: Client, n: int) -> None:
        """`n` reports of random hosts and reporters, about a third of them full."""
        for _ in range(n):
            host = self.rng.choice(self.host_names)
            reporter = self.rng.choice(sorted(REPORTERS))
            await self.report(nc, host, reporter, full=self.rng.random() < 0.3)

    # -- faults ---------------------------------------------------------------------------

    async def fault(self, nc: Client, name: str) -> None:
        """Inject fault `name` (and recover from it: the run goes on)."""
        rng = self.rng
        if name == "projector_kill":
            k = rng.choice(sorted(self.projectors, key=lambda p: -1 if p is None else p))
            self.projectors[k].kill()
            down = rng.randint(0, 15)
            self.note(name, f"kill -9 of projector {'' if k is None else f'partition {k} '}"
                      f"({self.partitions} partition(s)), {down} report(s) while down")
            await self.traffic(nc, down)
            self.start_projector(k)
        elif name == "server_kill":
            await self.server_kill(nc)
        elif name == "snapshot_delete":
            self.note(name, "projector(s) killed, CRR_SNAPSHOT deleted, projector(s) started")
            for p in self.projectors.values():
                p.kill()
            await self.delete_snapshot(nc)
            self.start_layout()
        elif name == "snapshot_delete_live":
            self.note(name, "CRR_SNAPSHOT deleted under the running projector(s)")
            await self.delete_snapshot(nc)
            # The projectors must notice and rebuild it without a restart.
            await self.settle(nc, RECOVER)
        elif name == "repartition":
            kill = rng.random() < 0.5
            old = self.partitions
            self.partitions = 2 if old == 1 else 1
            self.note(name, f"{old} -> {self.partitions} partition(s), old projector(s) "
                      f"{'killed' if kill else 'stopped'}")
            for p in self.projectors.values():
                if kill:
                    p.kill()
                else:
                    p.stop()
            self.projectors = {}
            self.update = True
            self.start_layout()
        elif name == "agent_restart":
            hosts = rng.sample(self.host_names, rng.randint(1, 3))
            self.note(name, f"new boot on {', '.join(hosts)}")
            for h in hosts:
                for r in sorted(REPORTERS):
                    self.reporters.boot[h, r] = self.reporters.new_boot()
                    self.reporters.seq[h, r] = 0
                    await self.report(nc, h, r, full=rng.random() < 0.5)
        elif name == "forget":
            known = sorted(self.oracle.hosts)
            if not known:
                return
            host = rng.choice(known)
            self.note(name, f"crr hosts forget {host}")
            await self.settle(nc)  # an admin forgets on a working system
            await self.crr_ok("hosts", "forget", host, "--wait", "45", timeout=60)
            self.oracle.forget(host)
        elif name == "catalog":
            choice = rng.choice(sorted(n for n in CATALOGS if CATALOGS[n] != self.oracle.catalog))
            self.note(name, f"crr catalog apply {choice}")
            path = self.workdir / f"catalog-{choice}.yaml"
            path.write_text(catalog_yaml(choice))
            await self.crr_ok("catalog", "apply", str(path))
            self.oracle.apply_catalog(choice)
        elif name == "malformed":
            n = rng.randint(5, 20)
            self.note(name, f"{n} malformed event(s)")
            for _ in range(n):
                await self.publish(nc, *self.garbage())
            self.result.counts["malformed events"] += n
        else:
            raise AssertionError(f"unknown fault {name!r}")
        self.result.counts["faults"] += 1

    async def delete_snapshot(self, nc: Client) -> None:
        """Delete CRR_SNAPSHOT (already absent: the projectors just started have not
        created it yet, which the schedule notes)."""
        timed_out = False
        async for attempt in PUBLISH.retrying(seconds=60):  # a cluster electing a leader
            with attempt:
                try:
                    await nc.jetstream().delete_stream(SNAPSHOT_STREAM)
                except nats.errors.TimeoutError:
                    timed_out = True  # the request may have been done: NotFound next
                    raise
                except nats.js.errors.NotFoundError:
                    if not timed_out:
                        self.result.schedule[-1] += " (it was absent: not created yet)"

    def garbage(self) -> tuple[str, bytes]:
        """One undecodable or unappliable event on a real subject (of a known or new host):
        dead-lettered, never a value, never a host."""
        rng = self.rng
        host = rng.choice([*self.host_names, f"ghost{rng.randint(0, 9)}"])
        reporter = rng.choice(sorted(REPORTERS))
        kind: EventType = rng.choice(["report", "report", "report", "health"])
        other = rng.choice(self.host_names)
        body = rng.choice([
            b"\x00\xff\xfe not json",
            b'{"reporter": "sys", "host": ',
            b"[1, 2, 3]",
            json.dumps({"reporter": reporter}).encode(),
            json.dumps({"reporter": reporter, "host": host, "boot": "x", "seq": 1,
                        "observed_at": "2026-12-02T14:00:00Z", "values": 5}).encode(),
            json.dumps({"reporter": reporter, "host": other + "-impostor", "boot": "x",
                        "seq": 1, "observed_at": "2026-12-02T14:00:00Z",
                        "values": {"r_free": 1.0}}).encode(),
        ])
        return event_subject(kind, reporter, host), body

    async def server_kill(self, nc: Client) -> None:
        """`kill -9` of one nats-server (the only one, or a node of the cluster), reports
        meanwhile (cluster), restart on the same store and port."""
        rng = self.rng
        if self.cluster is None:
            assert self.server is not None
            self.note("server_kill", "kill -9 of the nats-server, restart on its store")
            self.server.kill()
            self.server.start()
            # A publish sent before the client is back loses its ack (a 2 s timeout).
            await eventually(lambda: nc.is_connected, 30, "client reconnected", every=0.02)
            return
        victim = rng.randrange(3)
        down = rng.randint(5, 20)
        self.note("server_kill", f"kill -9 of node n{victim}, {down} report(s) while down")
        self.cluster.nodes[victim].kill()
        await self.traffic(nc, down)
        self.cluster.nodes[victim].start()
        # A second node down before this one has caught up would leave no quorum: that
        # is not what this fault is about.  (CRR_SNAPSHOT missing counts as not current.)
        async def current() -> bool:
            self.supervise()  # CRR_SNAPSHOT comes back only with a running projector
            return await all_replicas_current(nc)

        try:
            await eventually(current, 90, "replicas current", every=0.5)
        except AssertionError as exc:
            self.result.stuck.append(f"after {self.result.schedule[-1]}: {exc}")
            await self.settle(nc)

    # -- the run --------------------------------------------------------------------------

    def plan(self) -> list[str]:
        """The faults to inject first: each enabled one once, in a seeded order."""
        first = [f for f in self.config.faults if f != "late_start"]
        self.rng.shuffle(first)
        return first

    async def run(self) -> ChaosResult:
        """Set up, run the schedule, check; the result (printed by the caller)."""
        self.started = time.monotonic()
        with contextlib.ExitStack() as stack:
            if self.config.cluster:
                self.cluster = stack.enter_context(NatsCluster(self.workdir / "cluster"))
            else:
                self.server = stack.enter_context(NatsServer(self.workdir / "store"))
            try:
                async with connect(self.url, name="crr-chaos", attempts=None) as nc:
                    await self._run(nc)
            finally:
                for p in self.started_procs:
                    p.stop()
        self.result.elapsed = time.monotonic() - self.started
        return self.result

    async def _run(self, nc: Client) -> None:
        cfg = self.config
        await eventually(lambda: provision(nc, self.settings), 60, "streams provisioned",
                         every=0.5)
        late = "late_start" in cfg.faults
        if not late:
            self.start_layout()
        path = self.workdir / "catalog-base.yaml"
        path.write_text(catalog_yaml("base"))
        await self.crr_ok("catalog", "apply", str(path))
        for h in self.host_names:  # every host reports in full once, then partially
            for r in sorted(REPORTERS):
                await self.report(nc, h, r, full=True)
        await self.traffic(nc, 2 * len(self.host_names))
        if late:
            self.note("late_start", "first projector started over "
                      f"{(await nc.jetstream().stream_info(EVENTS_STREAM)).state.messages} "
                      "stored event(s)")
            self.start_layout()
        first = self.plan()
        deadline = None
        while True:
            await self.traffic(nc, self.rng.randint(3, 12))
            draw, pick = self.rng.random(), self.rng.choice(sorted(cfg.faults))
            if len(self.result.stuck) >= MAX_STUCK:
                self.result.incidents.append(
                    f"run cut short after {len(self.result.stuck)} faults not recovered from")
                break
            if first:
                await self.fault(nc, first.pop(0))
            elif deadline is None:
                deadline = time.monotonic() + cfg.duration
            elif time.monotonic() > deadline:
                break
            elif draw < cfg.rate and pick != "late_start":
                await self.fault(nc, pick)
            if self.rng.random() < 0.4:  # some faults hit a settled system, others a busy one
                await self.settle(nc)
            else:
                self.supervise()
        await self.check(nc)

    async def check(self, nc: Client) -> None:
        """Wait for the projectors to cover the last event; then checks (a) and (b)."""
        snap = await self.settle(nc)
        if snap is None:  # the projectors were restarted: one more chance
            snap = await self.settle(nc)
        if snap is None:  # still behind: check what is there (the run has failed already)
            try:
                snap = await read_snapshot(nc)
            except CrrError as exc:  # CRR_SNAPSHOT absent: every host differs
                self.result.stuck.append(f"at the end: {exc}")
                snap = SnapshotContents()
        info = await nc.jetstream().stream_info(EVENTS_STREAM)
        counts = self.result.counts
        counts["events stored"] = info.state.messages
        counts["last seq"] = info.state.last_seq
        dead = await nc.jetstream().stream_info(EVENTS_STREAM, subjects_filter=DEADLETTER)
        counts["dead letters stored"] = sum((dead.state.subjects or {}).values())
        ran = await crr("replay", "--verify", "--server", self.url)
        self.result.verify_ok, self.result.verify_output = ran.code == 0, ran.out + ran.err
        want, got = self.oracle.values(), snapshot_values(snap)
        if not self.result.verify_ok:  # which side of each difference the oracle takes
            for line in self.result.verify_output.splitlines():
                if line.strip().startswith(SNAPSHOT_HOST_PREFIX) and line.strip().endswith(":"):
                    h = untoken(line.strip()[len(SNAPSHOT_HOST_PREFIX):-1])
                    side = ("agrees with CRR_SNAPSHOT" if want.get(h) == got.get(h)
                            else "differs from CRR_SNAPSHOT")
                    self.result.verify_output += (
                        f"\n(oracle {side} on {h}: {json.dumps(want.get(h))})")
        counts["hosts at end"] = len(want)
        counts["values at end"] = sum(len(v) for v in want.values())
        self.result.differing, self.result.first_difference = first_difference(want, got)
