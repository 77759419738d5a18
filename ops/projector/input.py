"""The projector's input: CRR_EVENTS read in order, and back-pressure while it writes.

One ordered, back-pressured reader (`crr.bus.ordered.OrderedReader`) at a time feeds the
fold; a replaced one's stray deliveries are dropped (`crr.bus.stream_check.Generations`).
While a flush encodes the records it writes, arriving events are held (and folded
right after it), so every record written reflects exactly the cut its status claims;
past `HOLD_LIMIT` held the reader waits, later events wait in its backlog as raw
bytes, and the server waits with the rest in CRR_EVENTS.  Once caught up after being
behind, the freed memory goes back to the OS (`heap.trim`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from crr.bus import tracing
from crr.bus.connection import Connection
from crr.bus.ordered import Delivery, OrderedReader, StoredMessage
from crr.bus.stream_check import Generations
from crr.runtime import heap
from crr.schemas.errors import CrrTimeoutError
from crr.schemas.subjects import (
    CATALOG,
    EVENTS_STREAM,
    EVERYTHING,
    cluster_event_filter,
    partition_event_filter,
)

HOLD_LIMIT = 1024
"""Events held during a flush before the reader is made to wait (see `Input.on_event`).

Later ones wait in the reader's backlog, as raw bytes (`crr.bus.natspy.ordered_consumer`), up to the
server's flow-control window (32 MiB of messages); the rest waits in CRR_EVENTS.  Held
events cost ~1.3 KB each in small objects, whose freed memory the process keeps (32,768
of them with a backlog of `Msg`s made the RSS after an overload 2-3x the steady one)."""


BACKLOG_WAIT = 1.0
"""At most this long a flush waits for the reader's backlog to be folded first."""


LOAD_STALL = 300.0
"""An initial load (restore or rebuild) that receives nothing for this long fails (and the
start is retried); one that makes progress may take as long as the history needs."""


Fold = Callable[[StoredMessage, tracing.SpanContext | None], None]
"""Folds one event (and the trace it continues, if sampled)."""


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


class Input:
    """CRR_EVENTS as the fold reads it: the current reader, and the events held meanwhile."""

    def __init__(self, nc: Connection, fold: Fold) -> None:
        self._nc = nc
        self._fold = fold
        self.reader: OrderedReader | None = None
        """The current CRR_EVENTS reader (None: none reads)."""
        self._generations = Generations()
        """One per CRR_EVENTS consumer: events of a replaced one are ignored."""
        self.held_events: list[tuple[StoredMessage, tracing.SpanContext | None]] | None = None
        """Events that arrived while a flush was encoding, folded when it ends (None: no
        flush is encoding)."""
        self.held = 0
        """Events that arrived while a flush was encoding (folded right after it)."""
        self._flushed = asyncio.Event()
        """Set when no flush is encoding (`on_event` waits on it when many are held)."""
        self._flushed.set()
        self._trim_due = False
        """The reader was made to wait (behind): give freed memory back once caught up."""
        self.trims = 0
        """Times freed memory was given back after catching up (`heap.trim`)."""

    async def read(self, *, start_seq: int | None = None,
                   filters: list[str] | None = None) -> OrderedReader:
        """Stop the current reader, if any; start one of CRR_EVENTS from `start_seq` (None:
        its first stored message) filtered by `filters` (None: every subject)."""
        await self.stop()
        reader = OrderedReader(self._nc, stream=EVENTS_STREAM, subject=EVERYTHING,
                               handler=self._generations.guard(self.on_event),
                               deliver=Delivery.ALL, start_seq=start_seq,
                               filter_subjects=filters, backpressure=True, direct=True)
        self.reader = reader
        await reader.start()
        return reader

    async def stop(self) -> None:
        """Stop the current reader, if any (then there is none)."""
        reader, self.reader = self.reader, None
        if reader is not None:
            await reader.stop()

    def on_event(self, m: StoredMessage) -> Awaitable[None] | None:
        # A sampled report: the snapshot writes it causes continue its trace (the
        # CONSUMER span is current only now, while the reader calls this).
        hdrs = m.headers  # (most events carry none: no call then)
        parent = (tracing.current_span_context()
                  if hdrs is not None and tracing.is_traced(hdrs) else None)
        if self.held_events is None:
            self._fold(m, parent)
            return None
        self.held_events.append((m, parent))  # a flush is encoding: see `hold`
        self.held += 1
        if len(self.held_events) >= HOLD_LIMIT:
            # Back-pressure: the reader waits for the flush (and the server for the
            # reader: see OrderedReader's `backpressure`) instead of buffering here.
            self._trim_due = True
            return self._until_flushed()
        return None

    async def _until_flushed(self) -> None:
        await self._flushed.wait()

    def hold(self) -> None:
        """A flush begins encoding: hold arriving events until `release`."""
        assert self.held_events is None, "flushes do not overlap"
        self.held_events = []
        self._flushed.clear()

    def release(self) -> None:
        """Fold the events held while a flush was encoding; stop holding."""
        held, self.held_events = self.held_events, None
        for m, parent in held or ():
            self._fold(m, parent)
        self._flushed.set()

    async def fold_backlog(self) -> None:
        """Before a flush, fold what waits in the reader (up to `BACKLOG_WAIT` seconds):
        one flush then writes a host that many of those events changed once."""
        if self.reader is not None and self.reader.waiting:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.reader.drained(), BACKLOG_WAIT)

    @property
    def buffered(self) -> int:
        """Events received and not folded yet: held during a flush (≤ `HOLD_LIMIT`) and
        waiting in the reader (≤ the server's flow-control window)."""
        held = len(self.held_events) if self.held_events is not None else 0
        return held + (self.reader.waiting if self.reader is not None else 0)

    def trim(self, pending: int) -> None:
        """Caught up after being behind (nothing `pending` in CRR_EVENTS, nothing
        buffered): what the backlog's handling freed (the allocator keeps it otherwise)
        goes back to the OS."""
        if self._trim_due and not pending and not self.buffered:
            self._trim_due = False
            self.trims += heap.trim()

    async def wait_loaded(self) -> None:
        """Until the reader delivered what the stream held at its start: however long that
        takes while it makes progress; CrrTimeoutError when nothing moves for 5 minutes."""
        reader = self.reader
        assert reader is not None
        seen = -1
        while not reader.ready.is_set():
            if reader.received == seen:
                await reader.wait_ready(0.0)  # nothing moved for LOAD_STALL: raises
            seen = reader.received
            with contextlib.suppress(CrrTimeoutError):
                await reader.wait_ready(LOAD_STALL)
