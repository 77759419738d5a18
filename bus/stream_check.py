"""Did a stream go backwards?  The check readers run after every reconnect.

A nats-server killed with SIGKILL (default `sync_interval`: the store is
flushed every couple of minutes, not per message) can come back without its
last acknowledged messages and hand their sequence numbers to new ones.  A
consumer that resumes from "last delivered + 1" then skips the new messages
below its old position.  Whoever keeps a position (the projector on
CRR_EVENTS and CRR_SNAPSHOT, the scheduler view on CRR_SNAPSHOT) remembers
the last message it handled and asks, after a reconnect, whether the stream
still holds it; if not, it rebuilds from the stream.
"""

from __future__ import annotations

import nats.errors
import nats.js.errors
import tenacity
from nats.aio.client import Client


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
    async for attempt in tenacity.AsyncRetrying(
        stop=tenacity.stop_after_delay(give_up_after),
        wait=tenacity.wait_exponential(multiplier=0.05, max=2.0) + tenacity.wait_random(0, 0.1),
        retry=tenacity.retry_if_exception_type((nats.errors.Error, TimeoutError))
        & tenacity.retry_if_not_exception_type(nats.js.errors.NotFoundError),
        reraise=True,
    ):
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
