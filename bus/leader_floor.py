"""The newest record the stream leader holds: what a fresh load must reach.

JetStream places an ephemeral (R1) consumer on any current peer of a
replicated stream.  A replica that rejoined after a partition is a peer
again before it has caught up, and a consumer placed there delivers that
replica's copy: a last-per-subject load from it completes ("pending 0") with
records as old as the partition.  `STREAM.MSG.GET` is answered by the stream
leader only (a `DIRECT.GET` may be answered by any replica), so the leader's
newest sequence of the filter, read *before* the consumer is created, is a
floor every complete load must reach.
"""

from __future__ import annotations

import logging

import nats.js.errors
from nats.aio.client import Client

from crr.bus.errors import NATS_FAILURES

log = logging.getLogger("crr.bus.leader_floor")


async def leader_last_seq(nc: Client, stream: str, subject: str,
                          timeout: float = 2.0) -> int | None:
    """The stream sequence of the newest message on `subject` (wildcards allowed) as the
    stream leader holds it; 0 when it holds none; None when it could not be asked (no
    leader during an election, a timeout): the caller then goes without a floor."""
    js = nc.jetstream(timeout=timeout)
    try:
        msg = await js.get_last_msg(stream, subject)
    except nats.js.errors.NotFoundError:
        return 0
    except NATS_FAILURES as exc:
        log.info("%s: could not ask the stream leader for the newest %s (%s); loading "
                 "without that check", stream, subject, exc)
        return None
    return msg.seq or 0


class LeaderFloor:
    """The sequence a load must have handled before it counts as complete.

    `floor` is the leader's newest sequence when the load started (None: unknown,
    no wait).  `reached(seq)` says whether a load positioned at `seq` is complete.
    `lower(new)` takes a newer answer only if it is lower: the floor's record was
    deleted (a purge) and will never be delivered; a higher answer is a record
    written after the start, which the load need not wait for.
    """

    def __init__(self, floor: int | None) -> None:
        self.floor = floor

    @classmethod
    async def ask(cls, nc: Client, stream: str, subject: str) -> LeaderFloor:
        return cls(await leader_last_seq(nc, stream, subject))

    def reached(self, seq: int) -> bool:
        return self.floor is None or seq >= self.floor

    def lower(self, new: int | None) -> None:
        if new is not None and self.floor is not None and new < self.floor:
            self.floor = new

    def describe(self, seq: int) -> str:
        return f"this server's copy is at seq {seq}, the stream leader's was at {self.floor}"
