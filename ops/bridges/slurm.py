"""The Slurm door: crr's exported features and drains, kept in line on a real slurmctld.

What it changes, and what it leaves alone:

- **Features.**  crr owns the feature names declared under `exports.features`; every other
  feature on a node is the admin's (from `slurm.conf`, or set by hand) and stays where it
  is, in its order.  A node's crr features are set on **both** `AvailableFeatures` and
  `ActiveFeatures`: a job's `--constraint` is matched against the *active* features, and
  slurmctld refuses active features that are not also available ("Active features not
  subset of available features"), so writing only one of them either fails or is not
  seen by the scheduler.  Each list is edited separately (its admin part kept as it is),
  so a site with a `node_features` plugin, whose active list is a subset of the
  available one, keeps that difference for the admin's features.
- **Drain.**  A node is drained with `Reason="crr: <reason>"` while a drain rule holds,
  and resumed only when its reason starts with `crr:` — an admin's (or a health check
  tool's) drain is never lifted and its reason never overwritten, the convention of
  node health check tools.
- **Drift.**  Features set with `scontrol update` live in slurmctld's memory: a restart
  without `-R`, or `scontrol reconfigure`, puts back the `slurm.conf` features.  The
  door does not trust what it last wrote: each reconcile reads the nodes
  (`scontrol show node --oneliner`, or `sinfo --json`) and writes what differs, so a
  wipe is repaired on the next cycle.
- **Batching.**  Nodes that need the same change are named in one call with a Slurm
  hostlist expression (`crr.bridges.hostlist`): the number of `scontrol` calls grows
  with the number of *distinct* changes, not with the number of nodes.

Commands are spawned with asyncio (argument lists, no shell) under a timeout; a failing
command raises `SchedulerCommandError`, which the door counts and the bridge loop
retries with back-off — it never ends the bridge.  A node crr knows but Slurm does not
is logged once (not on every cycle) and listed in the status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from crr.bridges import door
from crr.bridges.hostlist import compress, expand
from crr.projections.exports import NodeWant
from crr.schemas.errors import SchedulerCommandError

log = logging.getLogger("crr.bridge.slurm")

CRR_REASON_PREFIX = "crr:"
"""A drain reason starting with this is crr's; crr resumes only such nodes."""

DEFAULT_TIMEOUT = 30.0
"""Seconds one `scontrol`/`sinfo` call may take before it is killed and counted as failed
(slurmctld answers in milliseconds; a hung controller must not hang the bridge)."""


NOTHING = NodeWant(features=frozenset(), drain=None)
"""The want of a node crr has nothing for: no crr feature, no crr drain.  A node that is
in Slurm but not (or no longer) in the snapshot gets this, so a forgotten host loses
its crr features and crr's drain."""


@dataclass(frozen=True)
class SlurmNode:
    """One node as slurmctld reports it."""

    name: str
    available: tuple[str, ...]
    active: tuple[str, ...]
    state: str
    flags: frozenset[str]
    reason: str

    @property
    def drained(self) -> bool:
        """Drained or draining (the DRAIN flag), whoever set it."""
        return "DRAIN" in self.flags

    @property
    def crr_drain(self) -> str | None:
        """crr's drain reason (without the `crr:` prefix) when crr drained the node."""
        if self.drained and self.reason.startswith(CRR_REASON_PREFIX):
            return self.reason[len(CRR_REASON_PREFIX):].strip()
        return None

    def crr_features(self, owned: frozenset[str]) -> frozenset[str]:
        """The crr-owned features active on the node."""
        return frozenset(self.active) & owned


def _features(text: str | None) -> tuple[str, ...]:
    if not text or text == "(null)":
        return ()
    return tuple(f for f in text.split(",") if f)


class _SinfoNode(msgspec.Struct, frozen=True):
    name: str
    features: str = ""
    active_features: str = ""
    state: str = ""
    state_flags: list[str] = []
    reason: str = ""


class _SinfoError(msgspec.Struct, frozen=True):
    error: str = ""
    errno: int = 0


class _SinfoDocument(msgspec.Struct, frozen=True):
    nodes: list[_SinfoNode] = []
    errors: list[_SinfoError] = []


_SINFO_DECODER = msgspec.json.Decoder(_SinfoDocument)


def parse_sinfo_json(data: bytes) -> dict[str, SlurmNode]:
    """The nodes of `sinfo --json` (Slurm's openapi node list: every node, whatever its
    partitions).  sinfo exits 0 with an `errors` list (and no nodes) when slurmctld
    cannot be reached: that is a failure, not an empty cluster."""
    doc = _SINFO_DECODER.decode(data)
    if doc.errors:
        said = "; ".join(f"{e.error} (errno {e.errno})" for e in doc.errors)
        raise SchedulerCommandError("sinfo", f"--json reported: {said}", returncode=0)
    return {n.name: SlurmNode(n.name, _features(n.features), _features(n.active_features),
                              n.state.lower(), frozenset(f.upper() for f in n.state_flags),
                              n.reason or "")
            for n in doc.nodes}


