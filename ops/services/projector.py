"""The projector service: CRR_EVENTS → pure fold → CRR_SNAPSHOT.

IO lives here; the fold (`projections.fold`) is pure.  The snapshot is the
checkpoint (DESIGN §4): on start the projector restores its fold state from
its own CRR_SNAPSHOT records and status (`ops.services.restore`) and folds CRR_EVENTS
from right after the position the status covers.  Only when it cannot (first
start, snapshot deleted, of another layout or an older writer, a record that
does not restore, the events stream behind the snapshot) does it rebuild from
the last event per subject (`DeliverLastPerSubject`), and says why in the log
and in its status (`start`).  Nothing is written until that initial load is
complete; then only records whose canonical bytes differ from what
CRR_SNAPSHOT already holds are written, so a restart publishes nothing
spurious.  Stale transitions are
driven by a deadline (the fold's `next_deadline`), not a coarse poll.

Position: after the records it covers the projector writes its status
(`last_seq`, `covered_seq`) — right after the flush that caught up, and while
behind about every `STATUS_GAP` — so by stream order a reader that has read
the status has read every record it covers.  A partition (`partition=k` of N) consumes
only its own subjects, so its `last_seq` is the last of *its* events; its
`covered_seq` extends that over the other partitions' events
(`ops.services.position`).

The `Projector` is the run loop over named parts: `ops.services.restore` (the
checkpoint restore, with `projections.checkpoint`), `ops.services.position` (stream
positions and coverage), `ops.services.snapshot_writer` (dedupe, pipelined and
fenced writes, dead letters), and the pure fold.

Repartitioning (N changes, or 1 ↔ N): events stored before the change keep
the subjects of the old layout (no partition token, or another N's).  So a
partition's initial load reads the last event per subject of the *whole*
stream — the same work as an unpartitioned projector's start — and keeps
the catalog, the cluster subjects (partition 0) and the hosts that
`partition(N, host)` gives it, whatever token they were stored with; only
then does it switch to a consumer filtered on its own subjects.  A host
that moved keeps its state, and exactly one partition writes its record.

The stream going backwards: after every reconnect the projector checks that
CRR_EVENTS still holds the last event it folded and CRR_SNAPSHOT the last
status it wrote (`bus.stream_check`); a server that lost acknowledged
messages fails that check, and the projector rebuilds from the last event
per subject and rewrites whatever CRR_SNAPSHOT no longer matches.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from bus import tracing
from bus.connection import add_reconnect_listener
from bus.errors import nats_errors
from bus.ordered import OrderedReader, StoredMessage
from bus.retry import SNAPSHOT_WRITE, TAKEOVER_READ
from bus.stream_check import Generations, Seen, lost
from bus.streams import StreamSettings, provision, stored_partitions
from ops.services import heap
from ops.services.checkpoint_read import RawRecords, load_checkpoint
from ops.services.lease import Lease
from ops.services.metrics import ProjectorMetrics
from ops.services.position import Position
from ops.services.restore import NotRestorable, Restored, catalog_digest, restore_from
from ops.services.snapshot_writer import Record, SnapshotWriter
from projections.checkpoint import CheckpointError, Deferred, Lazy
from projections.envelope import Envelope
from projections.fold import Changes, apply, expire, next_deadline
from projections.state import (
    ProjectionState,
    cluster_record,
    host_columns,
    host_names,
    host_record,
)
from schemas.codec import DECODERS, encode
from schemas.errors import BusError, CrrError, CrrTimeoutError, LeaseLostError, StreamConfigError
from schemas.events import DeadLetter
from schemas.snapshot import CHECKPOINT_FORMAT, ProjectorStatus
from schemas.subjects import (
    CATALOG,
    DEADLETTER,
    EVENTS_STREAM,
    EVERYTHING,
    SNAPSHOT_CATALOG,
    SNAPSHOT_CLUSTER,
    SNAPSHOT_STREAM,
    STATUS_PARTITIONS,
    cluster_event_filter,
    host_snapshot_subject,
    owns,
    partition_event_filter,
    published_subject,
    status_subject,
)
from schemas.wire_time import floor_millis, format_time

log = logging.getLogger("crr.projector")

_status_decoder: msgspec.json.Decoder[ProjectorStatus] = DECODERS[ProjectorStatus]

HOLD_LIMIT = 1024
"""Events held during a flush before the reader is made to wait (see `_on_event`).

