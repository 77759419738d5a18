"""What a projector's status record says (docs/contract.md, "Payloads"), and the record itself.

A status carries the position (`last_seq`, `covered_seq`: `crr.projector.position`),
the cut of the state the records it covers reflect (`Cut`: taken as a flush begins),
how the projector started (`Origin`: restored, or rebuilt and why), and, while a
rebuild reads the retained history, its progress (`Rebuild`).  Nothing here does IO:
`crr.projector.output` writes the record.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from crr.projections.state import ProjectionState
from crr.projector.position import Position
from crr.projector.restore import catalog_digest
from crr.schemas.codec import encode
from crr.schemas.snapshot import CHECKPOINT_FORMAT, ProjectorStatus, RebuildProgress
from crr.schemas.wire_time import floor_millis, format_time


def tick() -> float:
    """The wall clock floored to the millisecond, as `last_tick` carries it on the wire.

    The projector expires with this `now` and writes it as the status's
    `last_tick`, so `crr replay --verify` can expire at exactly the same `now`.
    """
    return floor_millis(time.time())


@dataclass(frozen=True)
class Cut:
    """What a status record says of the state its records reflect (taken as a flush
    begins, so events folded during the flush do not leak into it)."""

    applied: int = 0
    deadletters: int = 0
    catalog_seq: int = 0
    catalog_digest: str = ""
    next_due: float | None = 0.0
    """No pending deadline of the state comes before this (None: none pending; the
    default 0.0 claims nothing): the status's `next_due_ts`."""

    def at(self, state: ProjectionState, applied: int, deadletters: int,
           next_due: float | None) -> Cut:
        """The cut of `state` now (the catalog's digest computed once per catalog)."""
        digest = self.catalog_digest
        if state.catalog_seq != self.catalog_seq or not digest:
            digest = catalog_digest(encode(state.catalog)) if state.catalog is not None else ""
        return Cut(applied=applied, deadletters=deadletters, catalog_seq=state.catalog_seq,
                   catalog_digest=digest, next_due=next_due)


@dataclass
class Rebuild:
    """A rebuild in progress: what it has read, for its status and progress bar."""

    first_seq: int
    """CRR_EVENTS's first sequence when the rebuild began."""
    started: float
    """`time.monotonic()` then."""
    total: int = 0
    """Events the stream held then (until the first delivery says how many follow it)."""
    read: int = 0
    first_read: int = 0
    """The first sequence delivered (past `first_seq` when retention removed events)."""

    def seen(self, seq: int) -> None:
        if not self.first_read:
            self.first_read = seq
        self.read += 1

    def progress(self, pending: int) -> RebuildProgress:
        rate = self.read / max(time.monotonic() - self.started, 1e-6)
        left = pending if self.read else self.total
        return RebuildProgress(folded=self.read, to_fold=self.read + left, rate=round(rate, 1),
                               eta_s=round(left / rate, 1) if rate > 0 else None,
                               from_seq=self.first_read or self.first_seq)


@dataclass
class Origin:
    """How this projector started, as its status says it (`crr.projector.start`
    sets it)."""

    note: str = ""
    """Restored or rebuilt, and why: the status's `start`."""
    restored: bool = False
    """Whether the last start restored from CRR_SNAPSHOT (else it rebuilt from events)."""
    start_seq: int = 0
    """The status's `start_seq` (0: the fold of every retained event)."""
    retained_from: str | None = None
    """The first retained event's time when this projector last rebuilt (None: restored)."""
    rebuilding: Rebuild | None = None
    """Set while the initial load folds the retained history."""


@dataclass(frozen=True)
class Identity:
    """Who writes the status: fixed for a projector's life."""

    projector_id: str
    partition: int | None
    partitions: int | None
    started_at: float


def status_record(now: float, *, who: Identity, pos: Position, cut: Cut, origin: Origin,
                  hosts: int, watermark: float | None = None) -> ProjectorStatus:
    """The status of `who` at `now` (bring `pos`'s coverage up to date first); `watermark`
    the time the fold last expired at (None: not started: claims nothing)."""
    rebuilding = origin.rebuilding
    return ProjectorStatus(
        last_seq=pos.written,
        stream_last_seq=pos.stream_last,
        lag=pos.pending,
        last_tick=format_time(now),
        started_at=format_time(who.started_at),
        applied=cut.applied,
        deadletters=cut.deadletters,
        hosts=hosts,
        projector_id=who.projector_id,
        start_seq=origin.start_seq,
        partition=who.partition,
        partitions=who.partitions,
        covered_seq=pos.covered,
        checkpoint=CHECKPOINT_FORMAT,
        catalog_seq=cut.catalog_seq,
        catalog_digest=cut.catalog_digest,
        start=origin.note,
        next_due_ts=cut.next_due,
        phase="" if rebuilding is None else "rebuilding",
        progress=None if rebuilding is None else rebuilding.progress(pos.pending),
        retained_from=origin.retained_from,
        watermark="" if watermark is None else format_time(watermark),
        watermark_ts=watermark,
    )