def _value(line: str, key: str) -> str:
    """The value after `key` (which includes its leading space and `=`) up to the next
    space; "" when absent.  (Looking up the four fields the door needs is several times
    faster than splitting the ~40 of a line: every node is read on every cycle.)"""
    at = line.find(key)
    if at < 0:
        return ""
    start = at + len(key)
    end = line.find(" ", start)
    return line[start:] if end < 0 else line[start:end]


_REASON = re.compile(r" Reason=(?P<reason>.*?)(?: \[[^\[\]@]*@[^\[\]]*\])(?= |$)")


def parse_scontrol_oneliner(text: str) -> dict[str, SlurmNode]:
    """The nodes of `scontrol show node --oneliner`.

    Fields are `Key=value` separated by spaces; only `Reason=` may hold spaces.  Its
    value ends where scontrol appends `[user@time]`, which it always does, so the
    fields after it (newer Slurm prints `Comment=`, `Extra=`… there) still parse.
    """
    out: dict[str, SlurmNode] = {}
    for raw in text.splitlines():
        if not raw.startswith("NodeName="):
            continue
        line, reason = raw, ""
        m = _REASON.search(line) if " Reason=" in line else None
        if m is not None:
            reason = m.group("reason")
            line = line[:m.start()] + line[m.end():]
        elif " Reason=" in line:  # no [user@time] suffix: the rest of the line
            line, _, reason = line.partition(" Reason=")
        name = _value(line, "NodeName=")
        state, *flags = _value(line, " State=").split("+")
        out[name] = SlurmNode(
            name, _features(_value(line, " AvailableFeatures=")),
            _features(_value(line, " ActiveFeatures=")), state.rstrip("*").lower(),
            frozenset(f.rstrip("*").upper() for f in flags), reason.strip())
    return out


@dataclass(frozen=True)
class Update:
    """One `scontrol update` setting `settings` on `nodes` (one call per hostlist
    expression, or one per node without batching)."""

    nodes: tuple[str, ...]
    settings: tuple[str, ...]

    def argvs(self, *, batch: bool = True) -> list[list[str]]:
        """The `scontrol` argument lists carrying this update."""
        names = compress(self.nodes) if batch else list(self.nodes)
        return [["update", f"NodeName={expr}", *self.settings] for expr in names]

    def describe(self) -> str:
        """`scontrol update NodeName=node[001-003] …` as a shell would show it."""
        return "\n".join("scontrol " + " ".join(_shell_word(a) for a in argv)
                         for argv in self.argvs())


def _shell_word(arg: str) -> str:
    key, eq, value = arg.partition("=")
    return f'{key}="{value}"' if eq and (" " in value or not value) else arg


def _edited(current: tuple[str, ...], owned: frozenset[str], want: frozenset[str],
            ) -> tuple[str, ...]:
    """`current` with its crr-owned features replaced by `want` (the admin's kept in order,
    crr's sorted after them)."""
    return (*(f for f in current if f not in owned), *sorted(want))


def node_updates(node: SlurmNode, want: NodeWant, owned: frozenset[str],
                 ) -> list[tuple[str, ...]]:
    """The settings that bring `node` to `want` (none when it is there already)."""
    out: list[tuple[str, ...]] = []
    available = _edited(node.available, owned, want.features)
    active = _edited(node.active, owned, want.features)
    if set(available) != set(node.available) or set(active) != set(node.active):
        out.append((f"AvailableFeatures={','.join(available)}",
                    f"ActiveFeatures={','.join(active)}"))
    if want.drain is not None:
        reason = f"{CRR_REASON_PREFIX} {want.drain}"
        # Never overwrite an admin's drain (nor its reason); refresh crr's own reason.
        if not node.drained or (node.crr_drain is not None and node.reason != reason):
            out.append(("State=DRAIN", f"Reason={reason}"))
    elif node.crr_drain is not None:
        out.append(("State=RESUME",))
    return out


def plan_updates(wants: Mapping[str, NodeWant], observed: Mapping[str, SlurmNode],
                 owned: frozenset[str], *, only_wanted: bool = False) -> list[Update]:
    """The updates that bring every node Slurm has to what crr wants, grouped by identical
    settings (nodes not in `wants` want nothing of crr — unless `only_wanted`, then they
    are left as they are; wanted nodes Slurm does not have are left out).  Pure;
    deterministic order."""
    groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
    names = sorted(observed.keys() & wants.keys()) if only_wanted else sorted(observed)
    for name in names:
        for settings in node_updates(observed[name], wants.get(name, NOTHING), owned):
            groups[settings].append(name)
    return [Update(tuple(nodes), settings) for settings, nodes in sorted(groups.items())]