Later ones wait in the reader's backlog, as raw bytes (`bus.ordered_direct`), up to the
server's flow-control window (32 MiB of messages); the rest waits in CRR_EVENTS.  Held
events cost ~1.3 KB each in small objects, whose freed memory the process keeps (32,768
of them with a backlog of `Msg`s made the RSS after an overload 2-3x the steady one)."""


STATUS_GAP = 0.025
"""While behind (more to fold or flush), a status about this often (seconds): not more often,
and as soon as the flush in progress ends once the gap has passed.

A status after every flush — ~300 a second under a steady 5k/s — cost a round trip per
flush (the next flush waited for the status's ack) and ~6% of the messages the server
stores; once caught up the status goes out right after the flush, as always."""


BACKLOG_WAIT = 1.0
"""At most this long a flush waits for the reader's backlog to be folded first."""


REFINE_CHUNK = 500
"""Restored records whose first deadline `_refine_lazy` reads per turn of the loop (~5 ms)."""


def tick() -> float:
    """The wall clock floored to the millisecond, as `last_tick` carries it on the wire.

    The projector expires with this `now` and writes it as the status's
    `last_tick`, so `crr replay --verify` can expire at exactly the same `now`.
    """
    return floor_millis(time.time())


@dataclass(frozen=True)
class _Cut:
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
           next_due: float | None) -> _Cut:
        """The cut of `state` now (the catalog's digest computed once per catalog)."""
        digest = self.catalog_digest
        if state.catalog_seq != self.catalog_seq or not digest:
            digest = catalog_digest(encode(state.catalog)) if state.catalog is not None else ""
        return _Cut(applied=applied, deadletters=deadletters, catalog_seq=state.catalog_seq,
                    catalog_digest=digest, next_due=next_due)


@dataclass
class _Dirty:
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


