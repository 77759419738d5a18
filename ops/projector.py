"""The projector service: CRR_EVENTS → pure fold → CRR_SNAPSHOT.

IO lives here; the fold (`projections.fold`) is pure.  One ordered consumer
on CRR_EVENTS starts with `DeliverLastPerSubject` (a restart rebuilds from
the last event per subject — no checkpoint file) and stays on for live
events.  Nothing is written until that initial load is complete; then only
records whose canonical bytes differ from what CRR_SNAPSHOT already holds
are written, so a restart publishes nothing spurious.  Stale transitions are
driven by a deadline (the fold's `next_deadline`), not a coarse poll.

Position: after each flush the projector writes its status (`last_seq`,
`covered_seq`), so by stream order a reader that has read the status has
read every record it covers.  A partition (`partition=k` of N) consumes
only its own subjects, so its `last_seq` is the last of *its* events; its
`covered_seq` extends that over the other partitions' events: with no
events of its own pending, it reads the stream's last sequence L, then asks
the server for the first event of its subjects after what it has written
(`next_by_subj`); if that is N, every event of its subjects up to
min(L, N - 1) is written.  Readers take the minimum over the partitions
(`projections.coverage`).

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
import gc
import hashlib
import itertools
import logging
import math
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from bus import tracing
from bus.connection import add_reconnect_listener
from bus.ordered import OrderedReader, StoredMessage
from bus.pipeline_publish import PipelinePublisher
from bus.stream_check import still_holds
from bus.streams import StreamSettings, owns, provision, stored_partitions
from bus.subjects import (
    CATALOG,
    DEADLETTER,
    EVENTS_STREAM,
    SNAPSHOT_CATALOG,
    SNAPSHOT_CLUSTER,
    SNAPSHOT_PROJECTOR,
    SNAPSHOT_STREAM,
    host_snapshot_subject,
    published_subject,
)
from ops.lease import Lease, is_fence_refusal
from ops.metrics import ProjectorMetrics
from projections.envelope import Envelope
from projections.fold import Changes, apply, expire, next_deadline
from projections.state import ProjectionState, cluster_snapshot, host_names, host_snapshot
from schemas.codec import DECODERS, encode
from schemas.errors import CrrError, CrrTimeoutError, LeaseLostError, StreamConfigError
from schemas.events import DeadLetter
from schemas.snapshot import ProjectorStatus
from schemas.timestamps import format_time, parse_time

log = logging.getLogger("crr.projector")

_status_decoder: msgspec.json.Decoder[ProjectorStatus] = DECODERS[ProjectorStatus]

WRITE_WINDOW = 512
HOLD_LIMIT = 32_768
"""Events held during a flush before the reader is made to wait (see `_on_event`).

