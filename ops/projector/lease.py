"""The projector writer lease: two (or more) projectors run, exactly one writes CRR_SNAPSHOT.

The lease is one record on `crr.v1.snapshot.lease` (partition `k`:
`crr.v1.snapshot.lease.<k>`) in CRR_SNAPSHOT, which keeps one message per
subject.  Every change to it is an optimistic-concurrency publish with
`Nats-Expected-Last-Subject-Sequence`, so of two projectors racing for it
exactly one wins:

- **acquire**: a free lease (no record, or one released with `holder: null`)
  is taken at once; a held one is taken when its record has not changed for
  its holder's `ttl`, measured on the standby's own monotonic clock (so clock
  skew between machines does not matter);
- **renew**: the holder republishes every `ttl / 3` expecting its own last
  lease sequence; a refusal means it was deposed;
- **fence**: every snapshot write of the holder carries
  `Nats-Expected-Last-Subject-Sequence: <lease seq>` with
  `Nats-Expected-Last-Subject-Sequence-Subject: <lease subject>` (nats-server
  2.11+), so the *server* refuses a write from a deposed holder, even one
  that has not noticed yet (paused, partitioned, slow).  Renewals and writes
  are serialised (`writing()`), so a renewal never invalidates a write in
  flight.

Takeover after the holder dies: at most `ttl` (unchanged record) + `ttl / 6`
(the standby's poll) + the time to rebuild and write the differences; with
the default 3 s TTL, under 4 s for a small snapshot.  A holder that stops
cleanly releases the lease, and a standby takes over within one poll.

Writes use `js.publish` and wait for the ack, never `publish_async`, whose
future never resolves when the server refuses a message (nats-py #985).

On a clustered (R3) stream the server lets only one message that checks a
given subject's last sequence be in flight at a time: a second one is refused
at once with "wrong last sequence" code 10164 (`SequenceCheckBusyError`), not 10071.
That is no verdict on the lease: a busy refusal is retried (writes) or taken
as "someone else is writing the lease" (a standby's acquire attempt).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

import msgspec

from crr.bus import jetstream, natspy
from crr.bus.cancel import cancel_and_wait
from crr.bus.connection import Connection, server_major_minor
from crr.schemas.errors import (
    BusError,
    CrrError,
    LeaseLostError,
    NotFoundOnServerError,
    SequenceCheckBusyError,
    WrongLastSequenceError,
)
from crr.schemas.subjects import SNAPSHOT_STREAM, lease_subject
from crr.schemas.wire_time import format_time

log = logging.getLogger("crr.lease")

DEFAULT_TTL = 3.0
EXPECTED_SEQ = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_SEQ_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
MIN_SERVER = (2, 11)

class LeaseRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Payload of the lease subject: who holds it (None: released), since which takeover."""

    holder: str | None
    epoch: int
    """Incremented by every acquisition; a takeover is visible as a new epoch."""
    ttl: float
    at: str
    """The holder's wall-clock time of this renewal (informational only)."""


_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder(LeaseRecord)


def check_server_version(nc: Connection) -> None:
    """Fencing needs `Nats-Expected-Last-Subject-Sequence-Subject`: refuse older servers."""
    have = server_major_minor(nc)
    if have is None:
        return  # (a version that does not parse: let the server decide)
    version = natspy.server_version(nc)
    if have < MIN_SERVER:
        raise CrrError(f"HA projectors need nats-server {MIN_SERVER[0]}.{MIN_SERVER[1]} or "
                       f"newer (fenced writes); the server runs {version}")


