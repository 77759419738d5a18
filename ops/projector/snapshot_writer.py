"""Writing the projector's records to CRR_SNAPSHOT: dedupe, pipelining, fencing, dead letters.

One `SnapshotWriter` per projector.  It knows what CRR_SNAPSHOT holds (a
digest per subject: `WrittenRecords`), so a record whose canonical bytes did
not change is never written again (a restart rewrites nothing); writes the
changed records pipelined (one wildcard ack inbox, no task per record) on
the hot path, or one by one with fencing headers while an HA lease is held
(ops/projector/lease.py) and for records that continue a sampled trace; and publishes
dead letters with a de-duplicating message id.  What to write, and when, is
the projector's business (ops/projector/service.py).

A record comes with its columns (`crr.projections.record.columns.COLUMNS_HEADER`,
None for records without): they go out as that header.  They are derived
from the record's bytes, so "unchanged" is decided on the bytes alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Iterable, Iterator

from crr.bus import jetstream, tracing
from crr.bus.connection import Connection, max_payload
from crr.bus.pipeline_publish import PipelinePublisher
from crr.bus.retry import FENCE_BUSY
from crr.projections.record.columns import COLUMNS_HEADER
from crr.projector.checkpoint_read import RawRecords
from crr.projector.lease import Lease
from crr.schemas.codec import encode
from crr.schemas.errors import (
    BusError,
    LeaseLostError,
    SequenceCheckBusyError,
    WrongLastSequenceError,
)
from crr.schemas.events import DeadLetter
from crr.schemas.subjects import DEADLETTER, MSG_ID_HEADER, deadletter_msg_id

WRITE_WINDOW = 512

EncodedRecord = tuple[str, bytes, str | None]
"""A record to write: subject, bytes, and its columns header (None: none)."""


HEADER_ROOM = 4096
"""Bytes left for the other headers when a record's columns are added (see `_columns`)."""


def _with_columns(headers: dict[str, str] | None, columns: str | None,
                  ) -> dict[str, str] | None:
    if columns is None:
        return headers
    return {COLUMNS_HEADER: columns} if headers is None else {**headers, COLUMNS_HEADER: columns}


class WrittenRecords:
    """What CRR_SNAPSHOT holds, as far as this projector knows: a digest per subject.

    (Python's own 64-bit hash of the bytes, SipHash: ~3x SHA-1's speed; it only
    ever compares a record with the previous one of the same subject within
    this process, where a collision — 2^-64 per write — is not a concern.)

    Lets the projector skip writing a record whose canonical bytes did not
    change (a restart rewrites nothing).  The bytes themselves are kept only
    when `keep_bytes` (the metrics census decodes them).
    """

    def __init__(self, *, keep_bytes: bool = False) -> None:
        self._digests: dict[str, int] = {}
        self._unhashed: dict[str, bytes] = {}
        """Records as read at start, not digested yet (`digest_some`); compared whole."""
        self._bytes: dict[str, bytes] | None = {} if keep_bytes else None

    @staticmethod
    def digest(data: bytes) -> int:
        """The digest `same`/`set` compare (compute it once per record written)."""
        return hash(data)

    def same(self, subject: str, data: bytes, digest: int | None = None) -> bool:
        """Whether `data` (whose `digest` may be given) is what `subject` already holds."""
        d = self._digests.get(subject)
        if d is None:
            held = self._unhashed.get(subject)
            return held is not None and held == data
        return d == (self.digest(data) if digest is None else digest)

    def set(self, subject: str, data: bytes, digest: int | None = None) -> None:
        """Record that `subject` now holds `data` (whose `digest` may be given)."""
        self._digests[subject] = self.digest(data) if digest is None else digest
        if self._unhashed:
            self._unhashed.pop(subject, None)
        if self._bytes is not None:
            self._bytes[subject] = data

    def pop(self, subject: str) -> None:
        """Forget `subject` (its next write always goes out)."""
        self._digests.pop(subject, None)
        self._unhashed.pop(subject, None)
        if self._bytes is not None:
            self._bytes.pop(subject, None)

    def clear(self) -> None:
        """Forget everything (after losing and retaking the lease)."""
        self._digests.clear()
        self._unhashed.clear()
        if self._bytes is not None:
            self._bytes.clear()

    @property
    def keeps_bytes(self) -> bool:
        """Whether the bytes are kept (else only digests)."""
        return self._bytes is not None

    def items(self) -> list[tuple[str, bytes]]:
        """(subject, bytes) pairs, when bytes are kept; else empty."""
        return list(self._bytes.items()) if self._bytes is not None else []

    def load(self, records: Iterable[tuple[str, bytes]]) -> None:
        """What CRR_SNAPSHOT holds, as read: kept whole until `digest_some` (a restart
        is not held up digesting every record)."""
        for subject, data in records:
            self._digests.pop(subject, None)
            self._unhashed[subject] = data
            if self._bytes is not None:
                self._bytes[subject] = data

    @property
    def unhashed(self) -> int:
        """Records loaded and not digested yet."""
        return len(self._unhashed)

    def digest_some(self, limit: int) -> None:
        """Digest up to `limit` loaded records (then only their digests are kept)."""
        held = self._unhashed
        for _ in range(min(limit, len(held))):
            subject, data = held.popitem()
            self._digests[subject] = self.digest(data)

    def __len__(self) -> int:
        return len(self._digests) + len(self._unhashed)


