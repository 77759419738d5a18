"""High-throughput acknowledged JetStream publishing: many publishes in flight, every ack checked.

`bus.outbox.Outbox` waits for each ack in a window of `js.publish` calls
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

Each message is framed here (`Framer`), not by nats-py's `Client.publish`,
whose per-message work (an f-string, a regular expression per header name,
a `str.translate` of every header value, two copies of the payload) costs
more than the rest of a send: ~3.5 µs of a ~16 µs publish of a 6 kB
projector record with its 400-byte `Crr-Columns` header.  The frame is the
one nats-py would send (`tests/test_pipeline_publish.py` compares them);
anything unusual — not connected, draining, an oversized message, a header
nats-py would rewrite or refuse, another nats-py — goes through
`Client.publish` itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from bus import direct
from schemas.errors import CrrTimeoutError

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


_INVALID_SUBJECT = re.compile(r"[ \t\r\n]")
"""What nats-py refuses in a subject to publish to (its `_validate_subject`)."""
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""The header names nats-py sends as they are (its `_HEADER_KEY_RE`)."""
_NAMES: dict[str, bytes] = {}
"""Header names seen to match `_HEADER_NAME`, encoded (a few distinct ones)."""


def header_block(headers: Mapping[str, str]) -> bytes | None:
    """The header block nats-py sends for `headers`, or None when nats-py would reject or
    rewrite one of them (it refuses other names, strips values and turns CR and LF into
    spaces): then only nats-py's own `publish` may send it."""
    parts = [b"NATS/1.0\r\n"]
    for name, value in headers.items():
        raw = _NAMES.get(name)
        if raw is None:
            if not _HEADER_NAME.fullmatch(name):
                return None
            raw = name.encode()
            if len(_NAMES) < 64:
                _NAMES[name] = raw
        if ("\r" in value or "\n" in value
                or (value and (value[0].isspace() or value[-1].isspace()))):
            return None
        parts += (raw, b": ", value.encode(), b"\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


class Framer:
    """`Client.publish(subject, payload, reply=reply, headers=headers)` on the connection,
    with the protocol frame built here (see the module doc)."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._fast = all(hasattr(nc, name) for name in (
            "_send_command", "_flush_pending", "_flush_queue", "_max_payload", "stats",
            "is_connected", "is_draining_pubs"))
        """Whether this nats-py has the parts `send` uses (else every message goes through
        `Client.publish`)."""

    async def send(self, subject: str, payload: bytes, reply: str,
                   headers: dict[str, str] | None) -> None:
        """Publish one message (the errors are `Client.publish`'s)."""
        nc: Any = self._nc
        if (not self._fast or not nc.is_connected or nc.is_draining_pubs or not subject
                or _INVALID_SUBJECT.search(subject) or _INVALID_SUBJECT.search(reply)):
            await nc.publish(subject, payload, reply=reply, headers=headers)
            return
        if headers is not None:
            block = header_block(headers)
            if block is None or len(payload) > nc._max_payload:
                await nc.publish(subject, payload, reply=reply, headers=headers)
                return
            frame = b"HPUB %s %s %d %d\r\n%s%s\r\n" % (
                subject.encode(), reply.encode(), len(block), len(block) + len(payload),
                block, payload)
        else:
            if len(payload) > nc._max_payload:
                await nc.publish(subject, payload, reply=reply, headers=headers)
                return
            frame = b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), reply.encode(),
                                                    len(payload), payload)
        stats = nc.stats
        stats["out_msgs"] += 1
        stats["out_bytes"] += len(payload)
        await nc._send_command(frame)
        if nc._flush_queue is not None and nc._flush_queue.empty():
            await nc._flush_pending()


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

    async def flush(self, timeout: float = 30.0) -> None:
        """Wait until every message published so far is acknowledged or given up."""
        await self._nc.flush(max(1, math.ceil(timeout)))
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            raise CrrTimeoutError(
                f"pipeline: {len(self._inflight)} publish(es) still unacknowledged after "
                f"{timeout:g}s" + (f" (last error: {self.stats.last_error})"
                                   if self.stats.last_error else "")
            ) from None

    async def close(self, flush_timeout: float = 10.0) -> None:
        """Flush (best effort), then stop the guard and unsubscribe."""
        with contextlib.suppress(CrrTimeoutError):
            if self._sub is not None and not self._nc.is_closed:
                await self.flush(flush_timeout)
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
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
            return  # no responders (no stream yet): the guard re-sends after the timeout
        self._ack(msg.subject[len(self._prefix):], msg.data)

    def _on_ack_bytes(self, subject: bytes, data: bytes) -> None:
        """An ack without headers, as read (`bus.direct`)."""
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
