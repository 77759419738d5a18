"""An ordered JetStream consumer's data messages handled as they are read.

nats-py delivers each message of an ordered push consumer through a `Msg`,
a reply-subject metadata parse, the subscription's queue and a task hop to
the callback.  `Direct` takes the data messages (reply
`$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>`)
straight from the connection's parser (`bus.direct.route_full`) and keeps
nats-py's ordered-consumer bookkeeping exactly as nats-py would: the
expected consumer sequence (a gap is left to nats-py, which resets the
consumer), the last stream sequence, the delivered count and last reply
that flow control and idle heartbeats are checked against.  Control
messages (heartbeats, flow control), a message after a gap, a reply of
another form (a JetStream domain) and anything while a handler waits take
nats-py's usual path, in order: while a message sits in the subscription's
queue or its callback runs, nothing is taken directly.

Flow control is answered by messages *handled* (`OrderedReader`'s
backpressure): a handler that returns an awaitable makes later messages
wait in nats-py's queue, and the server's flow-control request unanswered,
until it is done.  Installs nothing when nats-py's internals are not as
expected.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from bus import direct, nats_headers

log = logging.getLogger("crr.bus.ordered")

Deliver = Callable[[int, float, str, bytes, dict[str, str] | None, int],
                   Awaitable[None] | None]
"""(stream seq, server time, subject, data, headers, pending) of one data message."""

_JSI_NEEDED = ("_dseq", "_sseq", "_active", "track_sequences", "reset_ordered_consumer",
               "get_js_delivered", "_fcr", "_fcd", "_ordered")
"""What nats-py 2.x's `JetStreamContext._JSI` holds and `Direct` keeps as nats-py would."""


class Direct:
    """Routes one ordered consumer's data messages to `deliver` as they are read."""

    def __init__(self, nc: Any, psub: Any, deliver: Deliver) -> None:
        self._nc = nc
        self._psub = psub
        self._deliver = deliver
        self.handled = 0
        """Data messages handled (flow control is answered by this count)."""
        self.direct = 0
        """Of them, taken straight from the parser."""
        self._busy = False
        """nats-py's callback path is handling a message."""
        self.blocked: asyncio.Task[None] | None = None
        """A handler's wait still running: later messages take the queue."""
        self._sid = -1
        self._stopped = False
        sub: Any = getattr(psub, "_sub", None)
        jsi: Any = getattr(sub, "_jsi", None)
        self._sub: Any = sub
        self._jsi: Any = jsi
        self.active = (jsi is not None and all(hasattr(jsi, a) for a in _JSI_NEEDED)
                       and bool(jsi._ordered) and isinstance(getattr(sub, "_id", None), int)
                       and hasattr(sub, "_pending_queue")
                       and nats_headers.usable() and direct.reader(nc) is not None)
        if not self.active:
            log.warning("unexpected nats-py internals: ordered consumer messages take "
                        "nats-py's path")
            return
        jsi.get_js_delivered = lambda: self.handled
        original_reset = jsi.reset_ordered_consumer

        async def reset(sseq: int | None) -> bool:
            # The consumer moves to a new subscription id: so does the route.
            direct.unroute_sid(self._nc, self._sid)
            try:
                return bool(await original_reset(sseq))
            finally:
                self._route()

        jsi.reset_ordered_consumer = reset
        self._route()

    def _route(self) -> None:
        sub = self._sub
        if sub is None or self._stopped or self._nc.is_closed:
            return
        self._sid = sub._id
        direct.route_full(self._nc, self._sid, self._on_raw)

    def stop(self) -> None:
        """No route any more (before unsubscribing; a reset under way adds none)."""
        self._stopped = True
        direct.unroute_sid(self._nc, self._sid)

    def _on_raw(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> bool:
        """A message as read: handled (True), or left to nats-py's path (False)."""
        if (self._busy or self.blocked is not None or not reply.startswith(b"$JS.ACK.")
                or self._sub._pending_queue.qsize()):
            return False
        t = reply.split(b".")
        if len(t) != 9:
            return False  # (another form: nats-py's path)
        jsi = self._jsi
        dseq = int(t[6])
        if dseq != jsi._dseq:
            return False  # a gap: nats-py's path resets the consumer
        hdrs: dict[str, str] | None = None
        if headers is not None:
            if not nats_headers.plain(headers):
                return False
            hdrs = nats_headers.parse_headers(headers)
        sseq = int(t[5])
        self._sub._received += 1
        jsi._active = True
        jsi._dseq = dseq + 1
        jsi._sseq = sseq
        jsi.track_sequences(reply.decode())
        self.direct += 1
        try:
            out = self._deliver(sseq, int(t[7]) / 1e9, subject.decode(), data, hdrs, int(t[8]))
        except Exception:
            self.handled += 1  # (as nats-py's callback path counts it; the parser logs it)
            raise
        if out is None:
            self.handled += 1
        else:
            self.blocked = asyncio.ensure_future(self._until_done(out))
        return True

    async def _until_done(self, out: Awaitable[None]) -> None:
        try:
            await out
        finally:
            self.handled += 1
            self.blocked = None
            await self.answer_flow_control()

    async def before_callback(self) -> None:
        """nats-py's callback path begins a message: after the handler's wait, if any."""
        self._busy = True
        if self.blocked is not None:
            await asyncio.shield(self.blocked)

    async def after_callback(self) -> None:
        """nats-py's callback path finished a message."""
        self.handled += 1
        self._busy = False
        await self.answer_flow_control()

    async def answer_flow_control(self) -> None:
        """Answer a pending flow-control request the handled messages now cover."""
        jsi = self._jsi
        if jsi._fcr and self.handled >= jsi._fcd:
            reply, jsi._fcr = jsi._fcr, None
            await self._nc.publish(reply)