class SnapshotWriter:
    """Writes records to CRR_SNAPSHOT unless it holds them already (see the module doc)."""

    def __init__(self, nc: Connection, *, lease: Lease | None = None,
                 keep_bytes: bool = False) -> None:
        self._nc = nc
        self._js = jetstream.jetstream(nc, timeout=10.0)
        self._lease = lease
        self._pipe: PipelinePublisher | None = None
        self.written = WrittenRecords(keep_bytes=keep_bytes)
        self.writes = 0
        """Records (and status records) written."""

    def load(self, raw: RawRecords) -> None:
        """What CRR_SNAPSHOT holds now (as read), so unchanged records are not rewritten."""
        self.written.load((subject, data) for subject, (_, data) in raw.items())

    def fenced(self) -> contextlib.AbstractAsyncContextManager[dict[str, str] | None]:
        """Fenced-write headers while holding the lease (HA), else no headers."""
        if self._lease is None:
            return contextlib.nullcontext(None)
        return self._lease.writing()

    async def publish(self, subject: str, data: bytes, fence: dict[str, str] | None = None,
                      columns: str | None = None,
                      parent: tracing.SpanContext | None = None) -> int | None:
        """Write one record (with the `fence` headers, and its `columns`; continuing the
        trace `parent`) unless CRR_SNAPSHOT holds it already; its seq (None: skipped).
        LeaseLostError when a fenced write is refused."""
        if self.written.same(subject, data):
            return None
        headers = _with_columns(fence, self._columns(data, columns))
        span = None
        if parent is not None:  # continue the report's trace (W3C context in the headers)
            headers = dict(headers or {})
            span = tracing.start_publish(subject, headers, parent=parent, size=len(data))
            headers = headers or None
        try:
            seq = await jetstream.publish(self._js, subject, data, headers=headers)
            tracing.end_publish(span, seq=seq)
        except BaseException as exc:
            tracing.end_publish(span, error=exc)
            if (fence is not None and self._lease is not None
                    and isinstance(exc, WrongLastSequenceError)):  # the fence
                self._lease.lost()
                raise LeaseLostError(f"write to {subject} refused: lease lost") from exc
            raise
        self.written.set(subject, data)
        self.writes += 1
        return seq

    def _columns(self, data: bytes, columns: str | None) -> str | None:
        """`columns`, unless the record would then exceed the server's max_payload: a record
        that fits goes out without them rather than not at all (readers read it whole)."""
        if columns is None:
            return None
        room = max_payload(self._nc) - HEADER_ROOM - len(data)
        if 4 * len(columns) <= room or len(columns.encode()) <= room:  # (UTF-8: ≤ 4 B a char)
            return columns
        return None

    async def write(self, records: Iterator[EncodedRecord], letters: Iterable[DeadLetter] = (),
                    parents: dict[str, tracing.SpanContext] | None = None) -> None:
        """Write the changed `records` (consumed lazily), then the dead letters; returns
        when every write is acknowledged, raises (NATS errors, LeaseLostError) if one
        failed.  `parents`: snapshot subject -> the sampled apply span its write continues
        (each popped as its record is written)."""
        parents = {} if parents is None else parents
        out = records
        if self._lease is None:  # the hot path: no fence, no trace
            slow: list[EncodedRecord] = []  # records continuing a sampled trace
            await self._pipelined(out, slow, parents)
            out = iter(slow)
        while window := list(itertools.islice(out, WRITE_WINDOW)):
            async with self.fenced() as fence:
                await self._publish_window(window, fence, parents)
        for dl in letters:
            await jetstream.publish(self._js, DEADLETTER, encode(dl),
                                    headers={MSG_ID_HEADER: deadletter_msg_id(dl.seq)})

    async def _publish_window(self, window: list[EncodedRecord], fence: dict[str, str] | None,
                              parents: dict[str, tracing.SpanContext]) -> None:
        """Write `window` concurrently; fenced writes a clustered stream refused as busy
        (one fenced write in flight at a time, ops/projector/lease.py) are retried one by one."""
        results = await asyncio.gather(
            *(self.publish(s, d, fence, c, parents.pop(s, None) if parents else None)
              for s, d, c in window), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        for exc in sorted(errors, key=lambda e: not isinstance(e, LeaseLostError)):
            if not isinstance(exc, SequenceCheckBusyError):
                raise exc
        busy = [rec for rec, r in zip(window, results, strict=True)
                if isinstance(r, SequenceCheckBusyError)]
        for s, d, c in busy:
            async for attempt in FENCE_BUSY.retrying(attempts=10, on=(SequenceCheckBusyError,)):
                with attempt:
                    await self.publish(s, d, fence, c)

    async def _pipelined(self, records: Iterable[EncodedRecord], slow: list[EncodedRecord],
                         parents: dict[str, tracing.SpanContext]) -> None:
        """Write the changed records pipelined and wait for every ack.

        `records` is consumed lazily: a record is encoded only when there is
        room in the pipeline, so a flush of every host holds ~`2 * WRITE_WINDOW`
        encoded records at once, not all of them (50k x 4.5 KB).  Records that
        continue a sampled trace are set aside in `slow` for `publish`.
        """
        if self._pipe is None:
            self._pipe = PipelinePublisher(self._nc, max_in_flight=2 * WRITE_WINDOW,
                                           ack_timeout=3.0, max_attempts=5)
            await self._pipe.start()
        pipe = self._pipe
        rejected, failed = pipe.stats.rejected, pipe.stats.failed
        written = self.written
        keep = written.keeps_bytes
        sent: list[tuple[str, int, bytes | None]] = []
        for record in records:
            s, d, columns = record
            if s in parents:
                slow.append(record)
                continue
            digest = written.digest(d)
            if written.same(s, d, digest):
                continue
            columns = self._columns(d, columns)
            await pipe.publish(s, d, None if columns is None else {COLUMNS_HEADER: columns})
            sent.append((s, digest, d if keep else None))
        if not sent:
            return
        try:
            await pipe.flush(60.0, fail_unanswered=True)  # CRR_SNAPSHOT deleted: say so now
        except BaseException:
            # The caller writes these records again, maybe newer: no re-send of this
            # batch may land after that (it would leave an old record last).
            self._pipe = None
            await pipe.abandon()
            raise
        if pipe.stats.rejected != rejected or pipe.stats.failed != failed:
            raise BusError(f"pipelined publish failed: {pipe.stats.last_error}")
        for subject, digest, data in sent:
            written.set(subject, data or b"", digest)
        self.writes += len(sent)

    async def close(self) -> None:
        """Stop the pipeline (waits up to a second for outstanding acks)."""
        if self._pipe is not None:
            await self._pipe.close(1.0)
            self._pipe = None
