"""The projector service: CRR_EVENTS → pure fold → CRR_SNAPSHOT.

IO lives here and in the parts; the fold (`crr.projections.fold`) is pure.  The `Projector`
is the run loop over named parts, each of which reads alone:

- start-up (`crr.projector.start`): restore from CRR_SNAPSHOT (the snapshot is
  the checkpoint, docs/contract.md, "Payloads": `crr.projector.restore`), or rebuild from the
  retained CRR_EVENTS, and starting over when a stream went backwards;
- input (`crr.projector.input`): the one CRR_EVENTS reader, and back-pressure
  while a flush encodes;
- the live fold (`crr.projector.live_fold`): the state, what is dirty, dead letters,
  restored records placed lazily;
- output and status (`crr.projector.output`, `crr.projector.status`):
  the records a flush writes (`crr.projector.snapshot_writer`) and the status behind them;
- HA and peers (`crr.projector.peers`): the lease, the other partitions' status;
- stream checks (`crr.projector.checks`): layout, retention, a stream gone
  backwards, CRR_SNAPSHOT deleted;
- the cyclic GC (`crr.projector.freezer`), positions (`crr.projector.position`).

Nothing is written until the initial load is complete; then only records whose
canonical bytes differ from what CRR_SNAPSHOT already holds are written, so a restart
publishes nothing spurious.  Stale transitions are driven by a deadline (the fold's
`next_deadline`), not a coarse poll.

Position: after the records it covers the projector writes its status
(`last_seq`, `covered_seq`) — right after the flush that caught up, and while
behind about every `STATUS_GAP` — so by stream order a reader that has read
the status has read every record it covers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from dataclasses import dataclass

from crr.bus.connection import Connection, add_reconnect_listener
from crr.bus.errors import nats_errors
from crr.bus.jetstream import jetstream
from crr.bus.retry import SNAPSHOT_WRITE, START
from crr.bus.streams import StreamSettings, provision
from crr.projections.state import ProjectionState
from crr.projector.checks import Retention, StreamChecks, check_layout
from crr.projector.freezer import Freezer
from crr.projector.input import Input, partition_filters
from crr.projector.lease import Lease
from crr.projector.live_fold import LiveFold
from crr.projector.metrics import ProjectorMetrics
from crr.projector.output import Output
from crr.projector.peers import Peers, take_lease
from crr.projector.position import Position
from crr.projector.snapshot_writer import SnapshotWriter
from crr.projector.start import Parts, Plan, Start
from crr.projector.status import Identity, Origin, tick
from crr.projector.watermark import Watermark
from crr.schemas.errors import BusError, CrrError, CrrTimeoutError, LeaseLostError
from crr.schemas.snapshot import RebuildProgress
from crr.schemas.subjects import SNAPSHOT_STREAM, owns

log = logging.getLogger("crr.projector")


STATUS_GAP = 0.025
"""While behind (more to fold or flush), a status about this often (seconds): not more often,
and as soon as the flush in progress ends once the gap has passed.

