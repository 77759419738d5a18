"""What the projector checks of the streams it runs on.

- At start, the layout: CRR_EVENTS stored for this projector's number of partitions
  (`check_layout`); and, per catalog, that CRR_EVENTS retains events longer than any
  declared `interval + grace` (`Retention`).
- The stream going backwards: after every reconnect, that CRR_EVENTS still holds the
  last event folded and CRR_SNAPSHOT the last status written (`crr.bus.stream_check`); a
  server that lost acknowledged messages fails that check, and the projector rebuilds
  from the retained history and rewrites whatever CRR_SNAPSHOT no longer matches.
- CRR_SNAPSHOT deleted under the running projector: created again and every record
  rewritten (`StreamChecks.snapshot_recreated`).
"""

from __future__ import annotations

import asyncio
import logging

from crr.bus.cancel import cancel_and_wait
from crr.bus.connection import Connection
from crr.bus.errors import nats_errors
from crr.bus.jetstream import jetstream, stream_state
from crr.bus.stream_check import lost
from crr.bus.streams import StreamSettings, provision
from crr.projector.live_fold import LiveFold
from crr.projector.output import Output
from crr.schemas.errors import BusError, CrrTimeoutError, NotFoundOnServerError, StreamConfigError
from crr.schemas.subjects import EVENTS_STREAM, SNAPSHOT_STREAM

log = logging.getLogger("crr.projector")


async def check_layout(nc: Connection, partitions: int | None) -> float:
    """Refuse to run with another number of partitions than CRR_EVENTS stores with; its
    `max_age` (seconds; 0: unlimited).

    (An unpartitioned projector beside partitioned ones would write the same
    host records twice; a partition of the wrong N would fold the wrong hosts.)"""
    events = await stream_state(jetstream(nc, timeout=10.0), EVENTS_STREAM)
    max_age = events.max_age
    stored = events.partitions
    mine = partitions or 1
    if stored != mine:
        raise StreamConfigError(
            f"{EVENTS_STREAM} is stored for {stored} projector partition(s), this projector "
            f"for {mine}: run every projector with the stream's layout "
            + ("(no --partitions)" if stored == 1 else
               f"(--partitions {stored} --partition K, 0 <= K < {stored})")
            + f", or change the layout with --partitions {mine} --update")
    return max_age


class Retention:
    """Warns (once per catalog) when a declared `interval + grace` exceeds CRR_EVENTS
    retention: a value reported once within that lifetime lives only in the snapshot
    after its event aged out, so losing CRR_SNAPSHOT as well would lose it."""

    def __init__(self, fold: LiveFold) -> None:
        self._fold = fold
        self.max_age = 0.0
        """CRR_EVENTS's `max_age` (seconds; 0: unlimited), read at start."""
        self._checked = -1
        """The catalog seq whose lifetimes were checked against `max_age`."""

    def check(self) -> None:
        state = self._fold.state
        catalog = state.catalog
        if catalog is None or state.catalog_seq == self._checked:
            return
        self._checked = state.catalog_seq
        longer = catalog.outliving(self.max_age)
        if longer:
            log.warning(
                "projector: %s retention (max_age %gs) is shorter than interval + grace of %s:"
                " a rebuild can only fold what is retained, so size max_age above the longest "
                "declared interval + grace (`crr projector --retention`)", EVENTS_STREAM,
                self.max_age, ", ".join(
                    f"{n} ({catalog.lifetime_of(n):g}s)" for n in longer))


class StreamChecks:
    """The checks of a running projector's streams (see module doc)."""

    def __init__(self, nc: Connection, settings: StreamSettings | None, *, fold: LiveFold,
                 output: Output, wake: asyncio.Event) -> None:
        self._nc = nc
        self._js = jetstream(nc, timeout=10.0)
        self._settings = settings
        self._fold = fold
        self._output = output
        self._wake = wake
        self.task: asyncio.Task[None] | None = None
        """The check after the last reconnect."""
        self.snapshot_recreations = 0
        """Times CRR_SNAPSHOT was found new while running (deleted, then created again here or
        by another writer) and every record rewritten."""

    def on_reconnect(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._check_streams())

    async def _check_streams(self) -> None:
        """After a reconnect: does each stream still hold what this projector last saw?
        (The check `crr.bus.follower.Follower` runs too; the rebuild itself is the run loop's,
        between flushes.)"""
        event = self._fold.last_event
        gone = await lost(self._nc, {
            EVENTS_STREAM: None if event is None else (event.seq, event.subject, event.data),
            SNAPSHOT_STREAM: self._output.last_status}, who="projector", log=log)
        if gone:
            self._fold.start_over(f"the server lost acknowledged messages ({', '.join(gone)} "
                                  "no longer stored)")

    async def close(self) -> None:
        await cancel_and_wait(self.task)

    async def snapshot_recreated(self) -> bool:
        """After a failed write: if CRR_SNAPSHOT was deleted under this running projector,
        create it again and rewrite every record (the fold state is intact: nothing to fold
        again); whether it did.  A server that does not answer is not a deleted stream."""
        try:
            await stream_state(self._js, SNAPSHOT_STREAM)
        except NotFoundOnServerError:
            pass
        except (BusError, CrrTimeoutError):
            return False
        else:
            return False
        log.warning("projector: %s was deleted; creating it again and rewriting every record",
                    SNAPSHOT_STREAM)
        try:
            with nats_errors():
                await provision(self._nc, self._settings)
        except (BusError, CrrTimeoutError) as exc:
            log.warning("projector: cannot create %s again yet (%r)", SNAPSHOT_STREAM, exc)
            return False
        self.rewrite_everything()
        return True

    def rewrite_everything(self) -> None:
        """CRR_SNAPSHOT is a new stream (created again here, or found created again by
        another writer): write every record again (the fold state is intact)."""
        self.snapshot_recreations += 1
        self._output.forget_written()
        self._fold.rewrite_all()  # restored records not placed yet are written too
        self._wake.set()
