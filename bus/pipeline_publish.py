"""High-throughput acknowledged JetStream publishing: many publishes in flight, every ack checked.

`crr.bus.outbox.Outbox` waits for each ack in a window of `js.publish` calls
(one future, one inbox subscription round-trip and one task per message):
right for an agent publishing a few reports a second, too slow for a
simulator publishing tens of thousands.  `PipelinePublisher` sends each
message with a reply subject on ONE wildcard inbox subscription and does
not wait: up to `max_in_flight` messages may be unacknowledged at once
(back-pressure: `publish()` waits for room).  Every ack is matched to its
message:

- a PubAck counts it as stored (`duplicate` ones too: the stream already
  had that `Nats-Msg-Id`);
- an API error `< 500` (the server refused it) counts it as rejected and
  reports it through `on_error` — never a future that hangs forever
  (nats-py issue #985 is why this does not use `js.publish_async`);
- no ack within `ack_timeout` (or a 503 "no responders"): the message is
  re-sent with the same headers (so the stream's `Nats-Msg-Id` window
  de-duplicates a late original), up to `max_attempts` times, then counted
  as failed.

Order: messages on one subject are sent in `publish()` order; a re-send
after a timeout may land after a newer message on the same subject, as with
any at-least-once publisher (crr's fold orders reports by `seq`).

Each message is framed by `crr.bus.natspy.framing.Framer`, not by nats-py's `Client.publish`,
whose per-message work (an f-string, a regular expression per header name,
a `str.translate` of every header value, two copies of the payload) costs
more than the rest of a send: ~3.5 µs of a ~16 µs publish of a 6 kB
projector record with its 400-byte `Crr-Columns` header.  The frame is the
one nats-py would send (`tests/bus/test_pipeline_publish.py` compares them);
anything unusual — not connected, draining, an oversized message, a header
nats-py would rewrite or refuse, another nats-py — goes through
`Client.publish` itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from crr.bus.cancel import cancel_and_wait
from crr.bus.natspy import parser as direct
from crr.bus.natspy.framing import Framer
from crr.schemas.errors import CrrTimeoutError, NoRespondersError

PONG_WAIT = 2.0
"""Seconds `flush` waits for the server's PONG (its messages reached the server) before
it waits on the acknowledgements alone.  A PING sent just before a reconnect is never
answered: nats-py's `flush` then waited out the whole timeout (a projector wrote nothing
for 60 s after its server's `kill -9`), while the acks of the re-sent messages came."""

log = logging.getLogger("crr.bus.pipeline")

ErrorHandler = Callable[[str, str], None]


