"""The live fold: the projector's state, what of it CRR_SNAPSHOT does not hold yet, and
the dead letters it owes.

Each event is folded by the pure fold (`crr.projections.fold.apply`); what it changed is
marked dirty for the next flush, an event the fold refuses becomes a dead letter.
Restored records not placed yet (`crr.projections.checkpoint.Deferred`, `Lazy`) are placed
as the fold passes them or as they come due; one that does not restore asks for a
rebuild (`resync`), which the run loop does between flushes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from crr.bus import tracing
from crr.bus.ordered import StoredMessage
from crr.projections.checkpoint import CheckpointError, Deferred, Lazy
from crr.projections.envelope import Envelope
from crr.projections.fold import Changes, apply, expire, next_deadline
from crr.projections.record.snapshot import host_names
from crr.projections.state import ProjectionState
from crr.projector.metrics import ProjectorMetrics
from crr.projector.position import Position
from crr.projector.restore import Restored
from crr.projector.snapshot_writer import WrittenRecords
from crr.projector.status import Origin
from crr.schemas.events import DeadLetter
from crr.schemas.subjects import (
    DEADLETTER,
    EVENTS_STREAM,
    SNAPSHOT_CLUSTER,
    SNAPSHOT_STREAM,
    host_snapshot_subject,
    published_subject,
)
from crr.schemas.wire_time import format_time

log = logging.getLogger("crr.projector")

REFINE_CHUNK = 500
"""Restored records whose first deadline `refine_lazy` reads per turn of the loop (~5 ms)."""


@dataclass
class Dirty:
    """What changed since the last flush: the records to write."""

    hosts: set[str] = field(default_factory=set)
    cluster: bool = False
    catalog: bool = False

    def merge(self, ch: Changes) -> None:
        if ch.hosts:
            self.hosts.update(ch.hosts)
        self.cluster = self.cluster or ch.cluster
        self.catalog = self.catalog or ch.catalog

    def __bool__(self) -> bool:
        return bool(self.hosts) or self.cluster or self.catalog


@dataclass
class Owed:
    """What one flush writes, taken from the fold as the flush begins (`LiveFold.take`): the
    records changed, the dead letters, the traces their writes continue, and what the
    status written after them says of the state (`crr.projector.status.Cut.at`)."""

    state: ProjectionState
    dirty: Dirty
    letters: list[DeadLetter]
    parents: dict[str, tracing.SpanContext]
    """Snapshot subject -> the sampled apply span its write continues (popped as written)."""
    applied: int
    deadletters: int
    next_due: float | None


class LiveFold:
    """The fold state of one projector and what it owes CRR_SNAPSHOT (see module doc)."""

    def __init__(self, *, pos: Position, metrics: ProjectorMetrics,
                 origin: Origin, wake: asyncio.Event,
                 owns: Callable[[str], bool] | None) -> None:
        """`owns`: partitioned, whether an event is this partition's to fold (the live
        consumer's filters only deliver its own subjects; the initial load reads every
        subject).  `wake` is set when there is something to write."""
        self._pos = pos
        self._metrics = metrics
        self._origin = origin
        self._wake = wake
        self._owns = owns
        self.state = ProjectionState()
        self.dirty = Dirty()
        self.deadletters: list[DeadLetter] = []
        self.trace_parents: dict[str, tracing.SpanContext] = {}
        """Snapshot subject -> the sampled apply span its next write continues."""
        self.deferred: Deferred | None = None
        """Records written after the status restored from, placed as the fold passes them."""
        self.lazy: Lazy | None = None
        """Restored host records not placed yet (`crr.projections.checkpoint.Lazy`)."""
        self.applied = 0
        self.deadletter_count = 0
        self.last_event: StoredMessage | None = None
        """The last event folded (what CRR_EVENTS must still hold at its seq)."""
        self.resync = False
        """Set when a stream went backwards: rebuild before the next flush."""
        self.resync_why = ""
        """Why `resync` was set (the rebuild's start note)."""

    def fold(self, m: StoredMessage, parent: tracing.SpanContext | None) -> None:
        """Fold one event (`parent`: the trace its snapshot writes continue)."""
        subject = m.subject
        rebuilding = self._origin.rebuilding
        if rebuilding is not None:
            rebuilding.seen(m.seq)
        if self._owns is not None and not self._owns(subject):
            self._pos.dropped(m.seq, m.pending)  # caught up counts past others' events too
            return
        subject = published_subject(subject)  # without a partition token (any layout's)
        if self.deferred is not None:
            self.place_deferred(m.seq)
        if self.lazy is not None:
            self.place_lazy(functools.partial(self.lazy.before, self.state, subject, m.time))
        ch = apply(self.state, Envelope(seq=m.seq, subject=subject, received_at=m.time,
                                        data=m.data))
        self.applied += 1
        self._pos.folded(m.seq, m.pending)
        self.last_event = m
        if ch.deadletter is not None and subject != DEADLETTER:
            # `subject` as published (without a partition token), as docs/contract.md names it.
            self.deadletter_count += 1
            self.deadletters.append(DeadLetter(
                seq=m.seq, subject=subject, reason=ch.deadletter,
                payload=m.data[:4096].decode("utf-8", "replace"),
                received_at=format_time(m.time),
            ))
            log.warning("dead-lettered event %d on %s: %s", m.seq, subject, ch.deadletter)
        if ch.hosts:  # (`Dirty.merge`, inline: once per event)
            self.dirty.hosts.update(ch.hosts)
        if ch.cluster or ch.catalog:
            self.dirty.merge(ch)
        if parent is not None:
            for h in ch.hosts:
                self.trace_parents[host_snapshot_subject(h)] = parent
            if ch.cluster:
                self.trace_parents[SNAPSHOT_CLUSTER] = parent
        if self._metrics.enabled:
            self._metrics.event(m)
        self._wake.set()

    def take(self) -> Owed:
        """What the next flush writes, handed over (the fold owes nothing more of it)."""
        owed = Owed(state=self.state, dirty=self.dirty, letters=self.deadletters,
                    parents=self.trace_parents, applied=self.applied,
                    deadletters=self.deadletter_count, next_due=self.next_deadline())
        self.dirty, self.deadletters, self.trace_parents = Dirty(), [], {}
        return owed

    def put_back(self, owed: Owed) -> None:
        """A flush failed: owe its records, dead letters and traces again (the next round
        retries; what was folded since stays newer)."""
        d = owed.dirty
        self.dirty.merge(Changes(hosts=frozenset(d.hosts), cluster=d.cluster,
                                 catalog=d.catalog, deadletter=None))
        self.deadletters[:0] = owed.letters
        for subject, parent in owed.parents.items():
            self.trace_parents.setdefault(subject, parent)

    def reset(self) -> None:
        """The fold of nothing (before a load again: starting over, or a first load that
        failed half-way)."""
        self.state = ProjectionState()
        self.dirty = Dirty()
        self.deadletters = []
        self.trace_parents.clear()
        self.last_event = None
        self.deferred = self.lazy = None

    def resume(self, restored: Restored) -> None:
        """Take a restored state (`crr.projector.restore`) and its counts."""
        self.state = restored.state
        self.deferred = restored.deferred if len(restored.deferred) else None
        self.lazy = restored.lazy if len(restored.lazy) else None
        self.applied, self.deadletter_count = (restored.status.applied,
                                               restored.status.deadletters)

    def start_over(self, why: str) -> None:
        """A stream went backwards, or a restored record does not restore: rebuild (the
        run loop does, before its next flush)."""
        self.resync_why = why
        self.resync = True
        self._wake.set()

    def place_deferred(self, seq: int | None) -> None:
        """Place the restored records the fold has passed (all of them for None)."""
        deferred = self.deferred
        assert deferred is not None
        nxt = deferred.next_seq
        if nxt is None or (seq is not None and seq <= nxt):
            return
        try:
            placed = (deferred.place_rest(self.state) if seq is None
                      else deferred.place_before(self.state, seq))
        except CheckpointError as exc:
            log.warning("projector: a record written after the status does not restore "
                        "(%s); rebuilding from %s", exc.message, EVENTS_STREAM)
            self.deferred = None
            self.start_over(f"a record written after the status does not restore: "
                            f"{exc.message}")
            return
        for host in placed:
            if host is None:
                self.dirty.cluster = True
            else:
                self.dirty.hosts.add(host)
        if not len(deferred):
            self.deferred = None

    def place_lazy(self, place: Callable[[], None]) -> None:
        """Place restored records now (`place` says which); a record that does not
        restore makes the projector rebuild from CRR_EVENTS."""
        lazy = self.lazy
        assert lazy is not None
        try:
            place()
        except (CheckpointError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("projector: a CRR_SNAPSHOT record does not restore (%s); rebuilding "
                        "from %s", exc, EVENTS_STREAM)
            self.lazy = None
            self.start_over(f"a {SNAPSHOT_STREAM} record does not restore: {exc}")
            return
        if not len(lazy):
            self.lazy = None

    async def refine_lazy(self, written: WrittenRecords) -> None:
        """After the first start, a chunk at a time between events: read the first deadlines
        of the restored records not read at start (`Lazy.refine`: the status's bound then
        does not bring them all at once, and a record that does not restore is found now),
        and digest the records read at start, `written` (then only their digests are
        kept)."""
        while True:
            lazy = self.lazy
            refine = lazy is not None and lazy.unrefined > 0
            if not refine and not written.unhashed:
                return
            if refine:
                assert lazy is not None
                self.place_lazy(functools.partial(lazy.refine, self.state, REFINE_CHUNK))
            written.digest_some(REFINE_CHUNK)
            await asyncio.sleep(0)

    def rewrite_all(self) -> None:
        """Mark every record dirty (restored records not placed yet placed first): the next
        flush writes whatever CRR_SNAPSHOT does not hold as folded."""
        if self.lazy is not None:
            self.place_lazy(functools.partial(self.lazy.everything, self.state))
        self.dirty.hosts.update(host_names(self.state))
        self.dirty.cluster = self.dirty.catalog = True

    def expire(self, now: float) -> None:
        """Expiry up to `now` (restored records due by then placed first)."""
        if self.lazy is not None:
            self.place_lazy(functools.partial(self.lazy.due, self.state, now))
        self.dirty.merge(expire(self.state, now))

    def next_deadline(self) -> float | None:
        """When expiry next has something to do (a restored record coming due included)."""
        deadline = next_deadline(self.state)
        due = self.lazy.next_due if self.lazy is not None else None
        if due is None:
            return deadline
        return due if deadline is None else min(due, deadline)

    def unwritten(self) -> bool:
        """Something folded is not in CRR_SNAPSHOT yet: a change, a dead letter, or events
        that changed nothing but still move the position (so `wait_until` on them returns)."""
        return bool(self.dirty or self.deadletters or self._pos.applied > self._pos.written)

    @property
    def host_count(self) -> int:
        """Hosts this projector folds (restored ones not placed yet included)."""
        return len(self.state.hosts) + (len(self.lazy) if self.lazy is not None else 0)
