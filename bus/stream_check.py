"""Did a stream go backwards?  The check readers run after every reconnect.

A nats-server killed with SIGKILL (default `sync_interval`: the store is
flushed every couple of minutes, not per message) can come back without its
last acknowledged messages and hand their sequence numbers to new ones.  A
consumer that resumes from "last delivered + 1" then skips the new messages
below its old position.  Whoever keeps a position (the projector on
CRR_EVENTS and CRR_SNAPSHOT, the scheduler view on CRR_SNAPSHOT) remembers
the last message it handled and asks, after a reconnect, whether the stream
still holds it; if not, it rebuilds from the stream.  `lost` is that check
and `Generations` the guard that drops a replaced consumer's deliveries, for
both (`crr.bus.follower.Follower`, `crr.projector.service.Projector`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import nats.js.errors
from nats.aio.client import Client

from crr.bus.errors import NATS_FAILURES
from crr.bus.ordered import StoredMessage
from crr.bus.retry import PUBLISH


async def still_holds(nc: Client, stream: str, seq: int, subject: str, data: bytes, *,
                      give_up_after: float = 60.0) -> bool:
    """Whether `stream` still holds the message (`seq`, `subject`, `data`).

    False when the stream's last sequence is below `seq` or another message
    sits at `seq`.  A message no longer stored (superseded on a compacted
    stream, aged out) counts as held: what replaced it comes after `seq`.
    Retries while the server is unreachable; raises its last error after
    `give_up_after` seconds.
    """
    js = nc.jetstream(timeout=2.0)
    async for attempt in PUBLISH.retrying(seconds=give_up_after):
        with attempt:
            info = await js.stream_info(stream)
            if info.state.last_seq < seq:
                return False
            try:
                stored = await js.get_msg(stream, seq=seq)
            except nats.js.errors.NotFoundError:
                return True
            return stored.subject == subject and (stored.data or b"") == data
    raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover


Seen = tuple[int, str, bytes]
"""(seq, subject, data) of the last message a reader handled on a stream."""


async def lost(nc: Client, seen: dict[str, Seen | None], *, who: str,
               log: logging.Logger) -> list[str] | None:
    """The regression check after a reconnect, for every stream a reader keeps a
    position on: `stream -> last message handled` (None: nothing yet).

    Returns what the server no longer holds (`"<stream> seq N"`; empty: every stream
    still holds its message), or None when the check could not be made (logged as a
    warning; the reader carries on).  Used by `crr.bus.follower.Follower` and the projector.
    """
    out: list[str] = []
    try:
        for stream, last in seen.items():
            if last is not None and not await still_holds(nc, stream, *last):
                out.append(f"{stream} seq {last[0]}")
    except NATS_FAILURES as exc:
        log.warning("%s: cannot check %s after a reconnect: %r", who, ", ".join(seen), exc)
        return None
    if out:
        log.warning("%s: the server lost acknowledged messages (%s no longer stored)",
                    who, ", ".join(out))
    return out


H = TypeVar("H")


class Generations:
    """Which consumer of a reader is the current one: deliveries of a replaced (stopped,
    or being stopped) consumer are dropped.  `guard(handler)` for each new consumer;
    `retire()` when the current one is abandoned without a successor yet."""

    def __init__(self) -> None:
        self.current = 0

    def guard(self, handler: Callable[[StoredMessage], H | None],
              ) -> Callable[[StoredMessage], H | None]:
        """`handler` for a new consumer, which becomes the current one."""
        self.current += 1
        generation = self.current

        def guarded(m: StoredMessage) -> H | None:
            return handler(m) if generation == self.current else None

        return guarded

    def retire(self) -> None:
        """No consumer is current (every delivery is dropped until the next `guard`)."""
        self.current += 1
