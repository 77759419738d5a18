"""The publishing side of every producer: JetStream publishes with acks, kept across outages.

`put()` never blocks and never raises for a transient outage.  While NATS is
unreachable the outbox keeps, per subject, either only the newest pending
message (`keep="latest"`: reports and inventories — an older value is
worthless once a newer one exists) or every message up to a bound
(`keep="all"`: health transitions), and flushes them when the connection
returns.  Every message carries `Nats-Msg-Id`, so a resend after a lost ack
is de-duplicated by the stream; and a message sent without an answer (an ack
timeout) is resent, same id, before any newer one on its subject, so a copy
delivered late (by a server that was cut off from its cluster) is a
duplicate then, never an older value stored after a newer one.  Publishes
wait for the JetStream ack (not `publish_async`, whose future never resolves
when the server refuses a message — nats-py issue #985).

A publish the server's authorization refuses gets no ack: the server
answers with an asynchronous `-ERR 'Permissions Violation for Publish to
"<subject>"'` instead.  The outbox listens for it (`crr.bus.connection.
add_error_listener`), fails the waiting publish at once and treats it as
permanent: the message is rejected (`on_error`, `stats.rejected`), never
retried — a misconfigured host must not retry in a storm.  Later messages on
the same subject are tried once each; only the first refusal per subject is
logged at ERROR.

A server that stays connected but acknowledges nothing (it lost its
cluster's majority, or its JetStream is frozen) is left: after `switch_after`
seconds of failing publishes the outbox reconnects to another server of the
connection's list (`crr.bus.connection.switch_server`), where the kept messages
are flushed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from nats.aio.client import Client

from crr.bus import tracing
from crr.bus.cancel import cancel_and_wait
from crr.bus.connection import add_error_listener, switch_server
from crr.bus.errors import NATS_FAILURES, as_crr_error
from crr.bus.retry import PUBLISH
from crr.schemas.errors import (
    AuthError,
    BusTimeoutError,
    CrrError,
    CrrTimeoutError,
    DuplicateInProcessError,
)
from crr.schemas.subjects import MSG_ID_HEADER

log = logging.getLogger("crr.bus.outbox")

Keep = Literal["latest", "all"]
ErrorHandler = Callable[[str, Exception], None]
AckHandler = Callable[[str, bytes, int], None]
"""Told of every acknowledged publish: subject, payload and its stream sequence."""

# nats-py lower-cases -ERR texts, subject included: match subjects case-insensitively.
_REFUSED = re.compile(r'permissions violation for publish to "([^"]+)"', re.IGNORECASE)


def _outcome_unknown(exc: CrrError) -> bool:
    """Whether a failed publish may still be stored (no answer came, or an earlier attempt
    with its `Nats-Msg-Id` is still being stored: `DuplicateInProcessError`), as opposed to
    certainly not stored (not sent, or the server answered with an error)."""
    return isinstance(exc, BusTimeoutError | DuplicateInProcessError)


@dataclass(eq=False)
class _Item:
    subject: str
    payload: bytes
    headers: dict[str, str]
    keep: Keep
    attempts: int = 0
    unsure: bool = False
    """An attempt got no answer: it may still be stored late, so a later attempt failing
    for certain does not make that copy go away (see `_requeue`)."""
    span: tracing.Span | None = None
    """The PRODUCER span of this publish when the trace is sampled (see `crr.bus.tracing`)."""


@dataclass
class OutboxStats:
    """Counters an operator (and the tests) can read."""

    published: int = 0
    retried: int = 0
    superseded: int = 0
    dropped_overflow: int = 0
    rejected: int = 0
    switched: int = 0
    """Times the outbox left a server that acknowledged nothing (see the module doc)."""
    last_error: str | None = None
    errors: list[str] = field(default_factory=list)


class Outbox:
    """Buffered, acknowledged, de-duplicated publishing to JetStream (see module doc)."""

    def __init__(
        self,
        nc: Client,
        *,
        max_all: int = 10_000,
        window: int = 256,
        ack_timeout: float = 5.0,
        on_error: ErrorHandler | None = None,
        switch_after: float | None = 10.0,
    ) -> None:
        self._nc = nc
        self._switch_after = switch_after
        self._js = nc.jetstream(timeout=ack_timeout)
        self._latest: OrderedDict[str, _Item] = OrderedDict()
        self._unsure: OrderedDict[str, _Item] = OrderedDict()
        """Sent, outcome unknown (no ack): resent before anything newer on its subject."""
        self._all: deque[_Item] = deque()
        self._max_all = max_all
        self._window = window
        self._ack_timeout = ack_timeout
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.on_error = on_error
        self.on_ack: AckHandler | None = None
        """Set to be told of each acknowledged publish (`crr external run`'s cycle lines);
        it runs in the sender and must be quick."""
        self.stats = OutboxStats()
        self._inflight: dict[str, asyncio.Task[object]] = {}
        self._refused: dict[str, Exception] = {}
        self._refused_logged: set[str] = set()
        self._remove_listener: Callable[[], None] | None = None
        self._failing_since = 0.0
        """When the current run of failing batches began (see `switch_after`)."""

    @property
    def pending(self) -> int:
        """Messages waiting to be published (not counting those in flight)."""
        return len(self._latest) + len(self._all) + len(self._unsure)

    async def start(self) -> None:
        """Start the background sender."""
        if self._task is None:
            self._remove_listener = add_error_listener(self._nc, self._on_async_error)
            self._task = asyncio.create_task(self._run(), name="crr-outbox")

    def _on_async_error(self, exc: Exception) -> None:
        """A server `-ERR`: a refused publish fails its waiting send at once."""
        m = _REFUSED.search(str(exc))
        if m is None:
            return
        key = m.group(1).lower()
        task = self._inflight.get(key)
        if task is not None and not task.done():
            self._refused[key] = AuthError(
                f"the server refused a publish to {m.group(1)}: permissions violation "
                "(these credentials may not publish there)")
            task.cancel()

    def put(
        self,
        subject: str,
        payload: bytes,
        *,
        msg_id: str,
        keep: Keep = "latest",
        headers: dict[str, str] | None = None,
    ) -> None:
        """Queue a message; returns at once (see module doc for what is kept)."""
        hdrs = {MSG_ID_HEADER: msg_id}
        if headers:
            hdrs.update(headers)
        item = _Item(subject, payload, hdrs, keep,
                     span=tracing.start_publish(subject, hdrs, size=len(payload)))
        if keep == "latest":
            old = self._latest.pop(subject, None)
            if old is not None:
                self.stats.superseded += 1
                tracing.end_publish(old.span, outcome="superseded")
            self._latest[subject] = item
        else:
            if len(self._all) >= self._max_all:
                tracing.end_publish(self._all.popleft().span, outcome="dropped")
                self.stats.dropped_overflow += 1
            self._all.append(item)
        self._idle.clear()
        self._wakeup.set()

    async def flush(self, timeout: float = 10.0) -> None:
        """Wait until everything queued so far is acknowledged (CrrTimeoutError otherwise)."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            raise CrrTimeoutError(
                f"outbox: {self.pending} message(s) still unacknowledged after {timeout:g}s"
                + (f" (last error: {self.stats.last_error})" if self.stats.last_error else "")
            ) from None

    async def close(self, flush_timeout: float = 5.0) -> None:
        """Try to flush, then stop the sender; what could not be sent is logged.

        Cancelled while flushing (a service stopped while NATS is away), the
        sender is stopped all the same: no task outlives the outbox."""
        try:
            with contextlib.suppress(CrrTimeoutError):
                await self.flush(flush_timeout)
        finally:
            self._closing = True
            await cancel_and_wait(self._task)
            self._task = None
        if self._remove_listener is not None:
            self._remove_listener()
            self._remove_listener = None
        if self.pending:
            log.warning("outbox closed with %d unsent message(s)", self.pending)

    def _take_batch(self) -> list[_Item]:
        """Up to `window` items, at most one per subject (keeps per-subject order)."""
        batch: list[_Item] = []
        seen: set[str] = set()
        while self._unsure and len(batch) < self._window:
            subject, it = self._unsure.popitem(last=False)
            seen.add(subject)
            batch.append(it)
        while self._all and len(batch) < self._window:
            if self._all[0].subject in seen:
                break
            it = self._all.popleft()
            seen.add(it.subject)
            batch.append(it)
        while self._latest and len(batch) < self._window:
            subject, it = self._latest.popitem(last=False)
            if subject in seen:
                self._latest[subject] = it
                self._latest.move_to_end(subject, last=False)
                break
            seen.add(subject)
            batch.append(it)
        return batch

    async def _send(self, it: _Item) -> CrrError | None:
        """Publish `it`; the (retriable) error to retry it on, None when done with it.

        A non-retriable error (a refusal: permissions, a bad request, too large) rejects
        the message; a retriable one (no ack in time, no responders, a 503 during an
        election, not connected) puts it back."""
        key = it.subject.lower()
        task = asyncio.current_task()
        assert task is not None
        self._inflight[key] = task
        try:
            ack = await self._js.publish(it.subject, it.payload, headers=it.headers,
                                         timeout=self._ack_timeout)
            tracing.end_publish(it.span, seq=ack.seq)
            if self.on_ack is not None:
                self.on_ack(it.subject, it.payload, int(ack.seq))
        except asyncio.CancelledError:
            refused = self._refused.pop(key, None)
            if refused is None:
                raise
            task.uncancel()
            self._reject(it, refused)
        except NATS_FAILURES as exc:
            err = as_crr_error(exc)
            if not isinstance(err, CrrError):  # pragma: no cover - NATS_FAILURES all map
                raise
            if err.retriable:
                return err
            self._reject(it, err)
        finally:
            if self._inflight.get(key) is task:
                del self._inflight[key]
        return None

    def _reject(self, it: _Item, exc: Exception) -> None:
        tracing.end_publish(it.span, error=exc)
        self.stats.rejected += 1
        self.stats.last_error = f"{it.subject}: {exc}"
        if it.subject not in self._refused_logged:
            self._refused_logged.add(it.subject)
            log.error("publish to %s refused: %s", it.subject, exc)
        else:
            log.debug("publish to %s refused again: %s", it.subject, exc)
        if self.on_error is not None:
            self.on_error(it.subject, exc)

    def _requeue(self, it: _Item, *, unsure: bool) -> None:
        it.attempts += 1
        self.stats.retried += 1
        it.unsure = it.unsure or unsure  # once unsure, until acknowledged
        if it.keep == "latest":
            if it.unsure:
                # Sent, no answer: it may still be stored late (held by a server cut off
                # from its cluster, delivered when the link heals), after a newer value.
                # Resending it first, with its Nats-Msg-Id, stores it in order or makes
                # that late copy a duplicate; a newer value waits until then.
                self._unsure[it.subject] = it
                return
            if it.subject in self._latest:
                self.stats.superseded += 1  # not stored, and a newer value is queued
                tracing.end_publish(it.span, outcome="superseded")
                return
            self._latest[it.subject] = it
            self._latest.move_to_end(it.subject, last=False)
        else:
            self._all.appendleft(it)

    async def _run(self) -> None:
        failures = 0
        while not self._closing:
            if not self._latest and not self._all and not self._unsure:
                self._idle.set()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if not await self._send_batch(failures + 1):
                failures = 0
                continue
            failures += 1
            # The policy's back-off (`crr.bus.retry.PUBLISH`) before the next attempt; new
            # puts do not cut it short.  (A loop, not a tenacity spell per batch: ~30 µs
            # a batch saved on the path every report takes.)
            await asyncio.sleep(PUBLISH.delay(failures))

    async def _send_batch(self, attempt: int) -> bool:
        """Send one batch; whether some of it failed (retriable: put back to retry).

        `attempt`: this is the attempt after `attempt - 1` failed batches in a row.
        """
        batch = self._take_batch()
        results = await asyncio.gather(*(self._send(it) for it in batch))
        failed = [(it, r) for it, r in zip(batch, results, strict=True) if r is not None]
        self.stats.published += len(batch) - len(failed)
        if not failed:
            return False
        # Put back in reverse so the oldest keep their place at the front.
        for it, exc in reversed(failed):
            self._requeue(it, unsure=_outcome_unknown(exc))
        now = time.monotonic()
        if attempt == 1:
            self._failing_since = now
        elif self._switch_after is not None and now - self._failing_since >= self._switch_after:
            self._failing_since = now
            if await switch_server(self._nc, f"no JetStream ack for {self._switch_after:g}s"):
                self.stats.switched += 1
        self.stats.last_error = f"{failed[0][0].subject}: {failed[0][1]!r}"
        if attempt == 1 or attempt % 50 == 0:
            log.warning("publish failed (%s); %d message(s) kept for retry",
                        self.stats.last_error, self.pending)
        return True
