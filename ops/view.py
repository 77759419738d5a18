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
projector's status record gives `projector_position` (the CRR_EVENTS
sequence the snapshot covers).  The view never calls a reporter or the
projector: it only reads the stream.

Readiness: `ready` is false until the last record that existed when the
consumer was created has been applied; `select` and `explain` raise
`NotReadyError` before that — "not loaded yet" is never "absent".

Restarts: nats-py's ordered consumer notices missed heartbeats after a
server restart (or any gap) and re-creates itself from the last stream
sequence it delivered + 1, retrying until the server answers.  CRR_SNAPSHOT
is compacted, so everything newer than `position` is exactly what the view
missed; the view converges without a reload.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Final

import msgspec
from nats.aio.client import Client
from nats.js.api import DeliverPolicy

from bus.ordered import OrderedReader, StoredMessage
from bus.subjects import (
    SNAPSHOT_CATALOG,
    SNAPSHOT_CLUSTER,
    SNAPSHOT_HOST_PREFIX,
    SNAPSHOT_PROJECTOR,
    SNAPSHOT_STREAM,
    untoken,
)
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
        self._reader: OrderedReader | None = None
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

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        """Subscribe (one ordered consumer, DeliverLastPerSubject); returns at once."""
        if self._reader is not None:
            raise CrrError("scheduler view already started")
        self._reader = OrderedReader(
            self._nc, stream=SNAPSHOT_STREAM, subject=SNAPSHOT_FILTER, handler=self._apply,
            deliver=DeliverPolicy.LAST_PER_SUBJECT, idle_heartbeat=self._idle_heartbeat,
        )
        await self._reader.start()
        if self._reader.ready.is_set():  # the stream was empty
            self._loaded.set()

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
        """The CRR_EVENTS sequence the projector last reported as written (0: none seen)."""
        return self._projector_position

    async def wait_until(self, events_seq: int, timeout: float = 10.0) -> None:
        """Wait until the view reflects every event up to CRR_EVENTS sequence `events_seq`.

        The projector writes its status right after each flush, so by stream
        order every record covering events ≤ `last_seq` precedes it; the view
        also waits for its initial load (during which records arrive last per
        subject, not in full order).
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
        try:
            if subject.startswith(SNAPSHOT_HOST_PREFIX):
                if m.data:
                    self.table.upsert(_host_decoder.decode(m.data))
                else:  # a purge or delete marker: the host is gone
                    self.table.remove(untoken(subject[len(SNAPSHOT_HOST_PREFIX):]))
            elif subject == SNAPSHOT_PROJECTOR:
                self.projector = _status_decoder.decode(m.data)
                self._projector_position = max(self._projector_position, self.projector.last_seq)
            elif subject == SNAPSHOT_CLUSTER:
                self.cluster = _cluster_decoder.decode(m.data)
                self.table.set_cluster(self.cluster)
            elif subject == SNAPSHOT_CATALOG:
                catalog = _catalog_decoder.decode(m.data)
                if catalog != self.catalog:
                    self.catalog = catalog
                    self.table.set_catalog(catalog)
                    self._compiled.clear()
        except (msgspec.ValidationError, msgspec.DecodeError, SubjectError) as exc:
            self.rejected += 1
            log.warning("scheduler view: skipping record %d on %s: %s", m.seq, subject, exc)
        self._position = m.seq
        self.applied += 1
        if m.pending == 0 and not self._loaded.is_set():
            self._loaded.set()
            log.info("scheduler view ready at seq %d (%d hosts)", m.seq, len(self.table))
        if self._waiters:
            self._release_waiters()
        for listener in tuple(self._listeners):
            try:
                listener(subject)
            except Exception:  # a listener's bug must not stop the view
                log.exception("scheduler view listener %r failed", listener)

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