@dataclass
class SlurmCommands:
    """Runs `scontrol` and `sinfo` as child processes (no shell) under a timeout.

    `scontrol`/`sinfo` are the programs (a path, or a name looked up in PATH);
    `env` extra environment (e.g. `SLURM_CONF`) on top of this process's.  `reader`:
    how nodes are read — `scontrol` (`show node --oneliner`: every Slurm version, and
    on 2,000 nodes 13 ms against 90 ms for the 2.5 MB of `sinfo --json`) or
    `sinfo-json` (Slurm >= 21.08's structured output).
    """

    scontrol: str = "scontrol"
    sinfo: str = "sinfo"
    timeout: float = DEFAULT_TIMEOUT
    env: Mapping[str, str] = field(default_factory=dict)
    reader: Literal["scontrol", "sinfo-json"] = "scontrol"
    calls: int = 0

    async def run(self, program: str, args: Sequence[str]) -> bytes:
        """stdout of `program args…`; `SchedulerCommandError` when it cannot be run, exits
        non-zero, or outlives the timeout (then it is killed)."""
        self.calls += 1
        name = os.path.basename(program)
        try:
            proc = await asyncio.create_subprocess_exec(
                program, *args, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env={**os.environ, **self.env} if self.env else None)
        except OSError as exc:
            raise SchedulerCommandError(name, f"cannot run {program}: {exc.strerror}",
                                        returncode=127) from exc
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout)
        except TimeoutError:
            await _kill(proc)
            raise SchedulerCommandError(name, f"no answer within {self.timeout:g} s "
                                        f"({' '.join(args[:2])})") from None
        except asyncio.CancelledError:  # the bridge is stopping: leave no child behind
            await _kill(proc)
            raise
        if proc.returncode != 0:
            said = err.decode(errors="replace").strip().splitlines()
            raise SchedulerCommandError(name, said[-1] if said else "(nothing on stderr)",
                                        returncode=proc.returncode)
        return out

    async def show_nodes(self) -> dict[str, SlurmNode]:
        """Every node slurmctld knows (whatever its partitions)."""
        if self.reader == "sinfo-json":
            return parse_sinfo_json(await self.run(self.sinfo, ["--json"]))
        text = await self.run(self.scontrol, ["show", "node", "--oneliner", "--all"])
        return parse_scontrol_oneliner(text.decode(errors="replace"))


async def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    await asyncio.shield(proc.wait())


@dataclass
class SlurmStatus:
    """What the door has done and what went wrong, for the bridge's status and health."""

    reconciles: int = 0
    calls: int = 0
    changes: int = 0
    failed_calls: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    last_error: str | None = None
    last_error_at: float | None = None
    last_ok_at: float | None = None
    unknown_nodes: frozenset[str] = frozenset()
    nodes: int = 0

    @property
    def healthy(self) -> bool:
        """The last reconcile reached slurmctld and every call of it succeeded."""
        return self.consecutive_failures == 0

    def as_dict(self) -> dict[str, object]:
        """The JSON shape of the status (`crr bridge slurm --once --json`)."""
        return {"reconciles": self.reconciles, "calls": self.calls, "changes": self.changes,
                "failed_calls": self.failed_calls, "failures": self.failures,
                "consecutive_failures": self.consecutive_failures,
                "last_error": self.last_error, "last_error_at": self.last_error_at,
                "last_ok_at": self.last_ok_at, "nodes": self.nodes,
                "unknown_nodes": sorted(self.unknown_nodes), "healthy": self.healthy}


@dataclass(frozen=True)
class Reconciled:
    """The outcome of one reconcile: the updates planned, how many calls ran and failed,
    and the nodes of the failed calls with why."""

    updates: list[Update]
    calls: int = 0
    failed: int = 0
    errors: tuple[str, ...] = ()
    failed_nodes: Mapping[str, str] = field(default_factory=dict)


