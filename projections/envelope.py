"""What the fold consumes: one stored `CRR_EVENTS` message, as the bus delivered it.

The fold takes its notion of time only from `received_at` (the JetStream
server timestamp of the stored message), never from the payload or a clock,
so live projection and replay agree and reporter clock skew cannot make a
value fresh.
"""

from __future__ import annotations

import msgspec


class Envelope(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A stored event: its stream sequence, subject, server receive time and raw payload.

    `gc=False`: one is built per folded event, and it holds only an int, a float, a
    str and bytes (no cycle can go through it)."""

    seq: int
    """Sequence in `CRR_EVENTS`."""
    subject: str
    received_at: float
    """JetStream server timestamp of the stored message, seconds since the epoch."""
    data: bytes
    """The raw payload (JSON)."""
