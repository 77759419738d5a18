"""The scheduler view: a live, cached copy of CRR_SNAPSHOT that answers `select[]`.

A scheduler embeds one `SchedulerView` per process::

    async with connect(url, name="scheduler") as nc:
        view = SchedulerView(nc)
        await view.start()
        await view.wait_ready()                 # initial load complete
        hosts = view.select('scratch_free > 100 && datasets has "c4"')
        print(view.explain("scratch_free > 100", "node7").render())

One ordered consumer on `crr.v1.snapshot.>` (DeliverLastPerSubject) loads
the compacted snapshot and then stays on for live changes: host records go
into a columnar `HostTable`, the catalog record (`crr.v1.snapshot.catalog`)
re-shapes the table, the cluster record feeds cluster-scope values, and the
projector status records give `projector_position` (the CRR_EVENTS
sequence the snapshot covers).  There is one status record per projector:
`crr.v1.snapshot.projector` for an unpartitioned one, `….projector.<k>` for
partition k of N; `projections.coverage` picks the current layout's records
(left-overs of an earlier layout are ignored) and takes the minimum of their
`covered_seq` — 0 until every partition has written one.  The view never
calls a reporter or the projector: it only reads the stream.

Readiness: `ready` is false until the last record that existed when the
consumer was created has been applied; `select` and `explain` raise
`NotReadyError` before that — "not loaded yet" is never "absent".

Cold start: during the initial load the records are only kept (the last
per subject, raw); when the consumer is caught up they are decoded and the
`HostTable` is built column-wise in one go (`HostTable.load`), with the
garbage collector paused for that synchronous step.  Live records after
that are `upsert`ed one by one.

Restarts: nats-py's ordered consumer notices missed heartbeats after a
server restart (or any gap) and re-creates itself from the last stream
sequence it delivered + 1, retrying until the server answers.  CRR_SNAPSHOT
is compacted, so everything newer than `position` is exactly what the view
missed — unless the server lost its last acknowledged messages (a SIGKILL
with the default asynchronous flush) and re-used their sequence numbers.
So after every reconnect the view compares the stream with its position
(`last_seq` < position, or a different record stored at `position`) and,
if the stream went backwards, reloads it into a fresh table on a new
consumer and swaps it in at once: until then `ready` stays true and
queries see the old table, never a half-loaded one.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Final

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.js.api import DeliverPolicy

from bus.connection import add_reconnect_listener
from bus.ordered import OrderedReader, StoredMessage
from bus.stream_check import still_holds
from bus.subjects import (
    SNAPSHOT_CATALOG,
    SNAPSHOT_CLUSTER,
    SNAPSHOT_HOST_PREFIX,
    SNAPSHOT_STREAM,
    is_projector_status,
    untoken,
)
from projections.coverage import Coverage
from projections.host_table import HostTable
from projections.select import CompiledSelect, Explanation, compile_select, explain
from schemas.catalog import Catalog
from schemas.codec import DECODERS
from schemas.errors import CrrError, CrrTimeoutError, NotReadyError, SubjectError
from schemas.snapshot import ClusterSnapshot, HostSnapshot, ProjectorStatus

log = logging.getLogger("crr.view")

SNAPSHOT_FILTER: Final = "crr.v1.snapshot.>"
COMPILE_CACHE_SIZE: Final = 4096
"""Compiled expressions kept per catalog (oldest dropped first)."""

Listener = Callable[[str], None]

_host_decoder: msgspec.json.Decoder[HostSnapshot] = DECODERS[HostSnapshot]
_cluster_decoder: msgspec.json.Decoder[ClusterSnapshot] = DECODERS[ClusterSnapshot]
_catalog_decoder: msgspec.json.Decoder[Catalog] = DECODERS[Catalog]
_status_decoder: msgspec.json.Decoder[ProjectorStatus] = DECODERS[ProjectorStatus]


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for a synchronous bulk build.

    Decoding tens of thousands of snapshots creates millions of objects,
    none of them garbage; generation scans would cost as much as the
    decoding.  Nested use is safe.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _Load:
    """A (re)load in progress: the records kept until the consumer has caught up."""

    __slots__ = ("catalog", "cluster", "coverage", "hosts", "position")

    def __init__(self) -> None:
        self.hosts: dict[str, StoredMessage] = {}
        """Last record per host subject (empty data: the host was removed)."""
        self.catalog: Catalog | None = None
        self.cluster: ClusterSnapshot | None = None
        self.coverage = Coverage()
        """Every projector status record loaded (a fresh one per load, swapped in at the end)."""
        self.position = 0


class SchedulerView:
    """A scheduler's cached, live copy of CRR_SNAPSHOT (see the module doc).

    `idle_heartbeat` (seconds) bounds how fast a lost consumer is noticed
    (about twice that); `clock` gives `now` when `select`/`explain` get none.
    """

    def __init__(
        self,
        nc: Client,
        *,
        idle_heartbeat: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._nc = nc
        self._idle_heartbeat = idle_heartbeat
        self._clock = clock
        self.table = HostTable()
        self.catalog: Catalog | None = None
        self.cluster: ClusterSnapshot | None = None
        self.projector: ProjectorStatus | None = None
        """The newest projector status record (for one projector: its status)."""
        self.projectors: list[ProjectorStatus] = []
        """The status records of the current projector layout (one, or one per partition
        in partition order; incomplete while a new layout's partitions start)."""
        self._coverage = Coverage()
        self._reader: OrderedReader | None = None
        self._generation = 0
        """Bumped for each consumer: records of a replaced one are ignored."""
        self._load: _Load | None = None
        self._last: StoredMessage | None = None
        """The last record handled (what the stream should still hold at its seq)."""
        self._remove_reconnect: Callable[[], None] | None = None
        self._check: asyncio.Task[None] | None = None
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
        self.reloads = 0
        """Full reloads after the stream went backwards (see the module doc)."""

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        """Subscribe (one ordered consumer, DeliverLastPerSubject); returns at once."""
        if self._reader is not None:
            raise CrrError("scheduler view already started")
        self._remove_reconnect = add_reconnect_listener(self._nc, self._on_reconnect)
        await self._subscribe()

    async def _subscribe(self) -> None:
        """A new consumer (DeliverLastPerSubject) loading into a new `_Load`."""
        self._generation += 1
        generation = self._generation
        load = self._load = _Load()

        def handler(m: StoredMessage) -> None:
            if generation == self._generation:
                self._apply(m)

        self._reader = OrderedReader(
            self._nc, stream=SNAPSHOT_STREAM, subject=SNAPSHOT_FILTER, handler=handler,
            deliver=DeliverPolicy.LAST_PER_SUBJECT, idle_heartbeat=self._idle_heartbeat,
        )
        await self._reader.start()
        if self._reader.ready.is_set() and self._load is load:  # the stream was empty
            self._finish(load)

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until the initial load is complete (CrrTimeoutError otherwise)."""
        if self._reader is None:
            raise CrrError("scheduler view not started (call start() first)")
        try:
            await asyncio.wait_for(self._loaded.wait(), timeout)
        except TimeoutError:
            raise CrrTimeoutError(
                f"scheduler view: initial load of {SNAPSHOT_STREAM} not complete after "
                f"{timeout:g}s ({self.applied} record(s) so far)"
            ) from None

    async def stop(self) -> None:
        """Unsubscribe; pending `wait_until` calls fail with NotReadyError."""
        if self._remove_reconnect is not None:
            self._remove_reconnect()
            self._remove_reconnect = None
        if self._check is not None:
            self._check.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._check
            self._check = None
        self._generation += 1
        if self._reader is not None:
            await self._reader.stop()
            self._reader = None
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
    def position(self) -> int:
        """Last CRR_SNAPSHOT stream sequence applied."""
        return self._position

    @property
    def projector_position(self) -> int:
        """Every CRR_EVENTS event up to this sequence is reflected in the view (0: not known).

        The minimum `covered_seq` of the current layout's status records (see the
        module doc); never goes back while live, even when a new layout's partitions
        have not all written a status yet.  A reload starts again from what it loaded.
        """
        return self._projector_position

    @property
    def nc(self) -> Client:
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

    def select(self, expr: str | CompiledSelect, now: float | None = None) -> list[str]:
        """Sorted names of the hosts where `expr` is TRUE at `now` (default: the clock).

        Raises NotReadyError before the initial load, ExpressionError for a bad
        expression (with the column of the offending token).
        """
        self._require_ready()
        compiled = self.compile(expr) if isinstance(expr, str) else expr
        return compiled.select(self.table, self._clock() if now is None else now)

    def explain(self, expr: str, host: str, now: float | None = None) -> Explanation:
        """Why `host` is or is not selected by `expr` at `now` (`.render()` for people)."""
        self._require_ready()
        return explain(self.compile(expr), self.table, host,
                       self._clock() if now is None else now)

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

    def _apply(self, m: StoredMessage) -> None:
        subject = m.subject
        load = self._load
        if load is not None:
            # Loading: keep the record; the table is built when the consumer caught up.
            if subject.startswith(SNAPSHOT_HOST_PREFIX):
                load.hosts[subject] = m
            else:
                self._apply_other(m, load)
            load.position = m.seq
        else:
            try:
                if subject.startswith(SNAPSHOT_HOST_PREFIX):
                    if m.data:
                        self.table.upsert(_host_decoder.decode(m.data))
                    else:  # a purge or delete marker: the host is gone
                        self.table.remove(untoken(subject[len(SNAPSHOT_HOST_PREFIX):]))
                else:
                    self._apply_other(m, None)
            except (msgspec.ValidationError, msgspec.DecodeError, SubjectError) as exc:
                self._reject(m, exc)
            self._position = m.seq
        self._last = m
        self.applied += 1
        if load is not None and m.pending == 0:
            self._finish(load)
        elif self._waiters:
            self._release_waiters()
        if self._listeners:
            for listener in tuple(self._listeners):
                try:
                    listener(subject)
                except Exception:  # a listener's bug must not stop the view
                    log.exception("scheduler view listener %r failed", listener)

    def _apply_other(self, m: StoredMessage, load: _Load | None) -> None:
        """The projector status, cluster and catalog records: into `load`, or live into the view."""
        subject = m.subject
        try:
            if is_projector_status(subject):
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
            elif subject == SNAPSHOT_CLUSTER:
                cluster = _cluster_decoder.decode(m.data)
                if load is not None:
                    load.cluster = cluster
                else:
                    self.cluster = cluster
                    self.table.set_cluster(cluster)
            elif subject == SNAPSHOT_CATALOG:
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

    def _decoded_hosts(self, load: _Load) -> Iterator[HostSnapshot]:
        """The kept host records, decoded one by one (undecodable ones counted and skipped)."""
        decode = _host_decoder.decode
        for m in load.hosts.values():
            if m.data:
                try:
                    yield decode(m.data)
                except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                    self._reject(m, exc)

    def _finish(self, load: _Load) -> None:
        """Build the loaded table column-wise and swap it in, all in one synchronous step."""
        table = HostTable(load.catalog)
        with _gc_paused():
            table.load(self._decoded_hosts(load))
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
        self._load = None
        self._loaded.set()
        log.info("scheduler view %s at seq %d (%d hosts)", "reloaded" if reload else "ready",
                 load.position, len(table))
        if self._waiters:
            self._release_waiters()

    # -- the stream going backwards (see the module doc) -------------------------

    def _on_reconnect(self) -> None:
        if self._check is None or self._check.done():
            self._check = asyncio.get_running_loop().create_task(self._check_sequence())

    async def _check_sequence(self) -> None:
        """After a reconnect: reload if the stream no longer holds what the view applied."""
        last = self._last
        if last is None:
            return
        try:
            held = await still_holds(self._nc, SNAPSHOT_STREAM, last.seq, last.subject, last.data)
        except (nats.errors.Error, TimeoutError) as exc:
            log.warning("scheduler view: cannot check %s after a reconnect: %r",
                        SNAPSHOT_STREAM, exc)
            return
        if not held:
            log.warning("scheduler view: %s went backwards (seq %d the view applied is no "
                        "longer stored): the server lost acknowledged records; reloading",
                        SNAPSHOT_STREAM, last.seq)
            await self._reload()

    async def _reload(self) -> None:
        """Load the stream again on a new consumer; the old table serves until the swap."""
        self.reloads += 1
        old = self._reader
        self._generation += 1  # the old consumer's records are ignored from here on
        if old is not None:
            await old.stop()
        await self._subscribe()

    def _release_waiters(self) -> None:
        if not self._loaded.is_set():
            return
        pos = self._projector_position
        for seq, fut in self._waiters:
            if seq <= pos and not fut.done():
                fut.set_result(None)


@contextlib.asynccontextmanager
async def loaded_view(nc: Client, timeout: float = 30.0) -> AsyncIterator[SchedulerView]:
    """`async with loaded_view(nc) as view:` — a started, ready view, stopped on exit."""
    view = SchedulerView(nc)
    await view.start()
    try:
        await view.wait_ready(timeout)
        yield view
    finally:
        await view.stop()