class SlurmDoor:
    """Reads Slurm's nodes and writes crr's features and drains to them (a `Door`).

    `owned`: the feature names crr manages (the catalog's `exports.features`; the bridge
    sets it on every catalog change, and names it ever owned stay owned for the life of
    the process, so a removed export's feature is taken off).  `batch=False` names one
    node per call (the bench's baseline).
    """

    def __init__(self, commands: SlurmCommands, *, owned: Iterable[str] = (),
                 batch: bool = True) -> None:
        self.name = "slurm"
        self.commands = commands
        self.batch = batch
        self.status = SlurmStatus()
        self._owned: frozenset[str] = frozenset(owned)
        self._observed: dict[str, SlurmNode] = {}

    @property
    def owned(self) -> frozenset[str]:
        """The feature names crr manages."""
        return self._owned

    @owned.setter
    def owned(self, names: Iterable[str]) -> None:
        self._owned = self._owned | frozenset(names)

    async def read(self, nodes: Iterable[str] = ()) -> dict[str, SlurmNode]:
        """Every node Slurm has now; the names in `nodes` it does not have are noted (and
        logged the first time each goes missing)."""
        try:
            self._observed = await self.commands.show_nodes()
        except SchedulerCommandError as exc:
            self._failed(exc)
            raise
        finally:
            self.status.calls = self.commands.calls
        self.status.nodes = len(self._observed)
        self._note_unknown(frozenset(nodes) - self._observed.keys())
        return self._observed

    def _note_unknown(self, unknown: frozenset[str]) -> None:
        new = unknown - self.status.unknown_nodes
        if new:
            shown = ",".join(compress(new, max_chars=512))
            log.warning("%d node(s) in crr's snapshot are unknown to Slurm (left alone until "
                        "they appear): %s", len(new), shown)
        self.status.unknown_nodes = unknown

    def plan(self, wants: Mapping[str, NodeWant], *, only_wanted: bool = False) -> list[Update]:
        """The updates the last observation needs to match `wants` (see `plan_updates`)."""
        return plan_updates(wants, self._observed, self._owned, only_wanted=only_wanted)

    async def observe(self, nodes: Sequence[str]) -> dict[str, door.Observed]:
        """`Door.observe`: what Slurm shows for `nodes` as far as crr owns it (its crr
        features and crr drain); a node Slurm does not have is left out."""
        observed = await self.read(nodes)
        return {n: door.Observed(features=observed[n].crr_features(self._owned),
                                 drain=observed[n].crr_drain)
                for n in nodes if n in observed}

    async def apply(self, changes: Mapping[str, NodeWant]) -> door.Applied:
        """`Door.apply`: bring the nodes in `changes` to their wants, planned against the
        last `observe`/`read` (made now if there was none); other nodes untouched."""
        if not self._observed:
            await self.read(changes.keys())
        unknown = frozenset(changes.keys() - self._observed.keys())
        done = await self.run_updates(self.plan(changes, only_wanted=True))
        return door.Applied(
            done=frozenset(changes.keys() - unknown - done.failed_nodes.keys()),
            failed=dict(done.failed_nodes), unknown=unknown, calls=done.calls)

    async def run_updates(self, updates: Sequence[Update]) -> Reconciled:
        """Run `updates`; every failing call is counted and the others still run (the next
        reconcile reads the nodes again and retries what is still different)."""
        calls = failed = 0
        errors: list[str] = []
        failed_nodes: dict[str, str] = {}
        for update in updates:
            for argv in update.argvs(batch=self.batch):
                calls += 1
                try:
                    await self.commands.run(self.commands.scontrol, argv)
                except SchedulerCommandError as exc:
                    failed += 1
                    errors.append(str(exc))
                    self._failed(exc)
                    failed_nodes.update(dict.fromkeys(expand(argv[1].removeprefix(
                        "NodeName=")), str(exc)))
            self.status.changes += len(update.nodes)
        self.status.calls = self.commands.calls
        self.status.failed_calls += failed
        return Reconciled(list(updates), calls, failed, tuple(errors), failed_nodes)

    async def reconcile(self, wants: Mapping[str, NodeWant], *, dry_run: bool = False,
                        decide: Callable[[Mapping[str, SlurmNode]], Mapping[str, NodeWant]]
                        | None = None) -> Reconciled:
        """Observe, plan and (unless `dry_run`) apply: one bridge cycle.  `decide`: what to
        show, given the nodes just read (the bridge's settle and guard); else `wants`.
        Raises `SchedulerCommandError` only when the nodes cannot be read."""
        self.status.reconciles += 1
        try:
            await self.read(wants.keys())
        except SchedulerCommandError:
            self.status.consecutive_failures += 1
            raise
        if decide is not None:
            wants = decide(self._observed)
        updates = self.plan(wants)
        done = Reconciled(updates) if dry_run else await self.run_updates(updates)
        if done.failed:
            self.status.consecutive_failures += 1
        else:
            self.status.consecutive_failures = 0
            self.status.last_ok_at = time.time()
        return done

    def _failed(self, exc: SchedulerCommandError) -> None:
        self.status.failures += 1
        self.status.last_error = str(exc)
        self.status.last_error_at = time.time()
        log.warning("slurm: %s", exc)
