"""The projector's start: restore from CRR_SNAPSHOT, or rebuild from CRR_EVENTS.

The snapshot is the checkpoint (docs/contract.md, "Payloads"): on start the projector restores
its fold state from its own CRR_SNAPSHOT records and status (`crr.projector.restore`) and folds
CRR_EVENTS from right after the position the status covers.  Only when it cannot
(first start, snapshot deleted, a status of an older writer or an unfinished rebuild,
a record that does not restore, the events stream behind the snapshot) does it
rebuild: it folds every event CRR_EVENTS retains, from its first stored message to the
end, in order — the fold `crr replay --verify` runs — and says why in the log and in
its status (`start`).  Meanwhile its status says `rebuilding` with progress and claims
no position.  Nothing is written until that initial load is complete.

Repartitioning (N changes, or 1 ↔ N): each new partition restores from the old
layout's host records it now owns (`crr.projector.restore`), folding CRR_EVENTS
from the oldest position they need; events stored before the change keep the
subjects of the old layout (no partition token, or another N's), so that read
and a partition's rebuild take every subject and keep the catalog, the cluster
subjects (partition 0) and the hosts that `partition(N, host)` gives it,
whatever token they were stored with; a rebuilding partition then switches to a
consumer filtered on its own subjects.  A host that moved keeps its state, and
exactly one partition writes its record.

A stream that went backwards (`crr.projector.checks`) makes the run loop
start over (`Start.start_over`): the retained CRR_EVENTS folded again, every record
CRR_SNAPSHOT no longer holds as folded rewritten.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from crr.bus.cancel import cancel_and_wait
from crr.bus.connection import Connection
from crr.bus.jetstream import jetstream, stream_range, stream_state
from crr.projector.freezer import Freezer
from crr.projector.input import Input, partition_filters
from crr.projector.live_fold import LiveFold
from crr.projector.output import Output
from crr.projector.position import Position
from crr.projector.restore import NotRestorable, Restored, restore_from
from crr.projector.status import Cut, Origin, Rebuild
from crr.projector.watermark import previous_watermark
from crr.runtime.gc_pause import gc_paused
from crr.schemas.subjects import EVENTS_STREAM, SNAPSHOT_STREAM
from crr.schemas.wire_time import format_time

log = logging.getLogger("crr.projector")


def retention_gap(first_seq: int, first_read: int) -> str | None:
    """What the start note says when retention removed the first events while a rebuild
    read (the stream's first sequence was `first_seq` as it began, the first event it
    read `first_read`): the rebuild goes on from there, it neither fails nor starts over."""
    if first_read <= first_seq:
        return None
    return (f"retention removed events {first_seq}..{first_read - 1} while the rebuild read; "
            f"it went on from seq {first_read}")


@dataclass(frozen=True)
class Parts:
    """The projector's parts a start loads into (the run loop builds them)."""

    fold: LiveFold
    input: Input
    output: Output
    pos: Position
    origin: Origin
    gc: Freezer


@dataclass(frozen=True)
class Plan:
    """How this projector starts: its partition (of `partitions`), whether it may restore,
    whether it is an HA standby, how often a rebuild says how far it got."""

    partition: int | None = None
    partitions: int | None = None
    restore: bool = True
    """False: always rebuild, never restore (a benchmark's baseline)."""
    standby: bool = False
    """(HA) It writes nothing while loading, not even a rebuilding status."""
    status_interval: float = 1.0