A status after every flush — ~300 a second under a steady 5k/s — cost a round trip per
flush (the next flush waited for the status's ack) and ~6% of the messages the server
stores; once caught up the status goes out right after the flush, as always."""


@dataclass
class _Pace:
    """When the run loop writes the status, and how its writes have been failing."""

    next_status: float = 0.0
    last_status: float = 0.0
    owed: bool = False
    """Records flushed that no status covers yet."""
    failures: int = 0


class Projector:
    """Runs the fold live; offers its position and `wait_until(seq)`."""

    def __init__(
        self,
        nc: Connection,
        *,
        settings: StreamSettings | None = None,
        status_interval: float = 1.0,
        projector_id: str | None = None,
        lease: Lease | None = None,
        partition: int | None = None,
        gc_freeze: bool = False,
        restore: bool = True,
    ) -> None:
        """`lease`: HA mode (ops/projector/lease.py) — write only while holding it, else follow as a
        warm standby.  `partition`: fold only the hosts of that partition (see
        `partition_filters`); partition 0 also owns the catalog and cluster records.
        `gc_freeze`: a process-wide choice for the process that runs the projector
        (`crr projector`): see `crr.projector.freezer.Freezer`.  `restore=False`: always
        rebuild from the retained history, never restore from CRR_SNAPSHOT (a benchmark's
        baseline)."""
        self._restore = restore
        self._nc = nc
        self._lease = lease
        self.partition = partition
        self.partitions: int | None = None
        """N when this is partition `partition` of N (from `settings.partitions`)."""
        if partition is not None:
            n = settings.partitions if settings is not None else 1
            if n < 2 or not 0 <= partition < n:
                raise CrrError(f"projector partition {partition} needs StreamSettings"
                               f"(partitions=N) with N > max(1, {partition}) (got N = {n})")
            self.partitions = n
        self.warm = asyncio.Event()
        """Set once the initial load is folded (a standby is warm, not ready)."""
        self.ready = asyncio.Event()
        self._settings = settings
        self._status_interval = status_interval
        self.projector_id = projector_id or f"{os.uname().nodename}-{secrets.token_hex(3)}"
        self._wake = asyncio.Event()
        self._pos = Position(jetstream(nc, timeout=10.0), partition_filters(partition))
        self._origin = Origin()
        self.metrics = ProjectorMetrics(self)
        # Only the metrics census reads the written bytes back; otherwise a digest per
        # record is enough to skip unchanged writes (≈20 B instead of ≈4.5 KB per host).
        self._writer = SnapshotWriter(nc, lease=lease, keep_bytes=self.metrics.enabled)
        self._fold = LiveFold(
            pos=self._pos, metrics=self.metrics, origin=self._origin, wake=self._wake,
            owns=None if partition is None else owns(partition, self.partitions or 1))
        self._input = Input(nc, self._fold.fold)
        self._retention = Retention(self._fold)
        who = Identity(projector_id=self.projector_id, partition=partition,
                       partitions=self.partitions, started_at=time.time())
        self._output = Output(nc, self._writer, who=who, pos=self._pos, origin=self._origin,
                              metrics=self.metrics, hosts=lambda: self._fold.host_count,
                              on_catalog=self._retention.check)
        self._checks = StreamChecks(nc, settings, fold=self._fold, output=self._output,
                                    wake=self._wake)
        self._peers = Peers(nc, self._pos, partition=partition, partitions=self.partitions,
                            wake=self._wake)
        self._gc = Freezer(gc_freeze)
        self._watermark = Watermark()
        self._startup = Start(
            nc, Parts(fold=self._fold, input=self._input, output=self._output, pos=self._pos,
                      origin=self._origin, gc=self._gc),
            Plan(partition=partition, partitions=self.partitions, restore=restore,
                 standby=lease is not None, status_interval=status_interval))

    # -- what others read -------------------------------------------------

    @property
    def state(self) -> ProjectionState:
        """The fold state."""
        return self._fold.state

    @property
    def applied(self) -> int:
        return self._fold.applied

    @property
    def deadletter_count(self) -> int:
        return self._fold.deadletter_count

    @property
    def host_count(self) -> int:
        """Hosts this projector folds (restored ones not placed yet included)."""
        return self._fold.host_count

    @property
    def held(self) -> int:
        """Events that arrived while a flush was encoding (folded right after it)."""
        return self._input.held

    @property
    def buffered(self) -> int:
        """Events received and not folded yet (`Input.buffered`)."""
        return self._input.buffered

    @property
    def trims(self) -> int:
        """Times freed memory was given back after catching up (`heap.trim`)."""
        return self._input.trims

    @property
    def start_note(self) -> str:
        """How this projector started (restored or rebuilt, and why): the status's `start`."""
        return self._origin.note

    @property
    def restored(self) -> bool:
        """Whether the last start restored from CRR_SNAPSHOT (else it rebuilt from events)."""
        return self._origin.restored

    @property
    def retained_from(self) -> str | None:
        """The first retained event's time when this projector last rebuilt (None: restored)."""
        return self._origin.retained_from

    @property
    def rebuild_progress(self) -> RebuildProgress | None:
        """While rebuilding: events read of events to read, rate, ETA (else None)."""
        rb = self._origin.rebuilding
        return None if rb is None else rb.progress(self._pos.pending)

    @property
    def rebuilds(self) -> int:
        """Rebuilds after a stream went backwards (see `crr.projector.checks`)."""
        return self._startup.rebuilds

    @property
    def snapshot_recreations(self) -> int:
        """Times CRR_SNAPSHOT was found deleted while running, created again and rewritten."""
        return self._checks.snapshot_recreations

    @property
    def status_writes(self) -> int:
        return self._output.status_writes

    @property
    def writes(self) -> int:
        """Records and status records written."""
        return self._writer.writes

    @property
    def lag(self) -> int:
        """CRR_EVENTS messages not yet delivered (as of the last event applied)."""
        return self._pos.pending

    def written_records(self) -> list[tuple[str, bytes]]:
        """What CRR_SNAPSHOT holds as this projector wrote or loaded it: (subject, bytes).

        Empty unless metrics are enabled (see `WrittenRecords`)."""
        return self._writer.written.items()

    @property
    def position(self) -> int:
        """Last CRR_EVENTS sequence whose effects are written to CRR_SNAPSHOT."""
        return self._pos.written

    async def wait_until(self, seq: int, timeout: float = 10.0) -> None:
        """Wait until every event up to `seq` is reflected in CRR_SNAPSHOT."""
        await self._pos.wait_until(seq, timeout)

    # -- the run loop -----------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Project until `stop` is set (or the task is cancelled)."""
        stop = stop or asyncio.Event()

        async def relay_stop() -> None:
            await stop.wait()
            self._wake.set()

        relay = asyncio.create_task(relay_stop())
        remove_listener = add_reconnect_listener(self._nc, self._checks.on_reconnect)
        remove_hold = add_reconnect_listener(self._nc, self._reconnected)
        graceful = False
        refiner: asyncio.Task[None] | None = None
        try:
            if await self._start(stop):
                refiner = asyncio.create_task(self._fold.refine_lazy(self._writer.written))
                await self._loop(stop)
            graceful = True
        finally:
            relay.cancel()
            if refiner is not None:
                refiner.cancel()
            remove_listener()
            remove_hold()
            await self._peers.close()
            await self._checks.close()
            if self._lease is not None:
                # A clean stop hands the lease over at once; a crash lets it expire.
                await (self._lease.release() if graceful else self._lease.close())
            await self._input.stop()
            await self._writer.close()

    async def _start(self, stop: asyncio.Event) -> bool:
        """Check the streams, load, (HA) take the lease, write the differences; False when
        `stop` came while a standby waited for the lease."""
        # A service keeps running: a server that does not answer yet (a cluster electing
        # its meta leader, a stream leader moving) is retried; a wrong layout is not.
        async for attempt in START.retrying(
                log=log, what=f"projector {self.projector_id}: cannot start yet"):
            with attempt, nats_errors():
                if attempt.retry_state.attempt_number > 1:
                    await self._startup.reset()  # a load that failed half-way
                await provision(self._nc, self._settings)
                self._retention.max_age = await check_layout(self._nc, self.partitions)
                await self._peers.hear()
                await self._startup.load(restore=self._restore, digest=self.ready.is_set())
        self.warm.set()
        self._retention.check()
        if self._lease is not None and not await self._take_lease(stop):
            return False
        # Initial load done (everything stored before it is folded): bring expiry up to
        # the watermark, then write the differences only.
        self._fold.expire(self._advance_watermark(tick()))
        try:
            await self._flush()
        except LeaseLostError:
            pass  # deposed already: back to standby in the loop
        except (BusError, CrrTimeoutError) as exc:
            # (A cluster electing a leader, a refused write): the loop retries it.
            log.warning("initial snapshot write failed (%r); retrying", exc)
        self._gc.loaded(self._fold.state)
        self.ready.set()
        log.info("projector ready at seq %d (%d hosts)", self._pos.written, self.host_count)
        return True

    async def _take_lease(self, stop: asyncio.Event) -> bool:
        assert self._lease is not None
        return await take_lease(self._lease, stop, who=self.projector_id, fold=self._fold,
                                output=self._output, wake=self._wake)

    async def _loop(self, stop: asyncio.Event) -> None:
        """Rounds until `stop`: wait for something to do, then fold, flush, write status."""
        pace = _Pace()
        while not stop.is_set():
            if self._lease is not None and not self._lease.held:
                if not await self._take_lease(stop):
                    break
                pace.next_status = 0.0
            wait = self._wait(pace)
            idle = not self._fold.dirty or self._watermark.holds_writes(time.time())
            if idle and not self._peers.status_due and wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
            self._wake.clear()
            try:
                await self._round(pace)
            except LeaseLostError:
                continue  # deposed: back to standby at the top of the loop
            except (BusError, CrrTimeoutError) as exc:
                if self._lease is None and await self._checks.snapshot_recreated():
                    pace.failures = 0
                    continue
                # A service keeps running: even a refusal (the store full) is retried,
                # said at ERROR when the error says retrying alone will not help.
                pace.failures += 1
                if pace.failures == 1 or pace.failures % 50 == 0:
                    # Status writes fail too when the store is full: say so, not only
                    # when a record write fails (which the flush logs).
                    log.log(logging.WARNING if exc.retriable else logging.ERROR,
                            "snapshot write failed (%r); retrying (failure %d)",
                            exc, pace.failures)
                await asyncio.sleep(SNAPSHOT_WRITE.delay(pace.failures))

    def _wait(self, pace: _Pace) -> float:
        """How long the loop may wait for the next event: until the status is due, the
        next deadline, or (records flushed that no status covers) `STATUS_GAP`."""
        now = time.time()
        deadline = self._fold.next_deadline()
        wait = pace.next_status - now
        resume = self._watermark.resume_at
        if resume is not None or not self._nc.is_connected:
            # Held (cut off, or after a reconnect): deadlines wait for the watermark.
            wait = min(wait, (resume or now + wait) - now)
        elif deadline is not None:
            wait = min(wait, deadline - now)
        writes_from = self._watermark.writes_from
        if writes_from is not None and writes_from > now:  # what waits for the write hold
            wait = min(wait, writes_from - now)
        if pace.owed:
            wait = min(wait, pace.last_status + STATUS_GAP - now)
        return wait

    async def _round(self, pace: _Pace) -> None:
        """One round: start over if a stream went backwards, fold the reader's backlog,
        expire, flush what is unwritten, write the status when due."""
        if self._fold.resync:
            with nats_errors():
                await self._startup.start_over()
            pace.next_status = 0.0
            self._watermark.write_now()
        await self._input.fold_backlog()
        now = tick()
        # Deadlines are judged at the watermark, not the tick: folding a backlog in order
        # expires exactly what the history says (docs/contract.md).
        self._fold.expire(self._advance_watermark(now))
        if self._fold.unwritten() and not self._watermark.holds_writes(now):
            await self._flush()
            pace.owed = True
        # A status right behind the records it covers (stream order), so readers of
        # CRR_SNAPSHOT learn the position: after the flush that caught up, and while
        # behind about every STATUS_GAP (the next flush, not the status's round trip,
        # goes first).
        if ((pace.owed and (now - pace.last_status >= STATUS_GAP or self._caught_up()))
                or now >= pace.next_status or self._peers.status_due):
            self._peers.status_due = False
            with nats_errors():
                await self._output.write_status(now)
            if self._output.stream_renewed and self._lease is None:
                log.warning("projector: %s was created again under this projector (its "
                            "sequences went backwards); rewriting every record",
                            SNAPSHOT_STREAM)
                self._checks.rewrite_everything()
            pace.owed = False
            pace.last_status = now
            pace.next_status = now + self._status_interval
        pace.failures = 0
        self._input.trim(self._pos.pending)
        self._gc.grown(self._fold.state)

    @property
    def watermark(self) -> float | None:
        """Every event stored before this time is folded (`crr.projector.watermark`; None:
        not started)."""
        return self._watermark.at

    def _advance_watermark(self, now: float) -> float:
        """The watermark at this round's tick `now` (what the fold expires at and the
        status carries)."""
        last = self._fold.last_event
        at = self._watermark.advance(
            now, connected=bool(self._nc.is_connected),
            caught_up=not (self.buffered or self._pos.pending),
            last_stored=None if last is None else last.time,
            reconnect_wait=self._reconnect_wait(), reconnect_cap=self._reconnect_cap())
        self._output.watermark = at
        return at

    def _reconnected(self) -> None:
        """NATS is back: hold the watermark for one longest `interval + grace`, so reporters
        whose reports could not be stored meanwhile report again before it moves on."""
        wait = self._reconnect_wait()
        self._watermark.reconnected(time.time(), wait, self._reconnect_cap())
        log.info("projector: reconnected; watermark held until %.1f s after the first event "
                 "stored since", wait)

    def _reconnect_cap(self) -> float:
        """The catalog's `outage_hold` (the longest a reconnect holds the watermark)."""
        catalog = self._fold.state.catalog
        return catalog.outage_hold_s() if catalog is not None else 0.0

    def _reconnect_wait(self) -> float:
        """The catalog's longest `interval + grace` (0 without a catalog)."""
        catalog = self._fold.state.catalog
        return catalog.longest_lifetime() if catalog is not None else 0.0

    async def _flush(self) -> None:
        """Write what the fold owes: arriving events are held while the records are encoded
        (so each reflects the cut its status claims), then folded on while the acks come
        back; on failure the fold owes it all again (the next round retries)."""
        owed = self._fold.take()
        self._input.hold()
        try:
            with nats_errors():
                await self._output.flush(owed, encoded=self._input.release)
        except (BusError, CrrTimeoutError, LeaseLostError):
            self._fold.put_back(owed)
            raise
        finally:
            self._input.release()

    def _caught_up(self) -> bool:
        """Nothing left to flush: nothing unwritten, nothing received and not folded,
        nothing in CRR_EVENTS not delivered yet (as of the last event folded)."""
        return not (self._fold.unwritten() or self.buffered or self._pos.pending)
