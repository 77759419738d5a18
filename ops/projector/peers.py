"""The projector among others: the HA lease (write only while holding it, else follow as
a warm standby) and, partitioned, the other partitions' status writes.

A partition (`partition=k` of N) consumes only its own subjects, so its `last_seq` is
the last of *its* events; its `covered_seq` extends that over the other partitions'
events (`crr.projector.position`).  An idle partition's `covered_seq` only moves when it
writes its status, so it hears its peers' (`Peers`) and writes its own when one is
ahead.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from crr.bus.connection import Connection
from crr.bus.errors import nats_errors
from crr.bus.listen import Listening, listen
from crr.bus.retry import TAKEOVER_READ
from crr.projector.lease import Lease
from crr.projector.live_fold import LiveFold
from crr.projector.output import Output
from crr.projector.position import Position
from crr.schemas.codec import DECODERS
from crr.schemas.snapshot import ProjectorStatus
from crr.schemas.subjects import SNAPSHOT_STREAM, STATUS_PARTITIONS, status_subject

log = logging.getLogger("crr.projector")

_status_decoder: msgspec.json.Decoder[ProjectorStatus] = DECODERS[ProjectorStatus]


class Peers:
    """Partitioned: follows the other partitions' status writes (core NATS).

    On its status interval alone, a reader waiting for another partition's
    event would wait up to that interval.  So when a peer's status says it
    covers more than this one, and nothing of this partition's is pending,
    this one writes its status now (notifications arriving meanwhile are
    coalesced into that one write; a partition never reacts to a peer that
    is not ahead, so two partitions do not echo each other)."""

    def __init__(self, nc: Connection, pos: Position, *, partition: int | None,
                 partitions: int | None, wake: asyncio.Event) -> None:
        self._nc = nc
        self._pos = pos
        self._partition = partition
        self._partitions = partitions
        self._wake = wake
        self._sub: Listening | None = None
        self.status_due = False
        """Write the status now: another partition's status moved past this one's."""

    async def hear(self) -> None:
        """Start following (nothing to follow unpartitioned)."""
        if self._partition is None or self._sub is not None:
            return
        own = status_subject(self._partition)

        async def on_status(subject: str, data: bytes) -> None:
            if subject == own or self._pos.pending:
                return
            try:
                peer = _status_decoder.decode(data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                return  # not ours to judge; readers log undecodable records
            if peer.partitions == self._partitions and peer.covered_seq > self._pos.covered:
                self.status_due = True
                self._wake.set()

        self._sub = await listen(self._nc, STATUS_PARTITIONS, on_status)

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.close()
            self._sub = None


async def take_lease(lease: Lease, stop: asyncio.Event, *, who: str, fold: LiveFold,
                     output: Output, wake: asyncio.Event) -> bool:
    """Standby until the lease is ours, then write what differs from CRR_SNAPSHOT now;
    False when `stop` came first."""
    lease.on_lost = wake.set
    log.info("projector %s: standby for %s", who, lease.subject)
    if not await lease.acquire(stop):
        return False
    # The previous writer may have written anything: reload, then rewrite the differences.
    # (Taking over often happens while the cluster elects a new stream leader: retry.)
    async for attempt in TAKEOVER_READ.retrying(
            seconds=60, log=log, what=f"projector {who}: cannot read "
                                      f"{SNAPSHOT_STREAM} after taking the lease"):
        with attempt, nats_errors():
            await output.load_written(digest=True, afresh=True)
    fold.rewrite_all()
    wake.set()
    return True
