"""Messages of a hot core subscription handled as they are read, without nats-py's Msg.

nats-py hands every message through a `Msg` object, the subscription's
queue and a task that awaits the callback.  For the pipelined publishers'
ack inbox (one ack per record the projector writes: half of the messages
it reads) that is most of the cost of an ack.  `route(nc, sub, handler)`
makes `nc` call `handler(subject, data)` (raw bytes) at once for `sub`'s
messages that carry no headers; a message with headers (a status such as
503 "no responders") still takes nats-py's usual path to the
subscription's callback.  The handler must be quick and must not block:
it runs inside the connection's read loop.  It installs nothing when
nats-py's internals are not as expected (another version).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client
from nats.aio.subscription import Subscription

log = logging.getLogger("crr.bus.direct")

Handler = Callable[[bytes, bytes], None]
"""(subject, data) of one message, as read."""

_ROUTES = "_crr_direct_routes"


def route(nc: Client, sub: Subscription, handler: Handler) -> bool:
    """Handle `sub`'s header-less messages with `handler` as they are read; whether it did."""
    sid = getattr(sub, "_id", None)
    original = getattr(nc, "_process_msg", None)
    if not isinstance(sid, int) or original is None or not isinstance(nc.stats, dict):
        log.debug("nats-py's internals are not as expected: no direct route")
        return False
    routes: dict[int, Handler] | None = getattr(nc, _ROUTES, None)
    if routes is None:
        routes = {}
        setattr(nc, _ROUTES, routes)
        stats = nc.stats

        async def process_msg(sid: int, subject: bytes, reply: bytes, data: bytes,
                              headers: Any) -> None:
            handle = routes.get(sid) if routes else None
            if handle is None or headers:
                await original(sid, subject, reply, data, headers)
                return
            stats["in_msgs"] += 1
            stats["in_bytes"] += len(data)
            try:
                handle(subject, data)
            except Exception:  # as a callback's would, it must not end the read loop
                log.exception("handling a message on %r failed", subject)

        nc._process_msg = process_msg  # type: ignore[method-assign]
    routes[sid] = handler
    return True


def unroute(nc: Client, sub: Subscription) -> None:
    """Back to nats-py's usual path for `sub` (before unsubscribing it)."""
    routes: dict[int, Handler] | None = getattr(nc, _ROUTES, None)
    if routes is not None:
        routes.pop(getattr(sub, "_id", -1), None)