class Start:
    """The initial load of one projector (see module doc), and starting over."""

    def __init__(self, nc: Connection, parts: Parts, plan: Plan) -> None:
        self._nc = nc
        self._js = jetstream(nc, timeout=10.0)
        self._fold = parts.fold
        self._input = parts.input
        self._output = parts.output
        self._pos = parts.pos
        self._origin = parts.origin
        self._gc = parts.gc
        self._partition = plan.partition
        self._partitions = plan.partitions
        self._restore = plan.restore
        self._standby = plan.standby
        self._status_interval = plan.status_interval
        self.rebuilds = 0
        """Rebuilds after a stream went backwards."""

    async def load(self, *, restore: bool, digest: bool = False) -> None:
        """Load what CRR_SNAPSHOT holds; restore from it (`restore`) and fold CRR_EVENTS
        from right after its position, or else fold all of CRR_EVENTS on a new consumer;
        returns when that initial load is folded.  `digest`: digest the records read now
        (else after ready: `LiveFold.refine_lazy`; a standby always digests now)."""
        await self._input.stop()
        with gc_paused():
            await self._load(restore=restore, digest=digest or self._standby)

    async def _load(self, *, restore: bool, digest: bool) -> None:
        """`load` with the cyclic GC paused."""
        fold = self._fold
        raw = await self._output.load_written(digest=digest)
        why = ("restoring is switched off" if not self._restore else
               fold.resync_why or "CRR_SNAPSHOT was found behind CRR_EVENTS or lost messages")
        fold.resync_why = ""
        if restore:
            info = await stream_state(self._js, EVENTS_STREAM)
            try:
                restored = await restore_from(
                    self._js, raw, partition=self._partition, partitions=self._partitions,
                    events_first=info.first_seq, events_last=info.last_seq)
            except NotRestorable as exc:
                why = str(exc)
            else:
                del raw
                await self._resume(restored)
                return
        if self._output.watermark is None:
            # Readers keep the old records while it rebuilds: they hold at their watermark.
            self._output.watermark = previous_watermark(raw, self._partition)
        del raw
        await self._fold_history(why)

    async def _fold_history(self, why: str) -> None:
        """Rebuild: fold every event CRR_EVENTS retains, from its first stored message to
        the end, in order (docs/contract.md, "Payloads": the snapshot equals a fold of
        every retained event) — the fold `crr replay --verify` runs too — then go
        live.  (The last event per subject alone would drop every value a later partial
        report omitted.)  While it reads, a status says `rebuilding` with its progress;
        no record is written until it is done (readers keep the old ones meanwhile)."""
        rng = await stream_range(self._nc)
        origin = self._origin
        origin.restored = False
        origin.start_seq = 0  # no last-per-subject part: the fold of every retained event
        origin.retained_from = (format_time(rng.first_time) if rng.first_time is not None
                                else None)
        count = 0 if rng.empty else rng.last_seq - rng.first_seq + 1
        retained = (f"the fold of {count} retained event(s) from seq {rng.first_seq}, "
                    f"first at {origin.retained_from}; values reported only before then are "
                    "gone" if origin.retained_from is not None else f"{EVENTS_STREAM} is empty")
        origin.note = f"rebuilt from {EVENTS_STREAM}: {why}; {retained}"
        log.log(logging.INFO if "first start" in why else logging.WARNING,
                "projector: rebuilding from %s: %s; %s", EVENTS_STREAM, why, retained)
        origin.rebuilding = Rebuild(first_seq=rng.first_seq, started=time.monotonic(),
                                    total=count)
        reporter = None
        if not self._standby:  # (a standby writes nothing)
            await self._output.rebuild_status()  # said at once, before the first event is read
            reporter = asyncio.create_task(self._report_rebuild())
        try:
            # Every subject, whatever layout stored it: a partition keeps its own (`owns`).
            await self._input.read()
            await self._input.wait_loaded()
        finally:
            await cancel_and_wait(reporter)
        rebuild, origin.rebuilding = origin.rebuilding, None
        gone = None if rng.empty else retention_gap(rng.first_seq, rebuild.first_read)
        if gone is not None:
            log.warning("projector: %s", gone)
            origin.note += f"; {gone}"
        log.info("projector: rebuilt from %d event(s) in %.1f s (%d hosts)", rebuild.read,
                 time.monotonic() - rebuild.started, self._fold.host_count)
        await self._narrow()

    async def _narrow(self) -> None:
        """After a load over every subject: a partition goes on live with only its own
        subjects, from right after the last event the load delivered (read once it has
        stopped).  The stream stores with this layout by then (`check_layout`), so no
        event of another layout's subjects comes after."""
        if self._partition is None:
            return
        loaded = self._input.reader
        assert loaded is not None
        await self._input.stop()
        await self._input.read(start_seq=loaded.last_seq + 1,
                               filters=partition_filters(self._partition))

    async def _report_rebuild(self) -> None:
        """While rebuilding, a `rebuilding` status about every `status_interval` (at least
        every 2 s), so `crr projector`, `/healthz`, the page and the view can say so."""
        every = min(max(self._status_interval, 0.2), 2.0)
        while True:
            await asyncio.sleep(every)
            await self._output.rebuild_status()

    async def _resume(self, restored: Restored) -> None:
        """Take the restored state and fold CRR_EVENTS from right after its position."""
        fold, origin = self._fold, self._origin
        st = restored.status
        seq = st.last_seq
        fold.resume(restored)
        # Its input is the one the status describes: `--verify` replays the same.
        origin.start_seq = st.start_seq
        self._output.resume(Cut(applied=st.applied, deadletters=st.deadletters,
                                catalog_seq=st.catalog_seq, catalog_digest=st.catalog_digest,
                                next_due=fold.next_deadline()))
        await self._pos.restart_at(seq, covered=st.covered_seq, stream_last=st.stream_last_seq)
        origin.restored = True
        origin.note = (f"restored from {SNAPSHOT_STREAM} at seq {seq} ({restored.records} "
                       f"record(s), {len(restored.deferred)} written after the status)"
                       f"{restored.note}")
        log.info("projector: %s", origin.note)
        origin.retained_from = None
        # From another layout's records, the events after `seq` may be stored under that
        # layout's subjects (stored after its projectors stopped, before the change): every
        # subject up to the end, then only this partition's (a partition keeps its own).
        mixed = restored.other_layout
        await self._input.read(start_seq=seq + 1,
                               filters=None if mixed else partition_filters(self._partition))
        await self._input.wait_loaded()
        if fold.deferred is not None:
            fold.place_deferred(None)
        if mixed:
            await self._narrow()

    async def start_over(self) -> None:
        """Start over after a stream went backwards: fold the retained CRR_EVENTS again, and
        rewrite every record CRR_SNAPSHOT no longer holds as folded."""
        self.rebuilds += 1
        await self.reset()
        await self.load(restore=False, digest=True)
        self._fold.rewrite_all()
        self._fold.resync = False
        self._gc.loaded(self._fold.state)
        log.info("projector rebuilt at seq %d (%d hosts)", self._pos.applied,
                 len(self._fold.state.hosts))

    async def reset(self) -> None:
        """Forget every folded event and what CRR_SNAPSHOT was seen to hold: the state of a
        projector that has loaded nothing (before a load again: starting over, or a first
        load that failed half-way)."""
        self._gc.discard()  # the old state is garbage now
        self._fold.reset()
        self._output.forget_written()
        self._output.resume(Cut())
        await self._pos.restart_at(0)  # sequences were re-used: the old position means nothing
