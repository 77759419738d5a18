"""An ordered JetStream consumer's data messages handled as they are read.

nats-py delivers each message of an ordered push consumer through a `Msg`,
a reply-subject metadata parse, the subscription's queue and a task hop to
the callback.  `Direct` takes the data messages (reply
`$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>`)
straight from the connection's parser (`crr.bus.natspy.parser.route_full`) and keeps
nats-py's ordered-consumer bookkeeping exactly as nats-py would: the
expected consumer sequence (a gap is left to nats-py, which resets the
consumer), the last stream sequence, the delivered count and last reply
that flow control and idle heartbeats are checked against.  Control
messages (heartbeats, flow control), a message after a gap and a reply of
another form (a JetStream domain) take nats-py's usual path, in order:
while a message sits in the subscription's queue or its callback runs,
nothing is taken directly.

Flow control is answered by messages *handled* (`OrderedReader`'s
backpressure): a handler that returns an awaitable makes later messages
wait, and the server's flow-control request unanswered, until it is done.
They wait in a **backlog** of raw bytes (one buffer, `Backlog`), not as
nats-py `Msg`s in its queue: what the server sends ahead before it stalls
(its flow-control window, 32 MiB of messages) is then held in ~that many
bytes, instead of ~4 small Python objects per message — whose freed
memory stays in the process (pymalloc arenas pinned by the few long-lived
objects allocated among them), so an overloaded reader's RSS kept the
high-water mark of every backlog.  A stalled server's idle heartbeats
(which nats-py answers at once, letting another window in every heartbeat)
and nats-py's periodic flow-control check (which counts the backlog as
delivered) answer only once the messages before them are handled.  Installs
nothing when nats-py's internals are not as expected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from nats.js.api import Header

from crr.bus import natspy
from crr.bus.natspy import headers as nats_headers
from crr.bus.natspy import parser as direct

log = logging.getLogger("crr.bus.ordered")

Deliver = Callable[[int, float, str, bytes, dict[str, str] | None, int],
                   Awaitable[None] | None]
"""(stream seq, server time, subject, data, headers, pending) of one data message."""


_STALLED = Header.CONSUMER_STALLED.encode() + b":"

FLOW_WINDOW = 32 * 1024 * 1024
"""What nats-server sends a push consumer ahead of its flow-control answers, at most
(`JsFlowControlMaxPending`; it starts at 1/16 of it and doubles per answer): the bound of
`Backlog`, whose entries are smaller than the messages as the server counts them."""

DRAIN_TURN = 256
"""Backlogged messages handled per turn of the event loop (the connection's read loop,
and with it the acks of the reader's own publishes, runs between turns)."""


def _ordered_shape(psub: Any) -> str | None:
    """Whether `psub` is a nats-py 2.x ordered push subscription `Direct` can drive."""
    sub = psub._sub
    jsi = getattr(sub, "_jsi", None)
    if jsi is None:
        return "the subscription has no JetStream state (_jsi)"
    missing = [a for a in natspy.JSI_NAMES if not hasattr(jsi, a)]
    if missing:
        return f"nats-py's JetStream subscription state has no {', '.join(missing)}"
    if not jsi._ordered:
        return "not an ordered consumer"
    if not isinstance(getattr(sub, "_id", None), int) or not hasattr(sub, "_pending_queue"):
        return "the subscription has no integer _id or no _pending_queue"
    return None


class Backlog:
    """Data messages waiting for a handler, as bytes in one buffer (see the module doc).

    Each entry: a fixed head (stream seq, server time in ns, pending, and the
    lengths of subject, header block and data), then those bytes."""

    _HEAD = struct.Struct("<QQQIiI")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._at = 0
        self.count = 0
        """Messages waiting."""
        self.peak = 0
        """The most bytes held at once (since this backlog was made)."""

    def __len__(self) -> int:
        return self.count

    @property
    def size(self) -> int:
        """Bytes held (waiting messages, and taken ones until the buffer is compacted)."""
        return len(self._buf)

    def add(self, seq: int, ts_ns: int, pending: int, subject: bytes,  # noqa: PLR0917 - a message's fields
            headers: bytes | None, data: bytes) -> None:
        """Keep one message (its header block raw: parsed when it is taken)."""
        buf = self._buf
        buf += self._HEAD.pack(seq, ts_ns, pending, len(subject),
                               -1 if headers is None else len(headers), len(data))
        buf += subject
        if headers is not None:
            buf += headers
        buf += data
        self.count += 1
        self.peak = max(self.peak, len(buf))

    def take(self) -> tuple[int, int, int, bytes, bytes | None, bytes]:
        """The oldest message: (seq, ts_ns, pending, subject, header block, data)."""
        buf, at = self._buf, self._at
        seq, ts, pending, ls, lh, ld = self._HEAD.unpack_from(buf, at)
        at += self._HEAD.size
        subject = bytes(buf[at:at + ls])
        at += ls
        headers = None
        if lh >= 0:
            headers = bytes(buf[at:at + lh])
            at += lh
        data = bytes(buf[at:at + ld])
        self._at = at + ld
        self.count -= 1
        if not self.count:  # empty: let the buffer go (its memory back to the allocator)
            self._buf, self._at = bytearray(), 0
        return seq, ts, pending, subject, headers, data

    def compact(self) -> None:
        """Drop the bytes of the messages taken (a bytearray drops a prefix in place)."""
        if self._at:
            del self._buf[:self._at]
            self._at = 0

    def clear(self) -> None:
        """Forget every waiting message."""
        self._buf, self._at, self.count = bytearray(), 0, 0


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
        """A handler's wait, then the backlog's handling, still running: later data
        messages join the backlog."""
        self.stalls = 0
        """Idle heartbeats of a stalled server answered only once the messages before
        them were handled (`_on_stalled`)."""
        self.backlog = Backlog()
        """Data messages received while a handler waits, in order (see the module doc)."""
        self._sid = -1
        self._stopped = False
        self._fc_task: asyncio.Future[None] | None = None
        sub: Any = getattr(psub, "_sub", None)
        jsi: Any = getattr(sub, "_jsi", None)
        self._sub: Any = sub
        self._jsi: Any = jsi
        self.active = natspy.usable("ordered_consumer", psub, _ordered_shape)
        if self.active:  # (the paths it stands on, each checked and announced itself)
            self.active = nats_headers.usable(nc) and direct.reader(nc) is not None
        if not self.active:
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
        # nats-py's periodic flow-control check counts messages received and not in its
        # queue as delivered: the backlog's would count. Ours counts messages handled.
        if jsi._fctask is not None:
            jsi._fctask.cancel()
        jsi._fctask = self._fc_task = asyncio.ensure_future(self._check_flow_control())
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
        for task in (self.blocked, self._fc_task):
            if task is not None:
                task.cancel()
        self.blocked = self._fc_task = None
        self.backlog.clear()

    def _on_raw(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> bool:
        """A message as read: handled or kept in the backlog (True), or left to nats-py's
        path (False)."""
        if not reply and headers is not None and _STALLED in headers:
            return self._on_stalled(headers)
        if self._busy or not reply.startswith(b"$JS.ACK.") or self._sub._pending_queue.qsize():
            return False
        t = reply.split(b".")
        if len(t) != 9:
            return False  # (another form: nats-py's path)
        jsi = self._jsi
        dseq = int(t[6])
        if dseq != jsi._dseq:
            return False  # a gap: nats-py's path resets the consumer
        if headers is not None and not nats_headers.plain(headers):
            return False
        sseq = int(t[5])
        self._sub._received += 1
        jsi._active = True
        jsi._dseq = dseq + 1
        jsi._sseq = sseq
        jsi.track_sequences(reply.decode())
        self.direct += 1
        if self.blocked is not None:  # a handler waits: in order, after what waits already
            self.backlog.add(sseq, int(t[7]), int(t[8]), subject, headers, data)
            return True
        self._deliver_now(sseq, int(t[7]), int(t[8]), subject, headers, data)
        return True

    def _on_stalled(self, headers: bytes) -> bool:
        """An idle heartbeat saying the server waits for a flow-control answer: nats-py
        would answer it at once; while received messages wait unhandled, it is answered
        once they are handled instead (as a flow-control request is), so the server does
        not send another window meanwhile.  Otherwise (nothing waits, or the heartbeat
        shows a gap: a reset) nats-py's path takes it."""
        jsi = self._jsi
        if self.handled >= jsi._fciseq:
            return False
        fields = nats_headers.parse_lines(headers.partition(b"\r\n")[2])
        reply = fields.get(Header.CONSUMER_STALLED)
        last = fields.get(Header.LAST_CONSUMER)
        cmeta = jsi._cmeta
        if not reply or not cmeta or last != cmeta.split(".")[6]:
            return False
        jsi._active = True
        if not jsi._fcr:
            jsi._fcd = jsi._fciseq
        jsi._fcr = reply
        self.stalls += 1
        return True

    def _deliver_now(self, sseq: int, ts_ns: int, pending: int,  # noqa: PLR0917 - a message's fields
                     subject: bytes, headers: bytes | None, data: bytes) -> None:
        """Hand one data message to `deliver`; when it returns an awaitable, wait for it
        (`blocked`) and then handle the backlog."""
        hdrs = None if headers is None else nats_headers.parse_headers(headers)
        try:
            out = self._deliver(sseq, ts_ns / 1e9, subject.decode(), data, hdrs, pending)
        except Exception:
            self.handled += 1  # (as nats-py's callback path counts it; the parser logs it)
            raise
        if out is None:
            self.handled += 1
        else:
            self.blocked = asyncio.ensure_future(self._until_done(out))

    async def _until_done(self, out: Awaitable[None]) -> None:
        """Wait for the handler, then handle the backlog in order (`DRAIN_TURN` a turn),
        waiting again whenever the handler asks to; `blocked` until it is empty."""
        try:
            await self._wait_for(out)
            backlog = self.backlog
            turn = 0
            while backlog:
                sseq, ts, pending, subject, headers, data = backlog.take()
                hdrs = None if headers is None else nats_headers.parse_headers(headers)
                try:
                    waiting = self._deliver(sseq, ts / 1e9, subject.decode(), data, hdrs,
                                            pending)
                except Exception:  # as a callback's would, it must not end the handling
                    log.exception("handling a message on %r failed", subject)
                    waiting = None
                if waiting is not None:
                    backlog.compact()
                    await self._wait_for(waiting)
                    turn = 0
                    continue
                self.handled += 1
                turn += 1
                if turn >= DRAIN_TURN and backlog:
                    turn = 0
                    backlog.compact()
                    await self.answer_flow_control()
                    await asyncio.sleep(0)
        finally:
            self.blocked = None
        await self.answer_flow_control()

    async def drained(self) -> None:
        """Wait until a handler's wait and the backlog behind it are done (at once when
        nothing waits)."""
        while self.blocked is not None:
            await asyncio.shield(self.blocked)

    async def _wait_for(self, out: Awaitable[None]) -> None:
        """A handler's wait; then its message counts as handled (failed or not: logged)."""
        try:
            await out
        except Exception:  # as a callback's would, it must not stop the backlog
            log.exception("a handler's wait failed")
        finally:
            self.handled += 1

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

    async def _check_flow_control(self) -> None:
        """nats-py's `check_flow_control_response` (answer a request once the messages
        before it are handled), every 0.25 s as there, by messages handled."""
        while not self._nc.is_closed:
            with contextlib.suppress(Exception):  # as nats-py's: the next round retries
                await self.answer_flow_control()
            await asyncio.sleep(0.25)

    async def answer_flow_control(self) -> None:
        """Answer a pending flow-control request the handled messages now cover."""
        jsi = self._jsi
        if jsi._fcr and self.handled >= jsi._fcd:
            reply, jsi._fcr = jsi._fcr, None
            await self._nc.publish(reply)
