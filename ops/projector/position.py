"""Where a projector stands in CRR_EVENTS, and how far CRR_SNAPSHOT covers it.

One `Position` per projector: the sequences of the last event folded
(`applied`), handled (folded or, not this partition's, dropped), written to
CRR_SNAPSHOT (`written`, with `wait_until`), and the coverage a status record
announces (`covered`, `stream_last`).  Unpartitioned, the consumer sees every
event, so covered = written.  A partition (`filters`: its own subjects) with
events of its own pending is covered up to what it has written; with none
pending it reads the stream's last sequence L, then asks the server for the
first event of its subjects after what it has written (`next_by_subj`); if
that is N, every event of its subjects up to min(L, N - 1) is written.
Readers take the minimum over the partitions (`crr.projections.coverage`).
"""

from __future__ import annotations

import asyncio

from crr.bus import jetstream
from crr.bus.jetstream import JetStream
from crr.schemas.errors import CrrTimeoutError, NotFoundOnServerError
from crr.schemas.subjects import EVENTS_STREAM


class Position:
    """A projector's stream positions (see the module doc)."""

    def __init__(self, js: JetStream, filters: list[str] | None) -> None:
        """`filters`: a partition's CRR_EVENTS filters (None: unpartitioned)."""
        self._js = js
        self._filters = filters
        self._changed = asyncio.Condition()
        self.applied = 0
        """Last event folded."""
        self.handled = 0
        """Last event folded or (not this partition's) dropped."""
        self.flushed_through = 0
        """`handled` when the last completed flush began: every event of this projector's
        up to it is written."""
        self.written = 0
        """Last CRR_EVENTS sequence whose effects are written to CRR_SNAPSHOT."""
        self.pending = 0
        """CRR_EVENTS messages not yet delivered (as of the last event handled)."""
        self.covered = 0
        self.stream_last = 0

    def folded(self, seq: int, pending: int) -> None:
        """An event of this projector's was folded."""
        self.handled = self.applied = seq
        self.pending = pending

    def dropped(self, seq: int, pending: int) -> None:
        """An event that is not this partition's went by."""
        self.handled = seq
        self.pending = pending

    async def flushed(self, seq: int, through: int) -> None:
        """A flush that began at (`seq` applied, `through` handled) is written."""
        async with self._changed:
            self.written = max(self.written, seq)
            self.flushed_through = max(self.flushed_through, through)
            self._changed.notify_all()

    async def restart_at(self, seq: int, *, covered: int = 0, stream_last: int = 0) -> None:
        """Everything up to `seq` is folded and written (a restore), or nothing (0: a
        rebuild after the stream went backwards: sequences were re-used)."""
        self.applied = self.handled = self.flushed_through = seq
        self.pending = 0
        self.covered, self.stream_last = covered, stream_last
        async with self._changed:
            self.written = seq
            self._changed.notify_all()

    async def wait_until(self, seq: int, timeout: float = 10.0) -> None:
        """Wait until every event up to `seq` is reflected in CRR_SNAPSHOT."""
        async def reached() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: self.written >= seq)

        try:
            await asyncio.wait_for(reached(), timeout)
        except TimeoutError:
            raise CrrTimeoutError(
                f"projector at {self.written}, not {seq}, after {timeout:g}s") from None

    async def coverage(self) -> None:
        """Bring `covered` and `stream_last` up to date (see the module doc): one stream
        info and one `next_by_subj` lookup per filter, concurrently, for an idle partition."""
        # Every event of this projector's up to `through` is written: those a partition's
        # initial load dropped (other partitions' hosts, old layouts) need no writing.
        through = max(self.written, self.flushed_through)
        known_last = self.applied + self.pending
        if self._filters is None or self.pending:
            self.covered = max(self.covered, through)
            self.stream_last = max(self.stream_last, known_last)
            return
        last = (await jetstream.stream_state(self._js, EVENTS_STREAM)).last_seq  # read first
        # After `through`, only the live consumer's subjects (this layout's) can be ours.
        nexts = await asyncio.gather(*(self._next_of(f, through + 1) for f in self._filters))
        first_unwritten = min((n for n in nexts if n is not None), default=last + 1)
        self.covered = max(self.covered, through, min(last, first_unwritten - 1))
        self.stream_last = max(self.stream_last, last, known_last)

    async def _next_of(self, subject: str, seq: int) -> int | None:
        """The first CRR_EVENTS sequence >= `seq` on `subject` (a filter), None: none yet."""
        try:
            m = await jetstream.get(self._js, EVENTS_STREAM, seq, subject=subject, next=True)
        except NotFoundOnServerError:
            return None
        return m.seq or None
