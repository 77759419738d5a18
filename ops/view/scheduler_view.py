"""The scheduler view: a live, cached copy of CRR_SNAPSHOT that answers `select[]`.

A scheduler embeds one `SchedulerView` per process::

    async with connect(url, name="scheduler") as nc:
        view = SchedulerView(nc)
        await view.start()
        await view.wait_ready()                 # initial load complete
        hosts = view.select('scratch_free > 100 && datasets has "c4"')
        print(view.explain("scratch_free > 100", "node7").render())

One `crr.bus.follower.Follower` on `crr.v1.snapshot.>` loads the compacted
snapshot (last per subject) and then stays on for live changes: host
records go into a columnar `HostTable` as lean rows (see below), the
catalog record (`crr.v1.snapshot.catalog`) re-shapes the table, the
cluster record feeds cluster-scope values, and the projector status
records give `projector_position` (the CRR_EVENTS sequence the snapshot
covers).  There is one status record per projector:
`crr.v1.snapshot.projector` for an unpartitioned one, `….projector.<k>` for
partition k of N; `crr.projections.coverage` picks the current layout's records
(left-overs of an earlier layout are ignored) and takes the minimum of their
`covered_seq` — 0 until every partition has written one.  The view never
calls a reporter or the projector: it only reads the stream.

Readiness: `ready` is false until the last record that existed when the
consumer was created has been applied; `select` and `explain` raise
`NotReadyError` before that — "not loaded yet" is never "absent".

Lean rows: a host record is decoded only as far as the columns need
(`HostTable.decode_record`: each catalog resource's state, value and
expiry — the numeric `expires_ts` twin when the record has one, else the
parsed `expires_at`), and the view keeps the record's bytes, not a `HostSnapshot`:
`table.get(host)` and `explain` decode the full record on demand.  Nothing
of a decoded record outlives its apply, so live updates do not grow the
object graph the garbage collector scans.  A record that does not decode
is logged and counted (`rejected`), and the rest is served; one whose lean
decode works but whose full decode fails is logged and counted
(`unreadable`) when `get` meets it, and `get` returns None for it.
With `pack_records` (the default) the view compresses the kept records
soon after they arrive (LZ4, ~3 µs each: a 6 kB host record keeps ~0.75 kB),
a few at a time between the loop's other work — `get` decompresses —
trading some CPU for memory; while the view is behind its
stream it applies records first and compresses later (`crr.view.record_packer`).

Cold start: during the initial load the host records are built into a new
`HostTable` a chunk at a time as they arrive (`HostTable.append_records`,
every `LOAD_CHUNK` records once the catalog is known): lean-decoded and
written column-wise with the garbage collector paused for each chunk, so
the building overlaps the receiving and no more than a chunk of records is
held twice.  When the consumer has caught up the last chunk goes in, the
table is swapped in and the heap is trimmed (the freed load buffers go
back to the OS).  Live records after that are applied one by one as they
arrive (`_live_record`): a host record is lean-decoded and *staged* in the table, whose
columns take every staged row in one column-wise pass when a query next reads them
(`HostTable.upsert_row`) — a record costs its decode when it arrives, its column writes
are shared with the records around it, and a query always sees every record applied
before it.  The follower reads them straight from the connection, answering the server's
flow control only for records taken (`Follower(direct=True)`), so a backlog waits in the
stream and the records' pending counts show it.

Restarts and regressions are the follower's (`crr.bus.follower`): nats-py's
ordered consumer resumes from the last delivered sequence + 1; after every
reconnect the follower checks that CRR_SNAPSHOT still holds the last record
handled and, if the stream went backwards (a SIGKILLed server lost
acknowledged records), reloads it into a fresh table on a new consumer and
swaps it in at once: until then `ready` stays true and queries see the old
table, never a half-loaded one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Final

import msgspec

from crr.admin.liveness import judgement
from crr.bus.connection import Connection
from crr.bus.follower import Follower
from crr.bus.ordered import StoredMessage
from crr.projections.coverage import Coverage
from crr.projections.freshness import Judgement, status_age
from crr.projections.host_table import LOAD_CHUNK, HostTable
from crr.projections.record.columns import COLUMNS_HEADER
from crr.projections.select import CompiledSelect, Explanation, compile_select, explain
from crr.runtime.gc_pause import gc_paused
from crr.runtime.heap import trim
from crr.schemas.catalog import Catalog
from crr.schemas.codec import DECODERS
from crr.schemas.errors import CrrError, CrrTimeoutError, NotReadyError, SubjectError
from crr.schemas.snapshot import ClusterSnapshot, ProjectorStatus
from crr.schemas.subjects import (
    SNAPSHOT_ALL,
    SNAPSHOT_STREAM,
    SnapshotKind,
    snapshot_host,
    snapshot_kind,
)
from crr.view.record_packer import RecordPacker

log = logging.getLogger("crr.view")

COMPILE_CACHE_SIZE: Final = 4096
"""Compiled expressions kept per catalog (oldest dropped first)."""

Listener = Callable[[str], None]

_cluster_decoder: msgspec.json.Decoder[ClusterSnapshot] = DECODERS[ClusterSnapshot]
_catalog_decoder: msgspec.json.Decoder[Catalog] = DECODERS[Catalog]
_status_decoder: msgspec.json.Decoder[ProjectorStatus] = DECODERS[ProjectorStatus]


class _Load:
    """A (re)load in progress: the table built a chunk at a time as the records arrive."""

    __slots__ = ("catalog", "cluster", "coverage", "last_subject", "pending", "position",
                 "table")

    def __init__(self) -> None:
        self.table: HostTable | None = None
        """The table being loaded (made once the catalog is known, or at the end)."""
        self.pending: dict[str, StoredMessage] = {}
        """Host records not in `table` yet, by subject (the next chunk)."""
        self.catalog: Catalog | None = None
        self.cluster: ClusterSnapshot | None = None
        self.coverage = Coverage()
        """Every projector status record loaded (a fresh one per load, swapped in at the end)."""
        self.position = 0
        self.last_subject: str | None = None
        """The subject of the record that completed the load (listeners hear it last)."""


class SchedulerView:
    """A scheduler's cached, live copy of CRR_SNAPSHOT (see the module doc).

    `idle_heartbeat` (seconds) bounds how fast a lost consumer is noticed
    (about twice that); `clock` gives `now` when `select`/`explain` get none;
    `pack_records`: keep the host records compressed (see the module doc).
    """

    def __init__(
        self,
        nc: Connection,
        *,
        idle_heartbeat: float = 2.0,
        clock: Callable[[], float] = time.time,
        pack_records: bool = True,
    ) -> None:
        self._nc = nc
        self._packer = RecordPacker(lambda: self.table) if pack_records else None
        self._idle_heartbeat = idle_heartbeat
        self._clock = clock
        self.table = HostTable(on_unreadable=self._unreadable)
        self.catalog: Catalog | None = None
        self.cluster: ClusterSnapshot | None = None
        self.projector: ProjectorStatus | None = None
        """The newest projector status record (for one projector: its status)."""
        self.projectors: list[ProjectorStatus] = []
        """The status records of the current projector layout (one, or one per partition
        in partition order; incomplete while a new layout's partitions start)."""
        self._coverage = Coverage()
        self._follower = Follower(
            nc, stream=SNAPSHOT_STREAM, subject=SNAPSHOT_ALL, new_load=_Load,
            load=self._load_record, loaded=self._finish, live=self._live_record,
            idle_heartbeat=idle_heartbeat, name="scheduler view", direct=True)
        self._started = False
        self._position = 0
        self._projector_position = 0
        self._loaded = asyncio.Event()
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._listeners: list[Listener] = []
        self._compiled: dict[str, CompiledSelect] = {}
        self.applied = 0
        """Records applied since `start`."""
        self.rejected = 0
        """Records that could not be decoded (logged and skipped)."""
        self.unreadable = 0
        """Kept records whose full decode failed in `get` (logged; `get` gave None)."""

    @property
    def packed(self) -> int:
        """Records compressed since `start`."""
        return self._packer.packed if self._packer is not None else 0

    @property
    def pack_pauses(self) -> int:
        """Times the packer stopped for the view to catch up with its stream."""
        return self._packer.pauses if self._packer is not None else 0

    @property
    def reloads(self) -> int:
        """Full reloads after the stream went backwards (see the module doc)."""
        return self._follower.reloads

    @property
    def _check(self) -> asyncio.Task[bool] | None:
        """The follower's check after the last reconnect (tests await it)."""
        return self._follower.check_task

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        """Subscribe (one ordered consumer, DeliverLastPerSubject); returns at once."""
        if self._started:
            raise CrrError("scheduler view already started")
        self._started = True
        if self._packer is not None:
            self._packer.start()
        await self._follower.start()

    async def wait_packed(self, timeout: float = 60.0) -> None:
        """Wait until every host record the view keeps is compressed (after a load)."""
        if self._packer is not None:
            await self._packer.wait_packed(timeout)

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until the initial load is complete (CrrTimeoutError otherwise)."""
        await self._follower.wait_ready(timeout)  # the follower is ready once the view is

    async def stop(self) -> None:
        """Unsubscribe; pending `wait_until` calls fail with NotReadyError."""
        await self._follower.stop()
        if self._packer is not None:
            await self._packer.stop()
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(NotReadyError("scheduler view stopped"))
        self._waiters = []

    # -- position -------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Whether the initial load is complete."""
        return self._loaded.is_set()

    @property
    def connected(self) -> bool:
        """Whether the NATS connection is up now (False while it reconnects)."""
        return bool(self._nc.is_connected)

    @property
    def position(self) -> int:
        """Last CRR_SNAPSHOT stream sequence applied."""
        return self._position

    @property
    def last_stored_at(self) -> float:
        """Server time (epoch seconds) the last record handled was stored at (0: none yet)."""
        last = self._follower.last
        return last.time if last is not None else 0.0

    @property
    def projector_position(self) -> int:
        """Every CRR_EVENTS event up to this sequence is reflected in the view (0: not known).

        The minimum `covered_seq` of the current layout's status records (see the
        module doc); never goes back while live, even when a new layout's partitions
        have not all written a status yet.  A reload starts again from what it loaded.
        """
        return self._projector_position

    def status_age(self, now: float | None = None) -> float | None:
        """Seconds since the oldest current projector status the view holds was written.

        Each projector (each partition) rewrites its status record every second
        (`last_tick`, its wall clock), so an age of more than a few seconds says the
        view is behind — cut off from the stream, or no projector is writing — and its
        answers may come from a frozen snapshot.  None before any status arrived.
        """
        statuses = self.projectors or ([self.projector] if self.projector else [])
        if not statuses:
            return None
        at = self._clock() if now is None else now
        return max(status_age(st, at) for st in statuses)  # the rule every surface uses

    @property
    def nc(self) -> Connection:
        """The NATS connection the view reads through (history reads share it)."""
        return self._nc

    async def wait_until(self, events_seq: int, timeout: float = 10.0) -> None:
        """Wait until the view reflects every event up to CRR_EVENTS sequence `events_seq`.

        Each projector — or each partition — writes its status right after its
        flush, so by stream order every record it wrote for events ≤ its
        `covered_seq` precedes that status; the minimum over the current
        layout's partitions (`projector_position`) is therefore covered by all of
        them.  The view also waits for its initial load (during which records
        arrive last per subject, not in full order).
        """
        try:
            async with asyncio.timeout(timeout):
                await self._loaded.wait()
                if self._projector_position >= events_seq:
                    return
                fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                entry = (events_seq, fut)
                self._waiters.append(entry)
                try:
                    await fut
                finally:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(entry)
        except TimeoutError:
            raise CrrTimeoutError(
                f"scheduler view at events seq {self._projector_position}, not {events_seq}, "
                f"after {timeout:g}s (ready={self.ready})"
            ) from None

    # -- queries --------------------------------------------------------------

    def compile(self, expr: str) -> CompiledSelect:
        """`expr` compiled against the current catalog (cached until the catalog changes)."""
        compiled = self._compiled.get(expr)
        if compiled is not None:
            return compiled
        if self.catalog is None:
            self._require_ready()
            raise CrrError("no catalog in CRR_SNAPSHOT yet: apply one with `crr catalog apply` "
                           "(and is a projector running?)")
        compiled = compile_select(expr, self.catalog)
        if len(self._compiled) >= COMPILE_CACHE_SIZE:
            del self._compiled[next(iter(self._compiled))]
        self._compiled[expr] = compiled
        return compiled

    def judgement(self, now: float | None = None) -> Judgement:
        """When this view judges freshness at `now` (default: the clock): at the projector's
        watermark, at most `outage_hold` back (`crr.admin.liveness.judgement`); with
        `holding`, `lag` and a `detail` line.  A view cut off from NATS keeps its last
        statuses, so it holds the same way."""
        statuses = self.projectors or ([self.projector] if self.projector else [])
        return judgement(statuses, self.catalog, self._clock() if now is None else now)

    @property
    def judged_at(self) -> float:
        """The time `select`/`explain` judge freshness at now (`judgement().judged_at`)."""
        return self.judgement().judged_at

    @property
    def lag(self) -> float | None:
        """Seconds the projector's watermark lags the clock (None: no status yet)."""
        return self.judgement().lag

    def select(self, expr: str | CompiledSelect, now: float | None = None) -> list[str]:
        """Sorted names of the hosts where `expr` is TRUE, judged at `judgement(now)`'s
        `judged_at` (`now` default: the clock).

        Raises NotReadyError before the initial load, ExpressionError for a bad
        expression (with the column of the offending token).
        """
        self._require_ready()
        compiled = self.compile(expr) if isinstance(expr, str) else expr
        return compiled.select(self.table, self.judgement(now).judged_at)

    def explain(self, expr: str, host: str, now: float | None = None) -> Explanation:
        """Why `host` is or is not selected by `expr`, judged at `judgement(now)`'s
        `judged_at` (`.render()` for people)."""
        self._require_ready()
        return explain(self.compile(expr), self.table, host, self.judgement(now).judged_at)

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(subject)` after each applied record; returns the unsubscribe function.

        Listeners run inside the consumer's callback: keep them short (set an
        event, put on a queue).  An exception in one is logged and ignored.
        """
        self._listeners.append(listener)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return unsubscribe

    # -- the apply path ---------------------------------------------------------

    def _require_ready(self) -> None:
        if not self._loaded.is_set():
            raise NotReadyError(
                f"scheduler view not loaded yet ({self.applied} record(s) of {SNAPSHOT_STREAM} "
                "so far): wait_ready() first"
            )

    def _load_record(self, load: _Load, m: StoredMessage) -> None:
        """Loading: keep the record; every `LOAD_CHUNK` host records go into the table."""
        subject = m.subject
        kind = snapshot_kind(subject)
        if kind == "host":
            if m.data:
                pending = load.pending
                pending[subject] = m
                if len(pending) >= LOAD_CHUNK and load.catalog is not None:
                    self._load_pending(load)
            else:  # deleted (a reset consumer can repeat a subject): forget what was kept
                load.pending.pop(subject, None)
                if load.table is not None:
                    with contextlib.suppress(SubjectError):
                        load.table.remove(snapshot_host(subject))
        else:
            self._apply_other(m, kind, load)
        load.position = m.seq
        self.applied += 1
        if m.pending == 0:
            load.last_subject = subject  # notified after the swap, when ready
        elif self._listeners:  # (the usual load has none: no call per record)
            self._notify(subject)

    def _load_pending(self, load: _Load) -> None:
        """Put the kept host records into the load's table, column-wise (GC paused)."""
        table = load.table
        if table is None:
            table = load.table = HostTable(load.catalog, on_unreadable=self._unreadable)
        elif load.catalog is not None and table.catalog != load.catalog:
            table.set_catalog(load.catalog)  # a catalog after some hosts: rebuilt from bytes
        kept = list(load.pending.values())
        load.pending.clear()
        with gc_paused():
            table.append_records([m.data for m in kept],
                                 on_error=lambda i, exc: self._reject(kept[i], exc),
                                 columns=[m.headers.get(COLUMNS_HEADER) if m.headers else None
                                          for m in kept])

    def _live_record(self, m: StoredMessage) -> None:
        """A live record, applied as it arrives.  A host record is decoded — its columns
        header, else the record lean — and staged in the table (`HostTable.upsert_record`:
        its columns are written, together with every other staged row, by
        the next query), so taking a record costs its decode."""
        subject = m.subject
        kind = snapshot_kind(subject)
        try:
            if kind == "host":
                table = self.table
                if m.data:
                    table.upsert_record(
                        m.data, m.headers.get(COLUMNS_HEADER) if m.headers else None)
                else:  # a purge or delete marker: the host is gone
                    table.remove(snapshot_host(subject))
            else:
                self._apply_other(m, kind, None)
        except (msgspec.ValidationError, msgspec.DecodeError, SubjectError) as exc:
            self._reject(m, exc)
        self._applied(m, 1)
        if self._waiters:
            self._release_waiters()
        self._notify(subject)

    def _applied(self, last: StoredMessage, count: int) -> None:
        """Account for `count` live records up to `last`; the packer waits while more pend."""
        self._position = last.seq
        self.applied += count
        if self._packer is not None:
            self._packer.wanted(behind=bool(last.pending))

    def _notify(self, subject: str) -> None:
        if self._listeners:
            for listener in tuple(self._listeners):
                try:
                    listener(subject)
                except Exception:  # a listener's bug must not stop the view
                    log.exception("scheduler view listener %r failed", listener)

    def _apply_other(self, m: StoredMessage, kind: SnapshotKind | None,
                     load: _Load | None) -> None:
        """The projector status, cluster and catalog records: into `load`, or live into the view."""
        subject = m.subject
        try:
            match kind:
                case "projector":
                    coverage = self._coverage if load is None else load.coverage
                    if m.data:
                        coverage.add(subject, m.seq, _status_decoder.decode(m.data))
                    else:  # a purge or delete marker: that projector's record is gone
                        coverage.remove(subject)
                    if load is None:
                        self.projector = coverage.newest
                        self.projectors = coverage.current
                        self._projector_position = max(self._projector_position,
                                                       coverage.position)
                case "cluster":
                    cluster = _cluster_decoder.decode(m.data)
                    if load is not None:
                        load.cluster = cluster
                    else:
                        self.cluster = cluster
                        self.table.set_cluster(cluster)
                case "catalog":
                    catalog = _catalog_decoder.decode(m.data)
                    if load is not None:
                        load.catalog = catalog
                    elif catalog != self.catalog:
                        self.catalog = catalog
                        self.table.set_catalog(catalog)
                        self._compiled.clear()
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            self._reject(m, exc)

    def _reject(self, m: StoredMessage, exc: Exception) -> None:
        self.rejected += 1
        log.warning("scheduler view: skipping record %d on %s: %s", m.seq, m.subject, exc)

    def _unreadable(self, host: str, exc: Exception) -> None:
        self.unreadable += 1
        log.warning("scheduler view: the record of host %s does not decode in full: %s",
                    host, exc)

    def _finish(self, load: _Load) -> None:
        """Put the last kept records into the loaded table and swap it in, in one synchronous
        step."""
        self._load_pending(load)  # the last chunk (and a catalog that came after the hosts)
        table = load.table
        assert table is not None
        if load.cluster is not None:
            table.set_cluster(load.cluster)
        reload = self._loaded.is_set()
        # The swap: no await in between, so readers see the old state or the new one.
        self.table = table
        if load.catalog != self.catalog:
            self._compiled.clear()
        self.catalog = load.catalog
        self.cluster = load.cluster
        self._coverage = load.coverage
        self.projector = load.coverage.newest
        self.projectors = load.coverage.current
        self._projector_position = load.coverage.position
        self._position = load.position
        load.table = None
        trim()
        if self._packer is not None:
            self._packer.wanted(behind=False)  # the load ends with nothing pending
        self._loaded.set()
        log.info("scheduler view %s at seq %d (%d hosts)", "reloaded" if reload else "ready",
                 load.position, len(table))
        if self._waiters:
            self._release_waiters()
        if load.last_subject is not None:
            self._notify(load.last_subject)

    def _release_waiters(self) -> None:
        if not self._loaded.is_set():
            return
        pos = self._projector_position
        for seq, fut in self._waiters:
            if seq <= pos and not fut.done():
                fut.set_result(None)


@contextlib.asynccontextmanager
async def loaded_view(nc: Connection, timeout: float = 30.0, *,
                      pack_records: bool = False) -> AsyncIterator[SchedulerView]:
    """`async with loaded_view(nc) as view:` — a started, ready view, stopped on exit.

    For one-shot commands: the records are not compressed unless asked (the
    process does not live long enough for that to pay off)."""
    view = SchedulerView(nc, pack_records=pack_records)
    await view.start()
    try:
        await view.wait_ready(timeout)
        yield view
    finally:
        await view.stop()
