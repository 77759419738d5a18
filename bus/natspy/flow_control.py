"""Flow control answered by messages handled, on nats-py's own ordered consumer.

With a callback, nats-py answers a push consumer's flow-control request as soon as the
messages before it are *received* (queued), so the server never slows down: a handler
that waits makes the backlog pile up in the subscription's queue.  `HeldFlowControl`
makes nats-py count messages *handled* instead, and answers a request once they cover
it, so the server waits.  This is the `flow_control` fast path of `crr.bus.natspy`; when it
is off, nats-py answers as it always does (the backlog then waits in its queue, within
the subscription's pending limits).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nats.aio.client import Client

from crr.bus import natspy


def _shape(psub: Any) -> str | None:
    jsi = getattr(psub._sub, "_jsi", None)
    if jsi is None:
        return "the subscription has no JetStream state (_jsi)"
    missing = [a for a in ("get_js_delivered", "_fcr", "_fcd") if not hasattr(jsi, a)]
    return f"nats-py's JetStream subscription state has no {', '.join(missing)}" if missing \
        else None


class HeldFlowControl:
    """Flow control of `psub` (a nats-py JetStream push subscription) by `handled()`."""

    def __init__(self, nc: Client, psub: Any, handled: Callable[[], int]) -> None:
        self._nc = nc
        self._jsi: Any = None
        if natspy.usable("flow_control", psub, _shape):
            self._jsi = psub._sub._jsi
            self._jsi.get_js_delivered = handled

    @property
    def active(self) -> bool:
        """Whether nats-py counts handled messages (else its own received count)."""
        return self._jsi is not None

    async def handled(self, count: int) -> None:
        """`count` messages are handled now: answer a flow-control request they cover."""
        jsi = self._jsi
        if jsi is not None and jsi._fcr and count >= jsi._fcd:
            reply, jsi._fcr = jsi._fcr, None
            await self._nc.publish(reply)
