"""Ordered consumers over crr's streams: cold-start by last-per-subject, then live.

A reader (the projector on CRR_EVENTS, the scheduler view on CRR_SNAPSHOT)
subscribes once with `DeliverLastPerSubject` and keeps that subscription for
live changes.  `ready` is set only once the initial load is complete — never
treat "not loaded yet" as "absent".  nats-py's ordered consumer resets itself
from the last stream sequence after a gap or a server restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from enum import StrEnum

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import ConsumerConfig, DeliverPolicy

from crr.bus import tracing
from crr.bus.errors import nats_errors
from crr.bus.natspy.flow_control import HeldFlowControl
from crr.bus.natspy.ordered_consumer import Direct
from crr.schemas.errors import CrrTimeoutError

log = logging.getLogger("crr.bus.ordered")


class StoredMessage(msgspec.Struct, frozen=True, gc=False):
    """A message as the stream stored it: sequence, server time, subject, headers, data.

    A frozen msgspec Struct rather than a frozen dataclass: one is built per
    delivered message, and this is ~10x cheaper to construct (no cycles can
    go through it, hence `gc=False`).
    """

    seq: int
    time: float
    subject: str
    data: bytes
    headers: dict[str, str] | None
    pending: int
    """Messages still in the stream after this one for this consumer (0 = caught up)."""


def parse_ack_reply(reply: str) -> tuple[int, float, int]:
    """(stream seq, server time in epoch seconds, num_pending) from a JetStream reply subject.

    Faster than nats-py's `Msg.metadata`, which builds datetimes per message.
    Handles both the v1 (9 tokens) and v2 (12 tokens, with domain) forms.
    """
    t = reply.split(".")
    if len(t) >= 12:
        sseq, ts, pending = t[7], t[9], t[10]
    else:
        sseq, ts, pending = t[5], t[7], t[8]
    return int(sseq), int(ts) / 1e9, int(pending)


Handler = Callable[[StoredMessage], Awaitable[None] | None]


class Delivery(StrEnum):
    """Where an `OrderedReader` starts, unless it is given `start_seq` or `start_time`
    (the values are JetStream's deliver policies)."""

    LAST_PER_SUBJECT = "last_per_subject"
    """The newest stored message of each subject, then every new one."""
    ALL = "all"
    """Every stored message, from the first, then every new one."""
    NEW = "new"
    """Only messages stored from now on."""


class OrderedReader:
    """One ordered push consumer on `stream`, filtered by `subject`.

    `handler` is called for each message in stream order, starting with the
    last message per subject (`deliver`), or at `start_seq`, or at the first
    message stored at or after `start_time` (epoch seconds).  `ready` is set
    after the message that had `pending == 0` was handled, or at once when the
    filtered stream was empty at start.
    """

    def __init__(
        self,
        nc: Client,
        *,
        stream: str,
        subject: str,
        handler: Handler,
        deliver: Delivery | DeliverPolicy = Delivery.LAST_PER_SUBJECT,
        start_seq: int | None = None,
        idle_heartbeat: float = 2.0,
        start_time: float | None = None,
        filter_subjects: list[str] | None = None,
        backpressure: bool = False,
        direct: bool = False,
    ) -> None:
        """`deliver`: a `Delivery` (nats-py's own `DeliverPolicy` is accepted too: tests and
        benchmarks name it).  `backpressure`: answer the server's flow control only for
        *handled* messages (`crr.bus.natspy.flow_control`), so while an (async) handler waits
        the backlog stays in the stream instead of piling up in this process.  `direct` (with
        `backpressure`): data messages are handled as they are read, without nats-py's
        Msg, queue and task hop (`crr.bus.natspy.ordered_consumer`)."""
        self._nc = nc
        self._want_direct = direct and backpressure
        self._direct: Direct | None = None
        self._backpressure = backpressure
        self._handled = 0
        self._held: HeldFlowControl | None = None
        self._filter_subjects = filter_subjects
        """Several filters instead of `subject` (one consumer keeps their stream order)."""
        self._idle_heartbeat = idle_heartbeat
        self._stream = stream
        self._subject = subject
        self._handler = handler
        self._deliver = deliver
        self._start_seq = start_seq
        self._start_time = start_time
        self._sub: Subscription | None = None
        self.ready = asyncio.Event()
        self.last_seq = 0
        self.received = 0

    async def start(self) -> None:
        """Create the consumer and start delivering; returns before the load completes.
        A nats error comes out as crr's (`crr.bus.errors`), its text prefixed by the stream."""
        with nats_errors(where=self._stream):
            await self._start()

    async def _start(self) -> None:
        js = self._nc.jetstream()
        config = ConsumerConfig(deliver_policy=DeliverPolicy(self._deliver))
        if self._start_seq is not None:
            config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                    opt_start_seq=self._start_seq)
        elif self._start_time is not None:
            config = ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_TIME,
                opt_start_time=datetime.fromtimestamp(self._start_time, UTC))
        if self._filter_subjects:
            config.filter_subjects = list(self._filter_subjects)
        self._sub = await js.subscribe(
            self._subject, stream=self._stream,
            cb=self._on_msg_held if self._backpressure else self._on_msg, ordered_consumer=True,
            config=config, idle_heartbeat=self._idle_heartbeat, pending_msgs_limit=1_000_000,
            pending_bytes_limit=1024 * 1024 * 1024,
        )
        if self._want_direct:
            self._direct = Direct(self._nc, self._sub, self._on_direct)
            if not self._direct.active:
                self._direct = None
        if self._backpressure and self._direct is None:
            # Flow control by messages handled, on nats-py's own path (see the module).
            self._held = HeldFlowControl(self._nc, self._sub, lambda: self._handled)
        info = await self._sub.consumer_info()
        # Nothing delivered to this consumer, and nothing to deliver: the filtered stream
        # is empty.  (The consumer's *stream* sequence is no test of that: for a filter
        # no message matches, DeliverLastPerSubject starts it at the stream's last
        # sequence, so a reader of a subject never written waited for ever.)
        delivered = (info.delivered.consumer_seq or 0) if info.delivered else 0
        if info.num_pending == 0 and delivered == 0:
            self.ready.set()

    async def _on_msg(self, msg: Msg) -> None:
        try:
            seq, ts, pending = parse_ack_reply(msg.reply)
        except (ValueError, IndexError):
            log.warning("unexpected reply subject %r on %s", msg.reply, msg.subject)
            return
        self.received += 1
        self.last_seq = seq
        hdrs = msg.headers if msg.headers else None
        stored = StoredMessage(seq, ts, msg.subject, msg.data, hdrs, pending)
        if hdrs is not None and self.ready.is_set() and tracing.is_traced(hdrs):
            # A live message of a sampled trace: the handler runs in a CONSUMER span.
            # (Not during the cold-start load: those traces ended long ago.)
            with tracing.consume(msg.subject, hdrs, seq=seq, stream=self._stream,
                                 size=len(msg.data)):
                out = self._handler(stored)
                if out is not None:
                    await out
        else:
            out = self._handler(stored)
            if out is not None:
                await out
        if pending == 0:
            self.ready.set()

    def _on_direct(  # noqa: PLR0917 - a message's fields, once per message: no extra object
            self, seq: int, ts: float, subject: str, data: bytes,
            hdrs: dict[str, str] | None, pending: int) -> Awaitable[None] | None:
        """`_on_msg` for a message taken as read (`crr.bus.natspy.ordered_consumer`): synchronous;
        an
        awaitable when the handler must be waited for."""
        self.received += 1
        self.last_seq = seq
        stored = StoredMessage(seq, ts, subject, data, hdrs, pending)
        if hdrs is not None and self.ready.is_set() and tracing.is_traced(hdrs):
            with tracing.consume(subject, hdrs, seq=seq, stream=self._stream, size=len(data)):
                out = self._handler(stored)
        else:
            out = self._handler(stored)
        if pending == 0:
            if out is None:
                self.ready.set()
            else:
                return self._ready_after(out)
        return out

    async def _ready_after(self, out: Awaitable[None]) -> None:
        await out
        self.ready.set()

    async def _on_msg_held(self, msg: Msg) -> None:
        """`_on_msg`, then answer a flow-control request the handled messages now cover."""
        d = self._direct
        if d is not None:
            await d.before_callback()
            try:
                await self._on_msg(msg)
            finally:
                await d.after_callback()
            return
        try:
            await self._on_msg(msg)
        finally:
            self._handled += 1
            if self._held is not None:
                await self._held.handled(self._handled)

    @property
    def waiting(self) -> int:
        """Messages received and not handled yet: the direct path's backlog (bounded by
        the server's flow-control window, `crr.bus.natspy.ordered_consumer`), else
        nats-py's queue."""
        if self._direct is not None:
            return len(self._direct.backlog)
        return self._sub.pending_msgs if self._sub is not None else 0

    async def drained(self) -> None:
        """Wait until the messages waiting in the direct path's backlog are handled (a
        handler that lets its backlog go first: folding more before writing)."""
        if self._direct is not None:
            await self._direct.drained()

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until the initial load is complete (CrrTimeoutError otherwise)."""
        try:
            await asyncio.wait_for(self.ready.wait(), timeout)
        except TimeoutError:
            raise CrrTimeoutError(
                f"initial load of {self._stream} ({self._subject}) not complete after "
                f"{timeout:g}s ({self.received} message(s) so far)"
            ) from None

    async def stop(self) -> None:
        """Unsubscribe (deletes the ephemeral consumer)."""
        if self._direct is not None:
            self._direct.stop()
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error, nats.js.errors.Error, TimeoutError):
                await self._sub.unsubscribe()
            self._sub = None
