"""Replay of stored events through the live fold, and what changed between two points.

Pure: no IO, no clock.  `Replay` feeds `crr.projections.fold.apply` (the very
function the live projector runs) with stored events in stream order and
takes *captures* (the snapshot records as of a cut) at one or more cuts;
`diff` compares two captures, using the events logged in between.

A cut is a stream sequence, a server time, or both; the state at a cut is
the fold of every event at or before it, then `expire(now)` with `now` the
cut's time (for a sequence-only cut, the time of its last event), so stale
flags are exactly those the live projector would have shown then.

Restart emulation (`lps_upto`): an older projector started from the last
event per subject, so its state (and that of every projector restored from
it) is the fold of the last event per subject up to its start sequence, then
of every later event.  `Replay(lps_upto=start_seq)` folds exactly that input;
a projector that rebuilds today folds the whole retained history (start_seq 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Literal

import msgspec

from crr.projections.envelope import Envelope
from crr.projections.fold import Changes, apply, expire
from crr.projections.record.snapshot import cluster_snapshot, host_snapshot
from crr.projections.state import ProjectionState
from crr.schemas.catalog import Catalog
from crr.schemas.codec import encode
from crr.schemas.errors import SubjectError
from crr.schemas.events import FAILING_HEALTH_STATES, BridgeRelease
from crr.schemas.snapshot import ClusterSnapshot, HostSnapshot, ValueEntry
from crr.schemas.subjects import (
    ADMIN_BRIDGE_PREFIX,
    SNAPSHOT_CATALOG,
    SNAPSHOT_CLUSTER,
    EventAddress,
    host_snapshot_subject,
    parse_event_subject,
)
from crr.schemas.wire_time import format_time


class CapturePoint(msgspec.Struct, frozen=True, kw_only=True):
    """Where a capture is taken: after the last event with `seq <= seq` and `time <= time`.

    `now` is the `expire` time; by default `time`, else the last applied event's time.
    """

    seq: int | None = None
    time: float | None = None
    now: float | None = None

    def passed_by(self, env: Envelope) -> bool:
        """True when `env` lies beyond this cut."""
        return ((self.seq is not None and env.seq > self.seq)
                or (self.time is not None and env.received_at > self.time))


class Capture(msgspec.Struct, frozen=True, kw_only=True):
    """The snapshot records at a cut (as the projector would write them)."""

    seq: int
    """Last `CRR_EVENTS` sequence applied."""
    now: float
    """The `now` expiry ran at."""
    hosts: dict[str, HostSnapshot]
    cluster: ClusterSnapshot
    catalog: Catalog | None

    def records(self) -> dict[str, bytes]:
        """`CRR_SNAPSHOT` subject -> canonical bytes, for every record the projector writes."""
        out = {host_snapshot_subject(h): encode(s) for h, s in self.hosts.items()}
        out[SNAPSHOT_CLUSTER] = encode(self.cluster)
        if self.catalog is not None:
            out[SNAPSHOT_CATALOG] = encode(self.catalog)
        return out


def capture(state: ProjectionState, now: float, hosts: Iterable[str] | None = None) -> Capture:
    """The records of `state` (all hosts, or only `hosts` it knows), taken at `now`."""
    names = sorted(state.hosts) if hosts is None else sorted(h for h in hosts
                                                              if h in state.hosts)
    return Capture(seq=state.seq, now=now, hosts={h: host_snapshot(state, h) for h in names},
                   cluster=cluster_snapshot(state), catalog=state.catalog)


# -- what happened inside a window ----------------------------------------------------


class Happening(msgspec.Struct, frozen=True, kw_only=True):
    """An event inside a diff window worth telling: a rejection, a failure, a dead letter."""

    seq: int
    time: str
    what: Literal["rejected", "failed", "deadletter", "released"]
    host: str | None
    reporter: str | None
    detail: str


class Replay:
    """Drive the fold over events in stream order; take a `Capture` at each cut.

    Feed events with `feed` (False: every cut is taken, stop reading), then
    call `finish` at the end of the input.  Only `crr.projections.fold` mutates
    the state.
    """

    def __init__(self, cuts: list[CapturePoint], *, lps_upto: int = 0,
                 hosts: Iterable[str] | None = None, log_window: bool = False,
                 keep: Callable[[str], bool] | None = None) -> None:
        """`keep(subject)`: fold only the events it accepts (a projector partition's:
        `crr.bus.streams.owns`); the others are skipped as that partition skips them."""
        self.state = ProjectionState()
        self._keep = keep
        self.cuts = list(cuts)
        self.captures: list[Capture] = []
        self.lps_upto = lps_upto
        self._lps: dict[str, Envelope] | None = {} if lps_upto > 0 else None
        self._hosts = None if hosts is None else list(hosts)
        self._log = log_window
        self.happenings: list[Happening] = []
        self.applied = 0
        self.first: Envelope | None = None
        self._last_time = -math.inf

    @property
    def done(self) -> bool:
        """Every cut has been taken."""
        return len(self.captures) == len(self.cuts)

    def feed(self, env: Envelope) -> bool:
        """Apply one stored event (in stream order); False once every cut is taken."""
        if self.first is None:
            self.first = env
        if self._keep is not None and not self._keep(env.subject):
            return True
        lps = self._lps
        if lps is not None:
            if env.seq <= self.lps_upto:
                lps[env.subject] = env
                return True
            self._drain_lps()
        return self._step(env)

    def _step(self, env: Envelope) -> bool:
        cuts = self.cuts
        while len(self.captures) < len(cuts) and cuts[len(self.captures)].passed_by(env):
            self._capture()
        if len(self.captures) == len(cuts):
            return False
        self._apply(env)
        return True

    def feed_many(self, envs: list[Envelope]) -> bool:
        """`feed` each of `envs`; False as soon as every cut is taken.

        The same as calling `feed` for each, with the per-event bookkeeping
        hoisted out of the loop (replay from a file runs here).
        """
        if self._lps is not None or self._log or self._keep is not None:
            feed = self.feed
            return all(feed(env) for env in envs)
        if envs and self.first is None:
            self.first = envs[0]
        state, n, k = self.state, len(envs), 0
        while k < n:
            if self.done:
                return False
            cut = self.cuts[len(self.captures)]
            smax = cut.seq if cut.seq is not None else math.inf
            tmax = cut.time if cut.time is not None else math.inf
            j = k
            while j < n:
                env = envs[j]
                if env.seq > smax or env.received_at > tmax:
                    break
                apply(state, env)
                j += 1
            if j > k:
                self.applied += j - k
                self._last_time = envs[j - 1].received_at
            if j < n and not self.feed(envs[j]):
                return False
            k = j + 1
        return not self.done

    def finish(self) -> list[Capture]:
        """End of input: take the cuts still open; the captures, in cut order."""
        self._drain_lps()
        while len(self.captures) < len(self.cuts):
            self._capture()
        return self.captures

    def _drain_lps(self) -> None:
        """Apply the held last-event-per-subject set, in stream order (restart emulation)."""
        lps = self._lps
        if lps is None:
            return
        self._lps = None
        for env in sorted(lps.values(), key=lambda e: e.seq):
            if not self._step(env):
                return

    def _apply(self, env: Envelope) -> None:
        ch = apply(self.state, env)
        self.applied += 1
        self._last_time = env.received_at
        if self._log and self.captures:
            self._observe(env, ch)

    def _capture(self) -> None:
        cut = self.cuts[len(self.captures)]
        now = cut.now if cut.now is not None else cut.time
        if now is None:
            now = self._last_time if self._last_time > -math.inf else 0.0
        expire(self.state, now)
        self.captures.append(capture(self.state, now, self._hosts))

    def _observe(self, env: Envelope, ch: Changes) -> None:
        """Log rejections, failing health states and dead letters of a window event."""
        at = format_time(env.received_at)
        if ch.deadletter is not None:
            self.happenings.append(Happening(seq=env.seq, time=at, what="deadletter",
                                             host=None, reporter=None,
                                             detail=f"{env.subject}: {ch.deadletter}"))
            return
        if env.subject.startswith(ADMIN_BRIDGE_PREFIX):
            self._released(env, at)
            return
        try:
            addr: EventAddress = parse_event_subject(env.subject)
        except SubjectError:
            return  # the catalog (or a dead letter): nothing per reporter
        kind, reporter, host = addr
        if self._hosts is not None and host is not None and host not in self._hosts:
            return
        rec = self.state.hosts.get(host) if host is not None else self.state.cluster
        rs = rec.reporters.get(reporter) if rec is not None else None
        if rs is None:
            return
        if kind == "health":
            if rs.health in FAILING_HEALTH_STATES:
                detail = rs.health + (f": {rs.detail}" if rs.detail else "")
                self.happenings.append(Happening(seq=env.seq, time=at, what="failed",
                                                 host=host, reporter=reporter, detail=detail))
        elif rs.rejected:
            detail = f"{rs.rejected} rejected: " + "; ".join(rs.rejections)
            self.happenings.append(Happening(seq=env.seq, time=at, what="rejected",
                                             host=host, reporter=reporter, detail=detail))


    def _released(self, env: Envelope, at: str) -> None:
        """`crr bridge release`: who released which bridge, how, and why."""
        try:
            rel = _RELEASE.decode(env.data)
        except msgspec.DecodeError:
            return
        how = f"for {rel.for_seconds:g}s" if rel.for_seconds > 0 else "the held changes, once"
        detail = f"by {rel.by or '?'}: {how}" + (f" ({rel.reason})" if rel.reason else "")
        self.happenings.append(Happening(seq=env.seq, time=at, what="released", host=None,
                                         reporter=f"bridge-{rel.door}", detail=detail))


_RELEASE = msgspec.json.Decoder(BridgeRelease)


# -- the difference between two captures ----------------------------------------------


class ValueChange(msgspec.Struct, frozen=True, kw_only=True):
    """One value that is not the same at the two cuts."""

    host: str | None
    resource: str
    change: Literal["appeared", "changed", "turned_stale", "turned_fresh", "turned_unknown",
                    "disappeared"]
    before: Any = None
    after: Any = None
    before_state: str | None = None
    after_state: str | None = None


class ReporterChange(msgspec.Struct, frozen=True, kw_only=True):
    """A reporter whose state is not the same at the two cuts."""

    host: str | None
    reporter: str
    before: str | None
    after: str | None
    detail: str | None = None


class Diff(msgspec.Struct, frozen=True, kw_only=True):
    """What changed between two cuts (`crr replay --diff T1 T2`)."""

    since: str
    until: str
    since_seq: int
    until_seq: int
    values: list[ValueChange] = msgspec.field(default_factory=list)
    reporters: list[ReporterChange] = msgspec.field(default_factory=list)
    happenings: list[Happening] = msgspec.field(default_factory=list)

    def render(self) -> str:
        """Human-readable text, one line per change."""
        lines = [f"changes from {self.since} (seq {self.since_seq}) "
                 f"to {self.until} (seq {self.until_seq}):"]
        for v in self.values:
            where = v.host if v.host is not None else "(cluster)"
            lines.append(f"  {where}  {v.resource}: {v.change.replace('_', ' ')}  "
                         f"{_shown(v.before, v.before_state)} -> {_shown(v.after, v.after_state)}")
        for r in self.reporters:
            where = r.host if r.host is not None else "(cluster)"
            tail = f"  ({r.detail})" if r.detail else ""
            lines.append(f"  {where}  reporter {r.reporter}: {r.before or '-'} -> "
                         f"{r.after or '-'}{tail}")
        for h in self.happenings:
            where = h.host if h.host is not None else "(cluster)" if h.reporter else "-"
            who = f"  reporter {h.reporter}" if h.reporter else ""
            lines.append(f"  {h.time} seq {h.seq}  {where}{who} {h.what}: {h.detail}")
        if len(lines) == 1:
            lines.append("  nothing changed")
        return "\n".join(lines)


def _shown(value: Any, state: str | None) -> str:
    if state is None:
        return "-"
    if state == "unknown":
        return "unknown"
    text = msgspec.json.encode(value).decode()
    return f"{text} ({state})" if state != "fresh" else text


def _current(entry: ValueEntry) -> Any:
    return entry.last_value if entry.state == "stale" else entry.value


def _value_changes(host: str | None, before: dict[str, ValueEntry],
                   after: dict[str, ValueEntry]) -> list[ValueChange]:
    out: list[ValueChange] = []
    for name in sorted(set(before) | set(after)):
        b, a = before.get(name), after.get(name)
        if a is None:
            assert b is not None
            out.append(ValueChange(host=host, resource=name, change="disappeared",
                                   before=_current(b), before_state=b.state))
            continue
        if b is None:
            out.append(ValueChange(host=host, resource=name, change="appeared",
                                   after=_current(a), after_state=a.state))
            continue
        if b == a:
            continue
        change: Literal["changed", "turned_stale", "turned_fresh", "turned_unknown"]
        if a.state == "stale" and b.state != "stale":
            change = "turned_stale"
        elif a.state == "unknown" and b.state != "unknown":
            change = "turned_unknown"
        elif a.state == "fresh" and b.state != "fresh":
            change = "turned_fresh"
        elif _current(a) != _current(b):
            change = "changed"
        else:
            continue  # only re-reported (new times), same value and state
        out.append(ValueChange(host=host, resource=name, change=change, before=_current(b),
                               after=_current(a), before_state=b.state, after_state=a.state))
    return out


def _reporter_changes(host: str | None, before: HostSnapshot | ClusterSnapshot | None,
                      after: HostSnapshot | ClusterSnapshot) -> list[ReporterChange]:
    old = before.reporters if before is not None else {}
    out: list[ReporterChange] = []
    for name in sorted(set(old) | set(after.reporters)):
        b, a = old.get(name), after.reporters.get(name)
        bs, as_ = (b.state if b else None), (a.state if a else None)
        if bs != as_:
            detail = a.detail if a is not None else None
            if a is not None and a.state == "rejecting" and a.rejections:
                detail = "; ".join(a.rejections)
            out.append(ReporterChange(host=host, reporter=name, before=bs, after=as_,
                                      detail=detail))
    return out


def diff(before: Capture, after: Capture, happenings: list[Happening]) -> Diff:
    """What changed from `before` to `after`, with the window's logged happenings."""
    values: list[ValueChange] = []
    reporters: list[ReporterChange] = []
    values += _value_changes(None, before.cluster.values, after.cluster.values)
    reporters += _reporter_changes(None, before.cluster, after.cluster)
    for host in sorted(set(before.hosts) | set(after.hosts)):
        b, a = before.hosts.get(host), after.hosts.get(host)
        if a is None:
            continue  # a host never disappears from a later state
        values += _value_changes(host, b.values if b is not None else {}, a.values)
        reporters += _reporter_changes(host, b, a)
    return Diff(since=format_time(before.now), until=format_time(after.now),
                since_seq=before.seq, until_seq=after.seq, values=values, reporters=reporters,
                happenings=list(happenings))


# -- byte-level comparison (verify) ---------------------------------------------------


def json_differences(a: bytes, b: bytes, *, limit: int = 20) -> list[str]:
    """The JSON paths at which two documents differ, with both values (`path: a != b`)."""
    out: list[str] = []
    _walk(msgspec.json.decode(a), msgspec.json.decode(b), "", out, limit)
    return out


def _walk(a: Any, b: Any, path: str, out: list[str], limit: int) -> None:
    if len(out) >= limit or a == b:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            sub = f"{path}.{k}" if path else str(k)
            if k not in a:
                out.append(f"{sub}: missing in replay, live has {_short(b[k])}")
            elif k not in b:
                out.append(f"{sub}: replay has {_short(a[k])}, missing in live")
            else:
                _walk(a[k], b[k], sub, out, limit)
            if len(out) >= limit:
                return
        return
    out.append(f"{path or '(document)'}: replay {_short(a)} != live {_short(b)}")


def _short(v: Any) -> str:
    text = msgspec.json.encode(v).decode()
    return text if len(text) <= 120 else text[:117] + "..."
