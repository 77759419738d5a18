"""The projector's watermark: the latest time T such that it had folded every event
`CRR_EVENTS` stored before T (docs/contract.md, "Freshness at the watermark").

Events are folded in stream order, so while the projector is behind (events pending in
the stream or buffered in its reader) every event stored before the last one folded has
been folded: the watermark is that event's stored time.  Caught up, it is the round's
tick, so it advances on an idle stream too.  While the NATS connection is down it does
not advance; after a reconnect it stays where it was until one longest `interval +
grace` of the catalog has passed (reporters whose reports could not be stored during a
server outage get one interval to report again), then follows the rules above.

It never goes back, and never passes the tick.  The projector expires at it and writes it
into its status (`watermark`, `watermark_ts`), so `crr replay --verify` expires at the
same time.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Watermark:
    """One projector's watermark (see the module doc); `advance` once per round."""

    at: float | None = None
    """The watermark (None: not set yet: the first round sets it)."""
    resume_at: float | None = None
    """After a reconnect: the tick from which it may advance again (None: it may)."""

    def reconnected(self, tick: float, wait: float) -> None:
        """The NATS connection came back at `tick`: hold for `wait` seconds (the catalog's
        longest `interval + grace`)."""
        self.resume_at = max(self.resume_at or 0.0, tick + max(0.0, wait))

    def advance(self, tick: float, *, connected: bool, caught_up: bool,
                last_stored: float | None) -> float:
        """The watermark at this round's `tick`: `last_stored` is the stored time of the last
        event folded (None: none yet), `caught_up` whether nothing is pending or buffered."""
        held = not connected or (self.resume_at is not None and tick < self.resume_at)
        if self.at is not None and held:
            return self.at
        if not held:
            self.resume_at = None
        candidate = tick if caught_up or last_stored is None else min(last_stored, tick)
        self.at = candidate if self.at is None else max(self.at, candidate)
        return self.at