class _ApiError(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _Ack(msgspec.Struct):
    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    error: _ApiError | None = None


_decode_ack = msgspec.json.Decoder(_Ack).decode


@dataclass(slots=True)
class _Pending:
    subject: str
    payload: bytes
    headers: dict[str, str] | None
    sent_at: float
    attempts: int = 1


@dataclass
class PipelineStats:
    """Counters an operator (and the benchmarks) can read."""

    sent: int = 0
    acked: int = 0
    duplicates: int = 0
    rejected: int = 0
    resent: int = 0
    failed: int = 0
    last_seq: int = 0
    """Highest stream sequence seen in an ack."""
    no_responders: int = 0
    """503 "no responders" answers (no stream captured the subject)."""
    last_error: str | None = None


class PipelinePublisher:
    """Pipelined, acknowledged publishing with a bounded number of acks outstanding."""

    def __init__(
        self,
        nc: Client,
        *,
        max_in_flight: int = 4096,
        ack_timeout: float = 5.0,
        max_attempts: int = 5,
        on_error: ErrorHandler | None = None,
    ) -> None:
        self._nc = nc
        self._send = Framer(nc).send
        self._max = max_in_flight
        self._unanswered = asyncio.Event()
        """Set by a 503 "no responders" answer (see `flush`)."""
        self._ack_timeout = ack_timeout
        self._max_attempts = max_attempts
        self.on_error = on_error
        self._prefix = f"_INBOX.crrpipe.{secrets.token_hex(6)}."
        self._inflight: dict[str, _Pending] = {}
        self._next = 0
        self._room = asyncio.Event()
        self._room.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._sub: Subscription | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.stats = PipelineStats()

    @property
    def in_flight(self) -> int:
        """Messages sent and not yet acknowledged (nor given up)."""
        return len(self._inflight)

    async def start(self) -> None:
        """Subscribe to the ack inbox and start the timeout guard."""
        if self._sub is None:
            self._sub = await self._nc.subscribe(self._prefix + "*", cb=self._on_ack,
                                                 pending_msgs_limit=4 * self._max + 1024)
            # Plain acks are handled as they are read (no Msg, no queue, no task hop).
            direct.route(self._nc, self._sub, self._on_ack_bytes)
            self._sweeper = asyncio.create_task(self._sweep(), name="crr-pipeline-sweep")

    async def __aenter__(self) -> PipelinePublisher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def publish(self, subject: str, payload: bytes,
                      headers: dict[str, str] | None = None) -> None:
        """Send one message; waits only while `max_in_flight` acks are outstanding."""
        while len(self._inflight) >= self._max:
            self._room.clear()
            await self._room.wait()
        self._next += 1
        token = str(self._next)
        self._inflight[token] = _Pending(subject, payload, headers, time.monotonic())
        self._idle.clear()
        self.stats.sent += 1
        await self._send(subject, payload, self._prefix + token, headers)

    async def flush(self, timeout: float = 30.0, *, fail_unanswered: bool = False) -> None:
        """Wait until every message published so far is acknowledged or given up.

        `fail_unanswered`: a 503 "no responders" (no stream captures the subject: it
        was deleted) ends the wait at once with NoRespondersError, and gives up what is
        in flight (no stream stored it; a re-send after the stream is back could land
        after a newer write) — for a writer that knows what to do then."""
        with contextlib.suppress(nats.errors.FlushTimeoutError):  # see PONG_WAIT
            await self._nc.flush(max(1, math.ceil(min(timeout, PONG_WAIT))))
        try:
            if fail_unanswered:
                await self._idle_unless_refused(timeout)
            else:
                await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            raise CrrTimeoutError(
                f"pipeline: {len(self._inflight)} publish(es) still unacknowledged after "
                f"{timeout:g}s" + (f" (last error: {self.stats.last_error})"
                                   if self.stats.last_error else "")
            ) from None

    async def _idle_unless_refused(self, timeout: float) -> None:
        """`flush(fail_unanswered=True)`'s wait: idle (TimeoutError if not in time), or
        NoRespondersError at the first 503 since the last such wait (of this batch's
        messages: the earlier ones were all settled), giving up what is in flight."""
        idle = asyncio.ensure_future(self._idle.wait())
        refused = asyncio.ensure_future(self._unanswered.wait())
        try:
            await asyncio.wait([idle, refused], timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            idle.cancel()
            refused.cancel()
        refused_now = self._unanswered.is_set()
        self._unanswered.clear()
        if refused_now and self._inflight:
            given_up = len(self._inflight)
            self.stats.failed += given_up
            self._inflight.clear()
            self._settled()
            raise NoRespondersError(
                f"pipeline: no stream captures the subject (503 no responders); {given_up} "
                "publish(es) given up")
        if not self._idle.is_set():
            raise TimeoutError

    async def abandon(self) -> int:
        """Stop at once, giving up what is in flight (no re-send of it will follow); the
        number given up.  For a writer whose flush failed and that writes newer data on
        the same subjects next: a re-send of the old data landing after the new write
        would leave the old data last (see "Order" in the module doc)."""
        given_up = len(self._inflight)
        self.stats.failed += given_up
        self._inflight.clear()
        self._settled()
        await self._stop()
        return given_up

    async def close(self, flush_timeout: float = 10.0) -> None:
        """Flush (best effort), then stop the guard and unsubscribe."""
        with contextlib.suppress(CrrTimeoutError):
            if self._sub is not None and not self._nc.is_closed:
                await self.flush(flush_timeout)
        await self._stop()

    async def _stop(self) -> None:
        await cancel_and_wait(self._sweeper)
        self._sweeper = None
        if self._sub is not None:
            direct.unroute(self._nc, self._sub)
            with contextlib.suppress(Exception):  # the connection may be gone already
                await self._sub.unsubscribe()
            self._sub = None
        if self._inflight:
            log.warning("pipeline closed with %d unacknowledged publish(es)", len(self._inflight))

    # -- acks ----------------------------------------------------------------

    def _settled(self) -> None:
        if len(self._inflight) < self._max:
            self._room.set()
        if not self._inflight:
            self._idle.set()

    async def _on_ack(self, msg: Msg) -> None:
        if msg.headers and msg.headers.get("Status") == "503":
            # No responders (no stream yet, or deleted): the guard re-sends after the
            # timeout, unless a `flush(fail_unanswered=True)` gives up first.
            self.stats.no_responders += 1
            self._unanswered.set()
            return
        self._ack(msg.subject[len(self._prefix):], msg.data)

    def _on_ack_bytes(self, subject: bytes, data: bytes) -> None:
        """An ack without headers, as read (`crr.bus.natspy.parser`)."""
        self._ack(subject[len(self._prefix):].decode(), data)

    def _ack(self, token: str, data: bytes) -> None:
        pending = self._inflight.get(token)
        if pending is None:
            return  # the ack of a message already re-sent, acked or given up
        try:
            ack = _decode_ack(data)
        except msgspec.DecodeError:
            ack = _Ack(error=_ApiError(code=500, description=f"bad ack {data[:80]!r}"))
        if ack.error is not None and ack.error.code >= 500:
            return  # retriable (e.g. no leader): the guard re-sends after the timeout
        del self._inflight[token]
        if ack.error is not None:
            self.stats.rejected += 1
            why = f"{ack.error.code} {ack.error.description}"
            self.stats.last_error = f"{pending.subject}: {why}"
            log.error("publish to %s refused: %s", pending.subject, why)
            if self.on_error is not None:
                self.on_error(pending.subject, why)
        else:
            self.stats.acked += 1
            self.stats.duplicates += ack.duplicate
            self.stats.last_seq = max(self.stats.last_seq, ack.seq)
        self._settled()

    async def _sweep(self) -> None:
        """The timeout guard: re-send or give up publishes whose ack did not come."""
        period = max(0.05, self._ack_timeout / 4)
        while True:
            await asyncio.sleep(period)
            deadline = time.monotonic() - self._ack_timeout
            expired: list[tuple[str, _Pending]] = []
            for token, p in self._inflight.items():  # insertion order = send order
                if p.sent_at > deadline:
                    break
                expired.append((token, p))
            for token, p in expired:
                del self._inflight[token]
                if p.attempts >= self._max_attempts:
                    self.stats.failed += 1
                    self.stats.last_error = f"{p.subject}: no ack after {p.attempts} attempt(s)"
                    log.error("gave up publishing to %s after %d attempt(s)", p.subject,
                              p.attempts)
                    if self.on_error is not None:
                        self.on_error(p.subject, "no ack")
                    continue
                self._next += 1
                new = str(self._next)
                p.attempts += 1
                p.sent_at = time.monotonic()
                self._inflight[new] = p
                self.stats.resent += 1
                try:
                    await self._send(p.subject, p.payload, self._prefix + new, p.headers)
                except Exception as exc:
                    self.stats.last_error = f"{p.subject}: {exc!r}"
            self._settled()
