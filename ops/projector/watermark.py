"""The projector's watermark: the latest time T such that it had folded every event
`CRR_EVENTS` stored before T (docs/contract.md, "Freshness at the watermark").

Events are folded in stream order, so while the projector is behind (events pending in
the stream or buffered in its reader) every event stored before the last one folded has
been folded: the watermark is that event's stored time.  Caught up, it is the round's
tick, so it advances on an idle stream too.  While the NATS connection is down it does
not advance; after a reconnect it stays where it was until one longest `interval +
grace` of the catalog has passed since the first event stored after the reconnect
(reporters whose reports could not be stored during a server outage get one interval to
report again, counted from when the stream takes reports again: a restarted server's
JetStream may need seconds), at most the catalog's `outage_hold` after the reconnect;
then it follows the rules above.

It never goes back, and never passes the tick.  The projector expires at it and writes it
into its status (`watermark`, `watermark_ts`), so `crr replay --verify` expires at the
same time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from crr.projections.freshness import status_watermark
from crr.projector.checkpoint_read import RawRecords
from crr.schemas.codec import decode
from crr.schemas.errors import PayloadError
from crr.schemas.snapshot import ProjectorStatus
from crr.schemas.subjects import status_subject

WRITES_BACK: Final = 5.0
"""Seconds after a reconnect (after the first event stored since, once there is one) for
which the projector writes no record (`Watermark.holds_writes`), at most one longest
`interval + grace`: a reporter cut off by the same outage has stored its buffered report
again by then (clients reconnect within `crr.bus.retry.RECONNECT`'s 2 s cap, jittered
25%; the outbox retries within `PUBLISH`'s 2 s)."""


@dataclass
class Watermark:
    """One projector's watermark (see the module doc); `advance` once per round."""

    at: float | None = None
    """The watermark (None: not set yet: the first round sets it)."""
    resume_at: float | None = None
    """After a reconnect: the tick from which it may advance again (None: it may)."""

    reconnect_at: float | None = None
    """After a reconnect, until an event stored after it is folded: when it came back."""
    wait: float = 0.0
    """The hold after the first event stored after a reconnect."""
    writes_from: float | None = None
    """After a reconnect: the tick from which records are written again (`holds_writes`)."""

    def reconnected(self, tick: float, wait: float, cap: float = 0.0) -> None:
        """The NATS connection came back at `tick`: hold until `wait` seconds (the catalog's
        longest `interval + grace`) after the first event stored since, at most `cap`
        (the catalog's `outage_hold`) or `wait` after `tick`, whichever is longer."""
        if self.reconnect_at is None:  # (the listener and a round may both say so)
            self.reconnect_at, self.wait = tick, 0.0
        self.wait = max(self.wait, wait)
        self.writes_from = max(self.writes_from or 0.0, tick + min(self.wait, WRITES_BACK))
        self.resume_at = max(self.resume_at or 0.0, tick + max(self.wait, cap))

    cut_off: bool = False
    """A round saw the connection down (and none has seen it back yet)."""

    def holds_writes(self, tick: float) -> bool:
        """Whether the projector writes no record at `tick`: cut off, or for `WRITES_BACK`
        seconds after a reconnect.  The fold expires up to each event's stored
        time (`crr.projections.fold.apply`), so the first reports stored after a server
        outage mark every value stale whose reporter's own report, delayed by the outage
        too, has not been stored yet; written then, they would flap stale → fresh.  Held
        until one longest `interval + grace` after the first event stored since, the
        records written say what the reporters said once each had its
        chance to report again: a value whose reporter did not is stale, honestly.  With no
        event stored after the reconnect, the hold ends one `interval + grace` after it."""
        if self.writes_from is not None and tick >= self.writes_from and (
                self.reconnect_at is None):
            self.writes_from = None
        return self.cut_off or (self.writes_from is not None and tick < self.writes_from)

    def write_now(self) -> None:
        """Records must go out now whatever the hold (a rebuild after a stream went
        backwards rewrites what CRR_SNAPSHOT lost: readers have nothing meanwhile)."""
        self.writes_from = None

    def advance(self, tick: float, *, connected: bool, caught_up: bool,
                last_stored: float | None, reconnect_wait: float = 0.0,
                reconnect_cap: float = 0.0) -> float:
        """The watermark at this round's `tick`: `last_stored` is the stored time of the last
        event folded (None: none yet), `caught_up` whether nothing is pending or buffered.
        The first round that finds the connection back after one that found it down holds
        for `reconnect_wait` itself (a round may run before the reconnect listener does)."""
        if not connected:
            self.cut_off = True
        elif self.cut_off:
            self.cut_off = False
            self.reconnected(tick, reconnect_wait, reconnect_cap)
        if (self.reconnect_at is not None and self.resume_at is not None
                and last_stored is not None and last_stored >= self.reconnect_at):
            # The stream takes reports again: one interval + grace from now on.
            self.resume_at = min(self.resume_at, last_stored + self.wait)
            self.writes_from = max(self.writes_from or 0.0,
                                   last_stored + min(self.wait, WRITES_BACK))
            self.reconnect_at = None
        held = not connected or (self.resume_at is not None and tick < self.resume_at)
        if self.at is not None and held:
            return self.at
        if not held:
            self.resume_at = self.reconnect_at = None
        candidate = tick if caught_up or last_stored is None else min(last_stored, tick)
        self.at = candidate if self.at is None else max(self.at, candidate)
        return self.at


def previous_watermark(raw: RawRecords, partition: int | None) -> float | None:
    """The watermark of the status CRR_SNAPSHOT holds for this projector (None: none, or
    unreadable).  A rebuilding projector's status carries it: readers keep the previous
    records until the rebuild is done, and hold at the watermark they were written at."""
    found = raw.get(status_subject(partition))
    if found is None or not found[1]:
        return None
    try:
        at = status_watermark(decode(found[1], ProjectorStatus))
    except PayloadError:
        return None
    return at if math.isfinite(at) else None