class Projector:
    """Runs the fold live; offers its position and `wait_until(seq)`."""

    def __init__(
        self,
        nc: Client,
        *,
        settings: StreamSettings | None = None,
        status_interval: float = 1.0,
        projector_id: str | None = None,
        lease: Lease | None = None,
        partition: int | None = None,
        gc_freeze: bool = False,
        restore: bool = True,
    ) -> None:
        """`lease`: HA mode (ops/services/lease.py) — write only while holding it, else follow as a
        warm standby.  `partition`: fold only the hosts of that partition (see
        `partition_filters`); partition 0 also owns the catalog and cluster records.
        `gc_freeze`: a process-wide choice for the process that runs the projector
        (`crr projector`): see `_freeze_gc`.  `restore=False`: always rebuild from the last
        event per subject, never restore from CRR_SNAPSHOT (a benchmark's baseline)."""
        self._restore = restore
        self._nc = nc
        self._gc_freeze = gc_freeze
        self._frozen_hosts = 0
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
        self._js = nc.jetstream(timeout=10.0)
        self._settings = settings
        self._status_interval = status_interval
        self.projector_id = projector_id or f"{os.uname().nodename}-{secrets.token_hex(3)}"
        self.state = ProjectionState()
        self._dirty = _Dirty()
        self._wake = asyncio.Event()
        self._deadletters: list[DeadLetter] = []
        self._pos = Position(self._js, partition_filters(partition))
        self._cut = _Cut()
        """What the status says of the state the written records reflect."""
        self._deferred: Deferred | None = None
        self._lazy: Lazy | None = None
        """Restored host records not placed yet (`projections.checkpoint.Lazy`)."""
        """Records written after the status restored from, placed as the fold passes them."""
        self.start_note = ""
        """How this projector started (restored or rebuilt, and why): the status's `start`."""
        self.restored = False
        """Whether the last start restored from CRR_SNAPSHOT (else it rebuilt from events)."""
        self._start_seq = 0
        self._last_event: StoredMessage | None = None
        """The last event folded (what CRR_EVENTS must still hold at its seq)."""
        self._last_status: Seen | None = None
        """(seq, subject, data) of the last status written (what CRR_SNAPSHOT must hold)."""
        self._generations = Generations()
        """One per CRR_EVENTS consumer: events of a replaced one are ignored."""
        self._owns = None if partition is None else owns(partition, self.partitions or 1)
        """Partitioned: whether an event is this partition's to fold (the live consumer's
        filters only deliver its own subjects; the initial load reads every subject)."""
        self._resync = False
        """Set when a stream went backwards: rebuild before the next flush."""
        self._resync_why = ""
        """Why `_resync` was set (the rebuild's start note)."""
        self._check: asyncio.Task[None] | None = None
        self._status_due = False
        """Write the status now: another partition's status moved past this one's."""
        self._peers: Subscription | None = None
        self.rebuilds = 0
        """Rebuilds after a stream went backwards (see the module doc)."""
        self._events: OrderedReader | None = None
        self._started_at = time.time()
        self.applied = 0
        self.deadletter_count = 0
        self.held = 0
        """Events that arrived while a flush was encoding (folded right after it)."""
        self.status_writes = 0
        self.ready = asyncio.Event()
        self._flushed = asyncio.Event()
        """Set when no flush is encoding (`_on_event` waits on it when many are held)."""
        self._flushed.set()
        self._held: list[tuple[StoredMessage, tracing.SpanContext | None]] | None = None
        """Events that arrived while a flush was encoding, folded when it ends."""
        self._trim_due = False
        """The reader was made to wait (behind): give freed memory back once caught up."""
        self.trims = 0
        """Times freed memory was given back after catching up (`heap.trim`)."""
        self.metrics = ProjectorMetrics(self)
        # Only the metrics census reads the written bytes back; otherwise a digest per
        # record is enough to skip unchanged writes (≈20 B instead of ≈4.5 KB per host).
        self._writer = SnapshotWriter(nc, lease=lease, keep_bytes=self.metrics.enabled)

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

    # -- position ---------------------------------------------------------

    @property
    def position(self) -> int:
        """Last CRR_EVENTS sequence whose effects are written to CRR_SNAPSHOT."""
        return self._pos.written

    async def wait_until(self, seq: int, timeout: float = 10.0) -> None:
        """Wait until every event up to `seq` is reflected in CRR_SNAPSHOT."""
        await self._pos.wait_until(seq, timeout)

    # -- input ------------------------------------------------------------

    def _on_event(self, m: StoredMessage) -> Awaitable[None] | None:
        # A sampled report: the snapshot writes it causes continue its trace (the
        # CONSUMER span is current only now, while the reader calls this).
        parent = tracing.current_span_context() if tracing.is_traced(m.headers) else None
        if self._held is None:
            self._fold(m, parent)
            return None
        self._held.append((m, parent))  # a flush is encoding: see `_flush`
        self.held += 1
        if len(self._held) >= HOLD_LIMIT:
            # Back-pressure: the reader waits for the flush (and the server for the
            # reader: see OrderedReader's `backpressure`) instead of buffering here.
            self._trim_due = True
            return self._until_flushed()
        return None

    async def _fold_backlog(self) -> None:
        """Before a flush, fold what waits in the reader (up to `BACKLOG_WAIT` seconds):
        one flush then writes a host that many of those events changed once."""
        if self._events is not None and self._events.waiting:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._events.drained(), BACKLOG_WAIT)

    def _unwritten(self) -> bool:
        """Something folded is not in CRR_SNAPSHOT yet: a change, a dead letter, or events
        that changed nothing but still move the position (so `wait_until` on them returns)."""
        return bool(self._dirty or self._deadletters or self._pos.applied > self._pos.written)

    def _caught_up(self) -> bool:
        """Nothing left to flush: nothing unwritten, nothing received and not folded,
        nothing in CRR_EVENTS not delivered yet (as of the last event folded)."""
        return not (self._unwritten() or self.buffered or self._pos.pending)

    @property
    def buffered(self) -> int:
        """Events received and not folded yet: held during a flush (≤ `HOLD_LIMIT`) and
        waiting in the reader (≤ the server's flow-control window)."""
        held = len(self._held) if self._held is not None else 0
        return held + (self._events.waiting if self._events is not None else 0)

    async def _until_flushed(self) -> None:
        await self._flushed.wait()

    def _fold(self, m: StoredMessage, parent: tracing.SpanContext | None) -> None:
        subject = m.subject
        if self._owns is not None and not self._owns(subject):
            self._pos.dropped(m.seq, m.pending)  # caught up counts past others' events too
            return
        subject = published_subject(subject)  # without a partition token (any layout's)
        if self._deferred is not None:
            self._place_deferred(m.seq)
        if self._lazy is not None:
            self._place_lazy(functools.partial(self._lazy.before, self.state, subject, m.time))
        env = Envelope(seq=m.seq, subject=subject, received_at=m.time, data=m.data)
        ch = apply(self.state, env)
        self.applied += 1
        self._pos.folded(m.seq, m.pending)
        self._last_event = m
        if ch.deadletter is not None and subject != DEADLETTER:
            # `subject` as published (without a partition token), as DESIGN names it.
            self.deadletter_count += 1
            self._deadletters.append(DeadLetter(
                seq=m.seq, subject=subject, reason=ch.deadletter,
                payload=m.data[:4096].decode("utf-8", "replace"),
                received_at=format_time(m.time),
            ))
            log.warning("dead-lettered event %d on %s: %s", m.seq, subject, ch.deadletter)
        self._dirty.merge(ch)
        if parent is not None:
            for h in ch.hosts:
                self._writer.trace_parents[host_snapshot_subject(h)] = parent
            if ch.cluster:
                self._writer.trace_parents[SNAPSHOT_CLUSTER] = parent
        self.metrics.event(m)
        self._wake.set()

    def _place_deferred(self, seq: int | None) -> None:
        """Place the restored records the fold has passed (all of them for None)."""
        deferred = self._deferred
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
            self._deferred = None
            self._resync_why = f"a record written after the status does not restore: {exc.message}"
            self._resync = True
            self._wake.set()
            return
        for host in placed:
            if host is None:
                self._dirty.cluster = True
            else:
                self._dirty.hosts.add(host)
        if not len(deferred):
            self._deferred = None

    def _place_lazy(self, place: Callable[[], None]) -> None:
        """Place restored records now (`place` says which); a record that does not
        restore makes the projector rebuild from CRR_EVENTS."""
        lazy = self._lazy
        assert lazy is not None
        try:
            place()
        except (CheckpointError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("projector: a CRR_SNAPSHOT record does not restore (%s); rebuilding "
                        "from %s", exc, EVENTS_STREAM)
            self._lazy = None
            self._resync_why = f"a {SNAPSHOT_STREAM} record does not restore: {exc}"
            self._resync = True
            self._wake.set()
            return
        if not len(lazy):
            self._lazy = None

    async def _refine_lazy(self) -> None:
        """After the first start, a chunk at a time between events: read the first deadlines
        of the restored records not read at start (`Lazy.refine`: the status's bound then
        does not bring them all at once, and a record that does not restore is found now),
        and digest the records read at start (then only their digests are kept)."""
        written = self._writer.written
        while True:
            lazy = self._lazy
            refine = lazy is not None and lazy.unrefined > 0
            if not refine and not written.unhashed:
                return
            if refine:
                assert lazy is not None
                self._place_lazy(functools.partial(lazy.refine, self.state, REFINE_CHUNK))
            written.digest_some(REFINE_CHUNK)
            await asyncio.sleep(0)

    def _expire(self, now: float) -> None:
        """Expiry up to `now` (restored records due by then placed first)."""
        if self._lazy is not None:
            self._place_lazy(functools.partial(self._lazy.due, self.state, now))
        self._dirty.merge(expire(self.state, now))

    def _next_deadline(self) -> float | None:
        """When expiry next has something to do (a restored record coming due included)."""
        deadline = next_deadline(self.state)
        due = self._lazy.next_due if self._lazy is not None else None
        if due is None:
            return deadline
        return due if deadline is None else min(due, deadline)

    @property
    def host_count(self) -> int:
        """Hosts this projector folds (restored ones not placed yet included)."""
        return len(self.state.hosts) + (len(self._lazy) if self._lazy is not None else 0)

    # -- output -----------------------------------------------------------

    async def _load_written(self) -> RawRecords:
        """Read what CRR_SNAPSHOT holds now, so unchanged records are not rewritten; the
        records read (the checkpoint).  At the first start they are digested after ready
        (`_refine_lazy`), not now."""
        raw = await load_checkpoint(self._nc)
        self._writer.load(raw)
        if self.ready.is_set() or self._lease is not None:
            self._writer.written.digest_some(len(raw))
        return raw

    async def _flush(self) -> None:
        seq, through = self._pos.applied, self._pos.handled
        dirty, self._dirty = self._dirty, _Dirty()
        state = self.state
        cut = self._cut.at(state, self.applied, self.deadletter_count, self._next_deadline())
        owns_shared = self.partition in (None, 0)

        def records() -> Iterator[Record]:
            # Encoded one at a time as they are written (see `_publish_pipelined`), so
            # events arriving meanwhile are held, not folded, until the flush ends: every
            # record written then reflects exactly (`seq`, the last expiry `now`), the cut
            # the status written after it claims (`crr replay --verify` relies on it).
            if dirty.catalog and state.catalog is not None and owns_shared:
                yield SNAPSHOT_CATALOG, encode(state.catalog), None
            if dirty.cluster and owns_shared:
                yield SNAPSHOT_CLUSTER, cluster_record(state), None
            for h in sorted(dirty.hosts):
                # A host no longer in the state was forgotten (`crr hosts forget`): an empty
                # record is its delete marker (readers drop the host; compaction keeps only it).
                if h in state.hosts:
                    yield (host_snapshot_subject(h), host_record(state, h),
                           host_columns(state, h))
                else:
                    yield host_snapshot_subject(h), b"", None
            self._release_held()  # all encoded: fold on while the acks come back

        letters, self._deadletters = self._deadletters, []
        assert self._held is None, "flushes do not overlap"
        self._held = []
        self._flushed.clear()
        try:
            with nats_errors():
                await self._writer.write(records(), letters)
        except (BusError, CrrTimeoutError, LeaseLostError) as exc:
            # Put everything back; the next round retries (the fold state is intact).
            log.warning("snapshot write failed (%s); will retry", exc)
            self._dirty.merge(Changes(hosts=frozenset(dirty.hosts), cluster=dirty.cluster,
                                      catalog=dirty.catalog, deadletter=None))
            self._deadletters[:0] = letters
            raise
        finally:
            self._release_held()
        self.metrics.flushed(time.time())
        self._cut = cut
        await self._pos.flushed(seq, through)

    def _release_held(self) -> None:
        """Fold the events held while a flush was encoding; stop holding."""
        held, self._held = self._held, None
        for m, parent in held or ():
            self._fold(m, parent)
        self._flushed.set()

    async def _coverage(self) -> None:
        """The position work one status write does (`Position.coverage`)."""
        await self._pos.coverage()

    async def _hear_peers(self) -> None:
        """Partitioned: follow the other partitions' status writes (core NATS).

        An idle partition's `covered_seq` only moves when it writes its status;
        on its status interval alone, a reader waiting for another partition's
        event would wait up to that interval.  So when a peer's status says it
        covers more than this one, and nothing of this partition's is pending,
        this one writes its status now (notifications arriving meanwhile are
        coalesced into that one write; a partition never reacts to a peer that
        is not ahead, so two partitions do not echo each other)."""
        if self.partition is None:
            return
        own = status_subject(self.partition)

        async def on_status(msg: Msg) -> None:
            if msg.subject == own or self._pos.pending:
                return
            try:
                peer = _status_decoder.decode(msg.data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                return  # not ours to judge; readers log undecodable records
            if peer.partitions == self.partitions and peer.covered_seq > self._pos.covered:
                self._status_due = True
                self._wake.set()

        self._peers = await self._nc.subscribe(STATUS_PARTITIONS, cb=on_status)

    async def _write_status(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        pos = self._pos
        await pos.coverage()
        status = ProjectorStatus(
            last_seq=pos.written,
            stream_last_seq=pos.stream_last,
            lag=pos.pending,
            last_tick=format_time(now),
            started_at=format_time(self._started_at),
            applied=self._cut.applied,
            deadletters=self._cut.deadletters,
            hosts=self.host_count,
            projector_id=self.projector_id,
            start_seq=self._start_seq,
            partition=self.partition,
            partitions=self.partitions,
            covered_seq=pos.covered,
            checkpoint=CHECKPOINT_FORMAT,
            catalog_seq=self._cut.catalog_seq,
            catalog_digest=self._cut.catalog_digest,
            start=self.start_note,
            next_due_ts=self._cut.next_due,
        )
        subject = status_subject(self.partition)
        data = encode(status)
        async with self._writer.fenced() as fence:
            self._writer.written.pop(subject)  # always written: it carries last_tick
            seq = await self._writer.publish(subject, data, fence)
        if seq is not None:
            self._last_status = (seq, subject, data)
            self.status_writes += 1

    def _freeze_gc(self) -> None:
        """Take the objects alive now out of the cyclic GC's sight (`gc.freeze`).

        The fold state of 50k hosts is millions of objects that never form
        garbage cycles; every full collection scanned them all, a 130-270 ms
        pause (measured) that showed up as report→view p99 latency.  Called
        once the initial load is folded and again each time the host count
        grew by a tenth, past 1000 (new hosts bring new long-lived records); a young
        collection first, so little short-lived garbage is frozen with them.
        """
        gc.collect(1)
        gc.freeze()
        self._frozen_hosts = len(self.state.hosts)

    async def _take_lease(self, stop: asyncio.Event) -> bool:
        """Standby until the lease is ours, then write what differs from CRR_SNAPSHOT now."""
        assert self._lease is not None
        self._lease.on_lost = self._wake.set
        log.info("projector %s: standby for %s", self.projector_id, self._lease.subject)
        if not await self._lease.acquire(stop):
            return False
        # The previous writer may have written anything: reload, then rewrite the differences.
        # (Taking over often happens while the cluster elects a new stream leader: retry.)
        async for attempt in TAKEOVER_READ.retrying(
                seconds=60, log=log, what=f"projector {self.projector_id}: cannot read "
                                          f"{SNAPSHOT_STREAM} after taking the lease"):
            with attempt, nats_errors():
                self._writer.written.clear()
                await self._load_written()
        if self._lazy is not None:
            self._place_lazy(functools.partial(self._lazy.everything, self.state))
        self._dirty.hosts.update(host_names(self.state))
        self._dirty.cluster = self._dirty.catalog = True
        self._wake.set()
        return True

    # -- following CRR_EVENTS, and starting over when it went backwards ---------

    async def _check_layout(self) -> None:
        """Refuse to run with another number of partitions than CRR_EVENTS stores with.

        (An unpartitioned projector beside partitioned ones would write the same
        host records twice; a partition of the wrong N would fold the wrong hosts.)"""
        stored = stored_partitions((await self._js.stream_info(EVENTS_STREAM)).config)
        mine = self.partitions or 1
        if stored != mine:
            raise StreamConfigError(
                f"{EVENTS_STREAM} is stored for {stored} projector partition(s), this projector "
                f"for {mine}: run every projector with the stream's layout "
                + ("(no --partitions)" if stored == 1 else
                   f"(--partitions {stored} --partition K, 0 <= K < {stored})")
                + f", or change the layout with --partitions {mine} --update")

    async def _follow_events(self, *, restore: bool) -> None:
        """Load what CRR_SNAPSHOT holds; restore from it (`restore`) and fold CRR_EVENTS
        from right after its position, or else fold CRR_EVENTS on a new consumer from the
        last event per subject; returns when that initial load is folded."""
        if self._events is not None:
            await self._events.stop()
        with _gc_paused():
            await self._load(restore=restore)

    async def _load(self, *, restore: bool) -> None:
        """`_follow_events` with the cyclic GC paused."""
        raw = await self._load_written()
        why = ("restoring is switched off" if not self._restore else
               self._resync_why or "CRR_SNAPSHOT was found behind CRR_EVENTS or lost messages")
        self._resync_why = ""
        if restore:
            info = (await self._js.stream_info(EVENTS_STREAM)).state
            try:
                restored = await restore_from(
                    self._js, raw, partition=self.partition, partitions=self.partitions,
                    events_first=info.first_seq, events_last=info.last_seq)
            except NotRestorable as exc:
                why = str(exc)
            else:
                del raw
                await self._resume(restored)
                return
        del raw
        self.restored = False
        self.start_note = f"rebuilt from {EVENTS_STREAM}: {why}"
        log.log(logging.INFO if "first start" in why else logging.WARNING,
                "projector: rebuilding from the last event per subject of %s: %s",
                EVENTS_STREAM, why)
        # Where the last-per-subject load starts (`--verify` replays the same input).
        self._start_seq = (await self._js.stream_info(EVENTS_STREAM)).state.last_seq
        self._events = OrderedReader(self._nc, stream=EVENTS_STREAM, subject=EVERYTHING,
                                     handler=self._handler(), backpressure=True, direct=True)
        await self._events.start()
        await self._events.wait_ready(300.0)
        if self.partition is not None:
            # Loaded from every subject (any layout); live, only this partition's, from
            # right after the last event the load delivered (read once it has stopped).
            loaded, self._events = self._events, None
            await loaded.stop()
            self._events = OrderedReader(self._nc, stream=EVENTS_STREAM, subject=EVERYTHING,
                                         handler=self._handler(), start_seq=loaded.last_seq + 1,
                                         filter_subjects=partition_filters(self.partition),
                                         backpressure=True, direct=True)
            await self._events.start()

    async def _resume(self, restored: Restored) -> None:
        """Take the restored state and fold CRR_EVENTS from right after its position."""
        st = restored.status
        seq = st.last_seq
        self.state = restored.state
        self._deferred = restored.deferred if len(restored.deferred) else None
        self._lazy = restored.lazy if len(restored.lazy) else None
        # Its input is the one the status describes: `--verify` replays the same.
        self._start_seq = st.start_seq
        self.applied, self.deadletter_count = st.applied, st.deadletters
        self._cut = _Cut(applied=st.applied, deadletters=st.deadletters,
                         catalog_seq=st.catalog_seq, catalog_digest=st.catalog_digest,
                         next_due=self._next_deadline())
        await self._pos.restart_at(seq, covered=st.covered_seq, stream_last=st.stream_last_seq)
        self.restored = True
        self.start_note = (f"restored from {SNAPSHOT_STREAM} at seq {seq} ({restored.records} "
                           f"record(s), {len(restored.deferred)} written after the status)")
        log.info("projector: %s", self.start_note)
        self._events = OrderedReader(self._nc, stream=EVENTS_STREAM, subject=EVERYTHING,
                                     handler=self._handler(), start_seq=seq + 1,
                                     filter_subjects=partition_filters(self.partition),
                                     backpressure=True, direct=True)
        await self._events.start()
        await self._events.wait_ready(300.0)
        if self._deferred is not None:
            self._place_deferred(None)

    def _handler(self) -> Callable[[StoredMessage], Awaitable[None] | None]:
        """`_on_event` for a new consumer; a replaced consumer's stray deliveries are dropped."""
        return self._generations.guard(self._on_event)

    def _on_reconnect(self) -> None:
        if self._check is None or self._check.done():
            self._check = asyncio.get_running_loop().create_task(self._check_streams())

    async def _check_streams(self) -> None:
        """After a reconnect: does each stream still hold what this projector last saw?
        (The check `bus.follower.Follower` runs too; the rebuild itself is the run loop's,
        between flushes.)"""
        event = self._last_event
        gone = await lost(self._nc, {
            EVENTS_STREAM: None if event is None else (event.seq, event.subject, event.data),
            SNAPSHOT_STREAM: self._last_status}, who="projector", log=log)
        if gone:
            self._resync_why = (f"the server lost acknowledged messages ({', '.join(gone)} "
                                "no longer stored)")
            self._resync = True
            self._wake.set()

    async def _rebuild(self) -> None:
        """Start over after a stream went backwards: fold CRR_EVENTS from the last event per
        subject again, and rewrite every record CRR_SNAPSHOT no longer holds as folded."""
        self.rebuilds += 1
        if self._gc_freeze:
            gc.unfreeze()  # the old state is garbage now
        self.state = ProjectionState()
        self._dirty = _Dirty()
        self._deadletters = []
        self._writer.trace_parents.clear()
        self._last_event = None
        self._last_status = None
        await self._pos.restart_at(0)  # sequences were re-used: the old position means nothing
        self._writer.written.clear()
        self._deferred = self._lazy = None
        self._cut = _Cut()
        await self._follow_events(restore=False)
        self._dirty.hosts.update(host_names(self.state))
        self._dirty.cluster = self._dirty.catalog = True
        self._resync = False
        if self._gc_freeze:
            gc.collect()
            self._freeze_gc()
        log.info("projector rebuilt at seq %d (%d hosts)", self._pos.applied,
                 len(self.state.hosts))

    # -- main loop --------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Project until `stop` is set (or the task is cancelled)."""
        stop = stop or asyncio.Event()

        async def relay_stop() -> None:
            await stop.wait()
            self._wake.set()

        relay = asyncio.create_task(relay_stop())
        remove_listener = add_reconnect_listener(self._nc, self._on_reconnect)
        graceful = False
        refiner: asyncio.Task[None] | None = None
        try:
            await provision(self._nc, self._settings)
            await self._check_layout()
            await self._hear_peers()
            await self._follow_events(restore=self._restore)
            self.warm.set()
            if self._lease is not None and not await self._take_lease(stop):
                graceful = True
                return
            # Initial load done: bring expiry up to now, then write the differences only.
            self._expire(tick())
            try:
                with nats_errors():
                    await self._flush()
            except LeaseLostError:
                pass  # deposed already: back to standby in the loop
            except (BusError, CrrTimeoutError) as exc:
                # (A cluster electing a leader, a refused write): the loop retries it.
                log.warning("initial snapshot write failed (%r); retrying", exc)
            if self._gc_freeze:
                gc.collect()
                self._freeze_gc()
            self.ready.set()
            log.info("projector ready at seq %d (%d hosts)", self._pos.written,
                     self.host_count)
            refiner = asyncio.create_task(self._refine_lazy())
            next_status = 0.0
            last_status = 0.0
            owed = False  # records flushed that no status covers yet
            failures = 0
            while not stop.is_set():
                if self._lease is not None and not self._lease.held:
                    if not await self._take_lease(stop):
                        break
                    next_status = 0.0
                now = time.time()
                deadline = self._next_deadline()
                wait = next_status - now
                if deadline is not None:
                    wait = min(wait, deadline - now)
                if owed:
                    wait = min(wait, last_status + STATUS_GAP - now)
                if not self._dirty and not self._status_due and wait > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), wait)
                self._wake.clear()
                try:
                    if self._resync:
                        with nats_errors():
                            await self._rebuild()
                        next_status = 0.0
                    await self._fold_backlog()
                    now = tick()
                    self._expire(now)
                    wrote = self._unwritten()
                    if wrote:
                        with nats_errors():
                            await self._flush()
                        owed = True
                    # A status right behind the records it covers (stream order), so readers
                    # of CRR_SNAPSHOT learn the position: after the flush that caught up,
                    # and while behind about every STATUS_GAP (the next flush, not the
                    # status's round trip, goes first).
                    if ((owed and (now - last_status >= STATUS_GAP or self._caught_up()))
                            or now >= next_status or self._status_due):
                        self._status_due = False
                        with nats_errors():
                            await self._write_status(now)
                        owed = False
                        last_status = now
                        next_status = now + self._status_interval
                    failures = 0
                    if self._trim_due and not self._pos.pending and not self.buffered:
                        # Caught up after being behind: what the backlog's handling freed
                        # (the allocator keeps it otherwise) goes back to the OS.
                        self._trim_due = False
                        self.trims += heap.trim()
                    if self._gc_freeze and len(self.state.hosts) > max(
                            1000, self._frozen_hosts * 1.1):
                        self._freeze_gc()
                except LeaseLostError:
                    continue  # deposed: back to standby at the top of the loop
                except (BusError, CrrTimeoutError) as exc:
                    # A service keeps running: even a refusal (the store full) is retried,
                    # said at ERROR when the error says retrying alone will not help.
                    failures += 1
                    if failures == 1 or failures % 50 == 0:
                        # Status writes fail too when the store is full: say so, not only
                        # when a record write fails (which _flush logs).
                        log.log(logging.WARNING if exc.retriable else logging.ERROR,
                                "snapshot write failed (%r); retrying (failure %d)",
                                exc, failures)
                    await asyncio.sleep(SNAPSHOT_WRITE.delay(failures))
            graceful = True
        finally:
            relay.cancel()
            if refiner is not None:
                refiner.cancel()
            remove_listener()
            if self._peers is not None:
                with contextlib.suppress(BusError), nats_errors():
                    await self._peers.unsubscribe()
                self._peers = None
            if self._check is not None:
                self._check.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._check
            if self._lease is not None:
                # A clean stop hands the lease over at once; a crash lets it expire.
                await (self._lease.release() if graceful else self._lease.close())
            if self._events is not None:
                await self._events.stop()
            await self._writer.close()


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic GC while the initial load builds the fold state.

    Millions of long-lived objects are allocated at once; each full collection
    would scan all of them again (in a restore of 20k hosts, most of the time
    went there).  Nothing of what is built forms garbage cycles worth
    collecting meanwhile; collection resumes (and catches up) afterwards.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def partition_filters(partition: int | None) -> list[str] | None:
    """CRR_EVENTS filters of a partitioned projector (None: everything, `crr.v1.>`).

    With `StreamSettings(partitions=N)` the stream stores host events as
    `crr.v1.<kind>.host.<host>.<reporter>.<p>`, `p = partition(N, host)`.
    Every partition needs the catalog; the cluster subjects go to partition 0.
    """
    if partition is None:
        return None
    filters = [CATALOG, partition_event_filter(partition)]
    if partition == 0:
        filters.append(cluster_event_filter())
    return filters
