"""What the projector writes to CRR_SNAPSHOT: the records a flush finds changed, the dead
letters, and its status right behind them.

A flush writes only records whose canonical bytes differ from what CRR_SNAPSHOT holds
(`crr.projector.snapshot_writer`: dedupe, pipelined and fenced writes); while it
encodes, arriving events are held (`crr.projector.input`), so every record
reflects exactly the cut (`crr.projector.status.Cut`) the status written
after it claims — `crr replay --verify` relies on it.  By stream order, a reader that
has read the status has read every record it covers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from crr.bus.connection import Connection
from crr.bus.errors import nats_errors
from crr.bus.stream_check import Seen
from crr.projections.record.body import cluster_record, host_record
from crr.projections.record.columns import host_columns
from crr.projector.checkpoint_read import RawRecords, load_checkpoint
from crr.projector.live_fold import Owed
from crr.projector.metrics import ProjectorMetrics
from crr.projector.position import Position
from crr.projector.snapshot_writer import EncodedRecord, SnapshotWriter
from crr.projector.status import Cut, Identity, Origin, status_record
from crr.schemas.codec import encode
from crr.schemas.errors import BusError, CrrTimeoutError, LeaseLostError
from crr.schemas.subjects import (
    SNAPSHOT_CATALOG,
    SNAPSHOT_CLUSTER,
    host_snapshot_subject,
    status_subject,
)

log = logging.getLogger("crr.projector")


class Output:
    """The projector's writes: records (`flush`) and its status (`write_status`)."""

    def __init__(self, nc: Connection, writer: SnapshotWriter, *, who: Identity, pos: Position,
                 origin: Origin, metrics: ProjectorMetrics, hosts: Callable[[], int],
                 on_catalog: Callable[[], None]) -> None:
        """`hosts`: how many hosts the projector folds (the status says).  `on_catalog`:
        called after a flush wrote a new catalog (the retention check)."""
        self._nc = nc
        self.writer = writer
        self._who = who
        self._pos = pos
        self._hosts = hosts
        self._origin = origin
        self._metrics = metrics
        self.cut = Cut()
        """What the status says of the state the written records reflect."""
        self.last_status: Seen | None = None
        """(seq, subject, data) of the last status written (what CRR_SNAPSHOT must hold)."""
        self.stream_renewed = False
        """A status write was acked at a sequence below the previous one (see write_status)."""
        self.status_writes = 0
        self._on_catalog = on_catalog
        self.watermark: float | None = None
        """The watermark the fold last expired at (`crr.projector.watermark`): the status's."""

    async def load_written(self, *, digest: bool, afresh: bool = False) -> RawRecords:
        """Read what CRR_SNAPSHOT holds now, so unchanged records are not rewritten; the
        records read (the checkpoint).  Digested now if `digest`, else later
        (`LiveFold.refine_lazy`: at the first start, after ready).  `afresh`: forget what
        it was seen to hold before (another writer may have written anything)."""
        if afresh:
            self.writer.written.clear()
        raw = await load_checkpoint(self._nc)
        self.writer.load(raw)
        if digest:
            self.writer.written.digest_some(len(raw))
        return raw

    async def flush(self, owed: Owed, *, encoded: Callable[[], None]) -> None:
        """Write what the fold owed (`owed`: its records and dead letters); `encoded` is
        called once every record is encoded (the run loop folds on while the acks come
        back).  Raises on failure (the run loop gives `owed` back to the fold)."""
        pos = self._pos
        seq, through = pos.applied, pos.handled
        dirty, state = owed.dirty, owed.state
        cut = self.cut.at(state, owed.applied, owed.deadletters, owed.next_due)
        owns_shared = self._who.partition in (None, 0)

        def records() -> Iterator[EncodedRecord]:
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
            encoded()  # all encoded: fold on while the acks come back

        try:
            with nats_errors():
                await self.writer.write(records(), owed.letters, owed.parents)
        except (BusError, CrrTimeoutError, LeaseLostError) as exc:
            log.warning("snapshot write failed (%s); will retry", exc)
            raise
        self._metrics.flushed(time.time())
        if dirty.catalog:
            self._on_catalog()
        self.cut = cut
        await pos.flushed(seq, through)

    def resume(self, cut: Cut) -> None:
        """Restored: the records CRR_SNAPSHOT holds reflect `cut`."""
        self.cut = cut

    def forget_written(self) -> None:
        """Forget what CRR_SNAPSHOT was seen to hold (it is rewritten, or read again)."""
        self.writer.written.clear()
        self.last_status = None
        self.stream_renewed = False

    async def write_status(self, now: float | None = None) -> None:
        """Write the status (`now`: its `last_tick`, default the clock)."""
        now = time.time() if now is None else now
        await self._pos.coverage()
        status = status_record(now, who=self._who, pos=self._pos, cut=self.cut,
                               origin=self._origin, hosts=self._hosts(),
                               watermark=self.watermark)
        subject = status_subject(self._who.partition)
        data = encode(status)
        async with self.writer.fenced() as fence:
            self.writer.written.pop(subject)  # always written: it carries last_tick
            seq = await self.writer.publish(subject, data, fence)
        if seq is not None:
            if self.last_status is not None and seq <= self.last_status[0]:
                # Sequences went backwards: CRR_SNAPSHOT is a new stream (deleted and
                # created again by another partition, or an admin) without this
                # projector's records; the run loop rewrites them.
                self.stream_renewed = True
            self.last_status = (seq, subject, data)
            self.status_writes += 1

    async def rebuild_status(self) -> None:
        """Write a `rebuilding` status; a failure only delays the next one."""
        try:
            with nats_errors():
                await self.write_status()
        except (BusError, CrrTimeoutError, LeaseLostError) as exc:
            log.debug("rebuilding status not written (%r)", exc)