Waiting stalls the server's delivery until the flush ends, which costs throughput
(with 4096: 13-14k events/s instead of 15-21k at the maximum rate, 50k hosts, one
noisy 2-core box); holding costs ~1.3 KB per event."""


def tick() -> float:
    """The wall clock floored to the millisecond, as `last_tick` carries it on the wire.

    The projector expires with this `now` and writes it as the status's
    `last_tick`, so `crr replay --verify` can expire at exactly the same `now`.
    """
    return parse_time(format_time(math.floor(time.time() * 1000) / 1000))


class WrittenRecords:
    """What CRR_SNAPSHOT holds, as far as this projector knows: a digest per subject.

    (SHA-1: fast, and collisions among records the projector encodes itself
    are not a concern.)

    Lets the projector skip writing a record whose canonical bytes did not
    change (a restart rewrites nothing).  The bytes themselves are kept only
    when `keep_bytes` (the metrics census decodes them).
    """

    def __init__(self, *, keep_bytes: bool = False) -> None:
        self._digests: dict[str, bytes] = {}
        self._bytes: dict[str, bytes] | None = {} if keep_bytes else None

    @staticmethod
    def digest(data: bytes) -> bytes:
        """The digest `same`/`set` compare (compute it once per record written)."""
        return hashlib.sha1(data, usedforsecurity=False).digest()  # ~2x blake2b's speed

    def same(self, subject: str, data: bytes, digest: bytes | None = None) -> bool:
        """Whether `data` (whose `digest` may be given) is what `subject` already holds."""
        d = self._digests.get(subject)
        return d is not None and d == (digest or self.digest(data))

    def set(self, subject: str, data: bytes, digest: bytes | None = None) -> None:
        """Record that `subject` now holds `data` (whose `digest` may be given)."""
        self._digests[subject] = digest or self.digest(data)
        if self._bytes is not None:
            self._bytes[subject] = data

    def pop(self, subject: str) -> None:
        """Forget `subject` (its next write always goes out)."""
        self._digests.pop(subject, None)
        if self._bytes is not None:
            self._bytes.pop(subject, None)

    def clear(self) -> None:
        """Forget everything (after losing and retaking the lease)."""
        self._digests.clear()
        if self._bytes is not None:
            self._bytes.clear()

    @property
    def keeps_bytes(self) -> bool:
        """Whether the bytes are kept (else only digests)."""
        return self._bytes is not None

    def items(self) -> list[tuple[str, bytes]]:
        """(subject, bytes) pairs, when bytes are kept; else empty."""
        return list(self._bytes.items()) if self._bytes is not None else []

    def __len__(self) -> int:
        return len(self._digests)


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
    ) -> None:
        """`lease`: HA mode (ops/lease.py) — write only while holding it, else follow as a
        warm standby.  `partition`: fold only the hosts of that partition (see
        `partition_filters`); partition 0 also owns the catalog and cluster records.
        `gc_freeze`: a process-wide choice for the process that runs the projector
        (`crr projector`): see `_freeze_gc`."""
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
        self._applied_seq = 0
        self._handled_seq = 0
        """Last event folded or (not this partition's) dropped."""
        self._flushed_through = 0
        """`_handled_seq` when the last completed flush began: every event of this
        projector's up to it is written."""
        self._written_seq = 0
        self._stream_pending = 0
        self._start_seq = 0
        self._covered_seq = 0
        """See `_coverage` (a partition's position over the whole stream)."""
        self._stream_last_seq = 0
        self._last_event: StoredMessage | None = None
        """The last event folded (what CRR_EVENTS must still hold at its seq)."""
        self._last_status: tuple[int, str, bytes] | None = None
        """(seq, subject, data) of the last status written (what CRR_SNAPSHOT must hold)."""
        self._generation = 0
        """Bumped for each CRR_EVENTS consumer: events of a replaced one are ignored."""
        self._owns = None if partition is None else owns(partition, self.partitions or 1)
        """Partitioned: whether an event is this partition's to fold (the live consumer's
        filters only deliver its own subjects; the initial load reads every subject)."""
        self._resync = False
        """Set when a stream went backwards: rebuild before the next flush."""
        self._check: asyncio.Task[None] | None = None
        self._status_due = False
        """Write the status now: another partition's status moved past this one's."""
        self._peers: Subscription | None = None
        self.rebuilds = 0
        """Rebuilds after a stream went backwards (see the module doc)."""
        self._position_changed = asyncio.Condition()
        self._events: OrderedReader | None = None
        self._started_at = time.time()
        self.applied = 0
        self.deadletter_count = 0
        self.held = 0
        """Events that arrived while a flush was encoding (folded right after it)."""
        self.writes = 0
        self.ready = asyncio.Event()
        self._pipe: PipelinePublisher | None = None
        self._flushed = asyncio.Event()
        """Set when no flush is encoding (`_on_event` waits on it when many are held)."""
        self._flushed.set()
        self._held: list[tuple[StoredMessage, tracing.SpanContext | None]] | None = None
        """Events that arrived while a flush was encoding, folded when it ends."""
        self._trace_parents: dict[str, tracing.SpanContext] = {}
        """Snapshot subject -> the sampled apply span its next write continues."""
        self.metrics = ProjectorMetrics(self)
        # Only the metrics census reads the written bytes back; otherwise a digest per
        # record is enough to skip unchanged writes (≈20 B instead of ≈4.5 KB per host).
        self._written = WrittenRecords(keep_bytes=self.metrics.enabled)

    @property
    def lag(self) -> int:
        """CRR_EVENTS messages not yet delivered (as of the last event applied)."""
        return self._stream_pending

    def written_records(self) -> list[tuple[str, bytes]]:
        """What CRR_SNAPSHOT holds as this projector wrote or loaded it: (subject, bytes).

        Empty unless metrics are enabled (see `WrittenRecords`)."""
        return self._written.items()

    # -- position ---------------------------------------------------------

    @property
    def position(self) -> int:
        """Last CRR_EVENTS sequence whose effects are written to CRR_SNAPSHOT."""
        return self._written_seq

    async def wait_until(self, seq: int, timeout: float = 10.0) -> None:
        """Wait until every event up to `seq` is reflected in CRR_SNAPSHOT."""
        async def reached() -> None:
            async with self._position_changed:
                await self._position_changed.wait_for(lambda: self._written_seq >= seq)

        try:
            await asyncio.wait_for(reached(), timeout)
        except TimeoutError:
            raise CrrTimeoutError(
                f"projector at {self._written_seq}, not {seq}, after {timeout:g}s"
            ) from None

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
            return self._until_flushed()
        return None

    async def _until_flushed(self) -> None:
        await self._flushed.wait()

    def _fold(self, m: StoredMessage, parent: tracing.SpanContext | None) -> None:
        subject = m.subject
        self._handled_seq = m.seq
        if self._owns is not None and not self._owns(subject):
            self._stream_pending = m.pending  # caught up counts past others' events too
            return
        if subject.count(".") == 6:  # stored with a partition token (this layout's or not)
            subject = published_subject(subject)
        env = Envelope(seq=m.seq, subject=subject, received_at=m.time, data=m.data)
        ch = apply(self.state, env)
        self.applied += 1
        self._applied_seq = m.seq
        self._stream_pending = m.pending
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
                self._trace_parents[host_snapshot_subject(h)] = parent
            if ch.cluster:
                self._trace_parents[SNAPSHOT_CLUSTER] = parent
        self.metrics.event(m)
        self._wake.set()

    # -- output -----------------------------------------------------------

    async def _load_written(self) -> None:
        """Read what CRR_SNAPSHOT holds now, so unchanged records are not rewritten."""
        def keep(m: StoredMessage) -> None:
            self._written.set(m.subject, m.data)

        reader = OrderedReader(self._nc, stream=SNAPSHOT_STREAM, subject="crr.v1.snapshot.>",
                               handler=keep)
        await reader.start()
        try:
            await reader.wait_ready(60.0)
        finally:
            await reader.stop()

    async def _publish(self, subject: str, data: bytes,
                       headers: dict[str, str] | None = None) -> int | None:
        """Write one record unless CRR_SNAPSHOT holds it already; its seq (None: skipped)."""
        parent = self._trace_parents.pop(subject, None) if self._trace_parents else None
        if self._written.same(subject, data):
            return None
        span = None
        if parent is not None:  # continue the report's trace (W3C context in the headers)
            headers = dict(headers or {})
            span = tracing.start_publish(subject, headers, parent=parent, size=len(data))
            headers = headers or None
        try:
            ack = await self._js.publish(subject, data, headers=headers)
            tracing.end_publish(span, seq=ack.seq)
        except BaseException as exc:
            tracing.end_publish(span, error=exc)
            if not isinstance(exc, nats.js.errors.APIError):
                raise
            if headers is not None and self._lease is not None and is_fence_refusal(exc):
                self._lease.lost()
                raise LeaseLostError(f"write to {subject} refused: lease lost") from exc
            raise
        self._written.set(subject, data)
        self.writes += 1
        return int(ack.seq)

    async def _publish_pipelined(self, records: Iterable[tuple[str, bytes]],
                                 slow: list[tuple[str, bytes]]) -> None:
        """Write the changed records pipelined (one wildcard ack inbox, no task per
        record) and wait for every ack; raises like `_publish` when one fails.

        `records` is consumed lazily: a record is encoded only when there is
        room in the pipeline, so a flush of every host holds ~`2 * WRITE_WINDOW`
        encoded records at once, not all of them (50k x 4.5 KB).  Records that
        continue a sampled trace are set aside in `slow` for `_publish`.
        """
        if self._pipe is None:
            self._pipe = PipelinePublisher(self._nc, max_in_flight=2 * WRITE_WINDOW,
                                           ack_timeout=3.0, max_attempts=5)
            await self._pipe.start()
        pipe = self._pipe
        rejected, failed = pipe.stats.rejected, pipe.stats.failed
        written = self._written
        keep = written.keeps_bytes
        sent: list[tuple[str, bytes, bytes | None]] = []
        for s, d in records:
            if s in self._trace_parents:
                slow.append((s, d))
                continue
            digest = written.digest(d)
            if written.same(s, d, digest):
                continue
            await pipe.publish(s, d)
            sent.append((s, digest, d if keep else None))
        if not sent:
            return
        await pipe.flush(60.0)
        if pipe.stats.rejected != rejected or pipe.stats.failed != failed:
            raise nats.errors.Error(f"pipelined publish failed: {pipe.stats.last_error}")
        for subject, digest, data in sent:
            written.set(subject, data or b"", digest)
        self.writes += len(sent)

    def _writing(self) -> contextlib.AbstractAsyncContextManager[dict[str, str] | None]:
        """Fenced-write headers while holding the lease (HA), else no headers."""
        if self._lease is None:
            return contextlib.nullcontext(None)
        return self._lease.writing()

    async def _flush(self) -> None:
        seq, through = self._applied_seq, self._handled_seq
        dirty, self._dirty = self._dirty, _Dirty()
        state = self.state
        owns_shared = self.partition in (None, 0)

        def records() -> Iterator[tuple[str, bytes]]:
            # Encoded one at a time as they are written (see `_publish_pipelined`), so
            # events arriving meanwhile are held, not folded, until the flush ends: every
            # record written then reflects exactly (`seq`, the last expiry `now`), the cut
            # the status written after it claims (`crr replay --verify` relies on it).
            if dirty.catalog and state.catalog is not None and owns_shared:
                yield SNAPSHOT_CATALOG, encode(state.catalog)
            if dirty.cluster and owns_shared:
                yield SNAPSHOT_CLUSTER, encode(cluster_snapshot(state))
            for h in sorted(dirty.hosts):
                # A host no longer in the state was forgotten (`crr hosts forget`): an empty
                # record is its delete marker (readers drop the host; compaction keeps only it).
                yield host_snapshot_subject(h), (encode(host_snapshot(state, h))
                                                 if h in state.hosts else b"")
            self._release_held()  # all encoded: fold on while the acks come back

        letters, self._deadletters = self._deadletters, []
        assert self._held is None, "flushes do not overlap"
        self._held = []
        self._flushed.clear()
        try:
            out: Iterator[tuple[str, bytes]] = records()
            if self._lease is None:  # the hot path: no fence, no trace
                slow: list[tuple[str, bytes]] = []  # records continuing a sampled trace
                await self._publish_pipelined(out, slow)
                out = iter(slow)
            while window := list(itertools.islice(out, WRITE_WINDOW)):
                async with self._writing() as fence:
                    await asyncio.gather(*(self._publish(s, d, fence) for s, d in window))
            for dl in letters:
                await self._js.publish(DEADLETTER, encode(dl),
                                       headers={"Nats-Msg-Id": f"deadletter/{dl.seq}"})
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError, LeaseLostError) as exc:
            # Put everything back; the next round retries (the fold state is intact).
            log.warning("snapshot write failed (%s); will retry", exc)
            self._dirty.merge(Changes(hosts=frozenset(dirty.hosts), cluster=dirty.cluster,
                                      catalog=dirty.catalog, deadletter=None))
            self._deadletters[:0] = letters
            raise
        finally:
            self._release_held()
        self.metrics.flushed(time.time())
        async with self._position_changed:
            self._written_seq = max(self._written_seq, seq)
            self._flushed_through = max(self._flushed_through, through)
            self._position_changed.notify_all()

    def _release_held(self) -> None:
        """Fold the events held while a flush was encoding; stop holding."""
        held, self._held = self._held, None
        for m, parent in held or ():
            self._fold(m, parent)
        self._flushed.set()

    async def _coverage(self) -> None:
        """Bring `_covered_seq` and `_stream_last_seq` up to date (see the module doc).

        Unpartitioned, the consumer sees every event: covered = written.  A
        partition with events of its own pending is covered up to what it has
        written; with none pending it asks the server (one stream info and one
        `next_by_subj` lookup per filter, concurrently).
        """
        # Every event of this projector's up to `through` is written: those a partition's
        # initial load dropped (other partitions' hosts, old layouts) need no writing.
        through = max(self._written_seq, self._flushed_through)
        known_last = self._applied_seq + self._stream_pending
        if self.partition is None or self._stream_pending:
            self._covered_seq = max(self._covered_seq, through)
            self._stream_last_seq = max(self._stream_last_seq, known_last)
            return
        last = (await self._js.stream_info(EVENTS_STREAM)).state.last_seq  # read first
        # After `through`, only the live consumer's subjects (this layout's) can be ours.
        nexts = await asyncio.gather(*(self._next_of(f, through + 1)
                                       for f in partition_filters(self.partition) or []))
        first_unwritten = min((n for n in nexts if n is not None), default=last + 1)
        self._covered_seq = max(self._covered_seq, through, min(last, first_unwritten - 1))
        self._stream_last_seq = max(self._stream_last_seq, last, known_last)

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
        own = f"{SNAPSHOT_PROJECTOR}.{self.partition}"

        async def on_status(msg: Msg) -> None:
            if msg.subject == own or self._stream_pending:
                return
            try:
                peer = _status_decoder.decode(msg.data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                return  # not ours to judge; readers log undecodable records
            if peer.partitions == self.partitions and peer.covered_seq > self._covered_seq:
                self._status_due = True
                self._wake.set()

        self._peers = await self._nc.subscribe(f"{SNAPSHOT_PROJECTOR}.*", cb=on_status)

    async def _next_of(self, subject: str, seq: int) -> int | None:
        """The first CRR_EVENTS sequence >= `seq` on `subject` (a filter), None: none yet."""
        try:
            m = await self._js.get_msg(EVENTS_STREAM, seq=seq, subject=subject, next=True)
        except nats.js.errors.NotFoundError:
            return None
        return int(m.seq or 0) or None

    async def _write_status(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        await self._coverage()
        status = ProjectorStatus(
            last_seq=self._written_seq,
            stream_last_seq=self._stream_last_seq,
            lag=self._stream_pending,
            last_tick=format_time(now),
            started_at=format_time(self._started_at),
            applied=self.applied,
            deadletters=self.deadletter_count,
            hosts=len(self.state.hosts),
            projector_id=self.projector_id,
            start_seq=self._start_seq,
            partition=self.partition,
            partitions=self.partitions,
            covered_seq=self._covered_seq,
        )
        subject = SNAPSHOT_PROJECTOR
        if self.partition is not None:
            subject = f"{SNAPSHOT_PROJECTOR}.{self.partition}"
        data = encode(status)
        async with self._writing() as fence:
            self._written.pop(subject)  # always written: it carries last_tick
            seq = await self._publish(subject, data, fence)
        if seq is not None:
            self._last_status = (seq, subject, data)

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
        self._written.clear()
        await self._load_written()
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

    async def _follow_events(self) -> None:
        """Load what CRR_SNAPSHOT holds, then fold CRR_EVENTS on a new consumer from the
        last event per subject; returns when that initial load is folded."""
        if self._events is not None:
            await self._events.stop()
        await self._load_written()
        # Where the last-per-subject load starts (`--verify` replays the same input).
        self._start_seq = (await self._js.stream_info(EVENTS_STREAM)).state.last_seq
        self._events = OrderedReader(self._nc, stream=EVENTS_STREAM, subject="crr.v1.>",
                                     handler=self._handler(), backpressure=True)
        await self._events.start()
        await self._events.wait_ready(300.0)
        if self.partition is not None:
            # Loaded from every subject (any layout); live, only this partition's, from
            # right after the last event the load delivered (read once it has stopped).
            loaded, self._events = self._events, None
            await loaded.stop()
            self._events = OrderedReader(self._nc, stream=EVENTS_STREAM, subject="crr.v1.>",
                                         handler=self._handler(), start_seq=loaded.last_seq + 1,
                                         filter_subjects=partition_filters(self.partition),
                                         backpressure=True)
            await self._events.start()

    def _handler(self) -> Callable[[StoredMessage], Awaitable[None] | None]:
        """`_on_event` for a new consumer; a replaced consumer's stray deliveries are dropped."""
        self._generation += 1
        generation = self._generation

        def handler(m: StoredMessage) -> Awaitable[None] | None:
            return self._on_event(m) if generation == self._generation else None

        return handler

    def _on_reconnect(self) -> None:
        if self._check is None or self._check.done():
            self._check = asyncio.get_running_loop().create_task(self._check_streams())

    async def _check_streams(self) -> None:
        """After a reconnect: does each stream still hold what this projector last saw?"""
        event, status = self._last_event, self._last_status
        lost: list[str] = []
        try:
            if event is not None and not await still_holds(
                    self._nc, EVENTS_STREAM, event.seq, event.subject, event.data):
                lost.append(f"{EVENTS_STREAM} seq {event.seq}")
            if status is not None and not await still_holds(self._nc, SNAPSHOT_STREAM, *status):
                lost.append(f"{SNAPSHOT_STREAM} seq {status[0]}")
        except (nats.errors.Error, TimeoutError) as exc:
            log.warning("projector: cannot check the streams after a reconnect: %r", exc)
            return
        if lost:
            log.warning("projector: the server lost acknowledged messages (%s no longer "
                        "stored); rebuilding from %s", ", ".join(lost), EVENTS_STREAM)
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
        self._trace_parents.clear()
        self._applied_seq = self._stream_pending = 0
        self._handled_seq = self._flushed_through = 0
        self._covered_seq = self._stream_last_seq = 0
        self._last_event = None
        self._last_status = None
        async with self._position_changed:
            self._written_seq = 0  # sequences were re-used: the old position means nothing
        self._written.clear()
        await self._follow_events()
        self._dirty.hosts.update(host_names(self.state))
        self._dirty.cluster = self._dirty.catalog = True
        self._resync = False
        if self._gc_freeze:
            gc.collect()
            self._freeze_gc()
        log.info("projector rebuilt at seq %d (%d hosts)", self._applied_seq,
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
        try:
            await provision(self._nc, self._settings)
            await self._check_layout()
            await self._hear_peers()
            await self._follow_events()
            self.warm.set()
            if self._lease is not None and not await self._take_lease(stop):
                graceful = True
                return
            # Initial load done: bring expiry up to now, then write the differences only.
            self._dirty.merge(expire(self.state, tick()))
            await self._flush()
            if self._gc_freeze:
                gc.collect()
                self._freeze_gc()
            self.ready.set()
            log.info("projector ready at seq %d (%d hosts)", self._written_seq,
                     len(self.state.hosts))
            next_status = 0.0
            failures = 0
            while not stop.is_set():
                if self._lease is not None and not self._lease.held:
                    if not await self._take_lease(stop):
                        break
                    next_status = 0.0
                now = time.time()
                deadline = next_deadline(self.state)
                wait = next_status - now
                if deadline is not None:
                    wait = min(wait, deadline - now)
                if not self._dirty and not self._status_due and wait > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), wait)
                self._wake.clear()
                try:
                    if self._resync:
                        await self._rebuild()
                        next_status = 0.0
                    now = tick()
                    self._dirty.merge(expire(self.state, now))
                    # Events that changed nothing (a dead letter's own copy, a duplicate)
                    # still move the position, so wait_until() on them returns.
                    wrote = bool(self._dirty or self._deadletters
                                 or self._applied_seq > self._written_seq)
                    if wrote:
                        await self._flush()
                    # Status after every flush, so readers of CRR_SNAPSHOT learn the
                    # position right behind the records it covers (stream order).
                    if wrote or now >= next_status or self._status_due:
                        self._status_due = False
                        await self._write_status(now)
                        next_status = now + self._status_interval
                    failures = 0
                    if self._gc_freeze and len(self.state.hosts) > max(
                            1000, self._frozen_hosts * 1.1):
                        self._freeze_gc()
                except LeaseLostError:
                    continue  # deposed: back to standby at the top of the loop
                except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
                    failures += 1
                    if failures == 1 or failures % 50 == 0:
                        # Status writes fail too when the store is full: say so, not only
                        # when a record write fails (which _flush logs).
                        log.warning("snapshot write failed (%r); retrying (failure %d)",
                                    exc, failures)
                    await asyncio.sleep(min(2.0, 0.05 * 2 ** min(failures, 6)))
            graceful = True
        finally:
            relay.cancel()
            remove_listener()
            if self._peers is not None:
                with contextlib.suppress(nats.errors.Error):
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
            if self._pipe is not None:
                await self._pipe.close(1.0)
                self._pipe = None


def partition_filters(partition: int | None) -> list[str] | None:
    """CRR_EVENTS filters of a partitioned projector (None: everything, `crr.v1.>`).

    With `StreamSettings(partitions=N)` the stream stores host events as
    `crr.v1.<kind>.host.<host>.<reporter>.<p>`, `p = partition(N, host)`.
    Every partition needs the catalog; the cluster subjects go to partition 0.
    """
    if partition is None:
        return None
    filters = [CATALOG, f"crr.v1.*.host.*.*.{partition}"]
    if partition == 0:
        filters.append("crr.v1.*.cluster.*")
    return filters
