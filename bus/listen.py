"""Core NATS subscriptions in crr's terms: a handler of (subject, payload), and a closer.

(JetStream reads go through `crr.bus.ordered`; this is for plain subjects a service
only listens to, e.g. the partitions' status writes a projector follows.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from crr.bus.connection import Connection
from crr.bus.errors import nats_errors
from crr.schemas.errors import BusError

Handler = Callable[[str, bytes], Awaitable[None]]
"""Called with each message's subject and payload."""


class Listening:
    """One core subscription; `close()` ends it (a connection already gone is fine)."""

    def __init__(self, sub: Subscription) -> None:
        self._sub: Subscription | None = sub

    async def close(self) -> None:
        """Unsubscribe (idempotent; a closed or failing connection is not an error)."""
        if self._sub is not None:
            with contextlib.suppress(BusError), nats_errors():
                await self._sub.unsubscribe()
            self._sub = None


async def listen(nc: Connection, subject: str, handler: Handler) -> Listening:
    """Subscribe `handler` to `subject` (wildcards allowed); NATS errors as crr's tree."""

    async def on_message(msg: Msg) -> None:
        await handler(msg.subject, msg.data)

    with nats_errors():
        sub = await nc.subscribe(subject, cb=on_message)
    return Listening(sub)