class Lease:
    """One projector's view of the writer lease (see module doc)."""

    def __init__(
        self,
        nc: Connection,
        holder: str,
        *,
        ttl: float = DEFAULT_TTL,
        partition: int | None = None,
        stream: str = SNAPSHOT_STREAM,
    ) -> None:
        self._nc = nc
        self._js = jetstream.jetstream(nc, timeout=max(1.0, ttl / 2))
        self.holder = holder
        self.ttl = ttl
        self.subject = lease_subject(partition)
        self.stream = stream
        self.seq = 0
        """Sequence of our last lease record while held."""
        self.epoch = 0
        self.held = False
        self.takeovers = 0
        self.on_lost: Callable[[], None] | None = None
        self._lock = asyncio.Lock()
        self._renewer: asyncio.Task[None] | None = None
        self._renewed_at = 0.0

    # -- observing --------------------------------------------------------

    async def observe(self) -> tuple[int, LeaseRecord | None]:
        """(sequence, record) of the lease as the stream holds it now; (0, None) if none."""
        try:
            msg = await jetstream.get_last(self._js, self.stream, self.subject)
        except NotFoundOnServerError:
            return 0, None
        rec = None
        if msg.data:
            try:
                rec = _decoder.decode(msg.data)
            except msgspec.DecodeError:
                log.warning("undecodable lease record at seq %d; treating it as expired", msg.seq)
        return msg.seq, rec

    def fence(self) -> dict[str, str]:
        """Headers that make the server refuse a write unless we still hold the lease."""
        if not self.held:
            raise LeaseLostError(f"{self.holder} does not hold {self.subject}")
        return {EXPECTED_SEQ: str(self.seq), EXPECTED_SEQ_SUBJECT: self.subject}

    @contextlib.asynccontextmanager
    async def writing(self) -> AsyncIterator[dict[str, str]]:
        """Hold off renewals while a batch of fenced writes is in flight; yields the headers."""
        async with self._lock:
            yield self.fence()

    # -- acquiring --------------------------------------------------------

    async def _publish(self, rec: LeaseRecord, expected: int) -> int:
        return await jetstream.publish(self._js, self.subject, _encoder.encode(rec),
                                       headers={EXPECTED_SEQ: str(expected)})

    async def try_acquire(self, expected: int, previous: LeaseRecord | None) -> bool:
        """Take the lease if its record is still at `expected`; False if someone beat us."""
        rec = LeaseRecord(holder=self.holder, epoch=(previous.epoch if previous else 0) + 1,
                          ttl=self.ttl, at=format_time(time.time()))
        try:
            seq = await self._publish(rec, expected)
        except (WrongLastSequenceError, SequenceCheckBusyError):
            return False
        self.seq, self.epoch, self.held = seq, rec.epoch, True
        self._renewed_at = time.monotonic()
        self.takeovers += 1
        log.warning("%s acquired %s (epoch %d, seq %d)", self.holder, self.subject,
                    self.epoch, seq)
        self._renewer = asyncio.create_task(self._renew_loop(), name="crr-lease-renew")
        return True

    async def acquire(self, stop: asyncio.Event | None = None) -> bool:
        """Wait (as a standby) until the lease is ours; False if `stop` was set first."""
        poll = self.ttl / 6
        seen_seq, seen_at = -1, 0.0
        while stop is None or not stop.is_set():
            try:
                seq, rec = await self.observe()
                now = time.monotonic()
                if seq != seen_seq:
                    seen_seq, seen_at = seq, now
                expired = now - seen_at >= (rec.ttl if rec is not None else 0.0)
                if (rec is None or rec.holder is None or rec.holder == self.holder or expired) \
                        and await self.try_acquire(seq, rec):
                    return True
            except BusError as exc:
                if not exc.retriable:
                    raise
                log.info("lease %s: cannot observe (%s); retrying", self.subject, exc)
            if stop is None:
                await asyncio.sleep(poll)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), poll)
        return False

    # -- holding ----------------------------------------------------------

    async def renew(self) -> None:
        """Republish our record expecting our last lease sequence; LeaseLostError if deposed."""
        async with self._lock:
            if not self.held:
                raise LeaseLostError(f"{self.holder} does not hold {self.subject}")
            rec = LeaseRecord(holder=self.holder, epoch=self.epoch, ttl=self.ttl,
                              at=format_time(time.time()))
            try:
                self.seq = await self._publish(rec, self.seq)
            except WrongLastSequenceError as exc:
                self._lose("another projector took the lease")
                raise LeaseLostError(f"{self.holder} lost {self.subject}") from exc
            self._renewed_at = time.monotonic()

    def _lose(self, why: str) -> None:
        if self.held:
            log.warning("%s lost %s: %s; now a standby", self.holder, self.subject, why)
        self.held = False
        if self.on_lost is not None:
            self.on_lost()

    def lost(self, why: str = "a fenced write was refused") -> None:
        """Record that the lease is gone (the projector saw a fenced write refused)."""
        self._lose(why)
        self._cancel_renewer()

    async def _renew_loop(self) -> None:
        while self.held:
            await asyncio.sleep(self.ttl / 3)
            try:
                await self.renew()
            except LeaseLostError:
                return
            except BusError as exc:
                if not exc.retriable:
                    raise
                if time.monotonic() - self._renewed_at >= self.ttl:
                    # A standby may have taken over meanwhile; the server would refuse
                    # our writes anyway, but stop trying to write at once.
                    self._lose(f"not renewed within the {self.ttl:g}s TTL ({exc})")
                    return
                log.info("lease renewal failed (%s); retrying", exc)

    def _cancel_renewer(self) -> None:
        if self._renewer is not None and self._renewer is not asyncio.current_task():
            self._renewer.cancel()
        self._renewer = None

    async def close(self) -> None:
        """Stop renewing without releasing (what a crash looks like to the others)."""
        task, self._renewer = self._renewer, None
        if task is not None and task is not asyncio.current_task():
            await cancel_and_wait(task)

    async def release(self) -> None:
        """Hand the lease back (a clean stop): a standby takes over within one poll."""
        await self.close()
        if not self.held:
            return
        self.held = False
        rec = LeaseRecord(holder=None, epoch=self.epoch, ttl=self.ttl,
                          at=format_time(time.time()))
        try:
            await self._publish(rec, self.seq)
        except BusError as exc:
            log.info("could not release %s (%s); it expires after %gs", self.subject, exc,
                     self.ttl)
