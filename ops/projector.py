"""The projector service: CRR_EVENTS → pure fold → CRR_SNAPSHOT.

IO lives here; the fold (`projections.fold`) is pure.  One ordered consumer
on CRR_EVENTS starts with `DeliverLastPerSubject` (a restart rebuilds from
the last event per subject — no checkpoint file) and stays on for live
events.  Nothing is written until that initial load is complete; then only
records whose canonical bytes differ from what CRR_SNAPSHOT already holds
are written, so a restart publishes nothing spurious.  Stale transitions are
driven by a deadline (the fold's `next_deadline`), not a coarse poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from dataclasses import dataclass, field

import nats.errors
import nats.js.errors
from nats.aio.client import Client

from bus.ordered import OrderedReader, StoredMessage
from bus.streams import StreamSettings, provision
from bus.subjects import (
    DEADLETTER,
    EVENTS_STREAM,
    SNAPSHOT_CATALOG,
    SNAPSHOT_CLUSTER,
    SNAPSHOT_PROJECTOR,
    SNAPSHOT_STREAM,
    host_snapshot_subject,
)
from projections.envelope import Envelope
from projections.fold import Changes, apply, expire, next_deadline
from projections.state import ProjectionState, cluster_snapshot, host_snapshot
from schemas.codec import encode
from schemas.errors import CrrTimeoutError
from schemas.events import DeadLetter
from schemas.snapshot import ProjectorStatus
from schemas.timestamps import format_time

log = logging.getLogger("crr.projector")

WRITE_WINDOW = 512


@dataclass
class _Dirty:
    hosts: set[str] = field(default_factory=set)
    cluster: bool = False
    catalog: bool = False

    def merge(self, ch: Changes) -> None:
        if ch.hosts:
            self.hosts.update(ch.hosts)
        self.cluster = self.cluster or ch.cluster
        self.catalog = self.catalog or ch.catalog

    def __bool__(self) -> bool:
        return bool(self.hosts) or self.cluster or self.catalog


class Projector:
    """Runs the fold live; offers its position and `wait_until(seq)`."""

    def __init__(
        self,
        nc: Client,
        *,
        settings: StreamSettings | None = None,
        status_interval: float = 1.0,
        projector_id: str | None = None,
    ) -> None:
        self._nc = nc
        self._js = nc.jetstream(timeout=10.0)
        self._settings = settings
        self._status_interval = status_interval
        self.projector_id = projector_id or f"{os.uname().nodename}-{secrets.token_hex(3)}"
        self.state = ProjectionState()
        self._dirty = _Dirty()
        self._wake = asyncio.Event()
        self._written: dict[str, bytes] = {}
        self._deadletters: list[DeadLetter] = []
        self._applied_seq = 0
        self._written_seq = 0
        self._stream_pending = 0
        self._position_changed = asyncio.Condition()
        self._events: OrderedReader | None = None
        self._started_at = time.time()
        self.applied = 0
        self.deadletter_count = 0
        self.writes = 0
        self.ready = asyncio.Event()

    # -- position ---------------------------------------------------------

    @property
    def position(self) -> int:
        """Last CRR_EVENTS sequence whose effects are written to CRR_SNAPSHOT."""
        return self._written_seq

    async def wait_until(self, seq: int, timeout: float = 10.0) -> None:
        """Wait until every event up to `seq` is reflected in CRR_SNAPSHOT."""
        async def reached() -> None:
            async with self._position_changed:
                await self._position_changed.wait_for(lambda: self._written_seq >= seq)

        try:
            await asyncio.wait_for(reached(), timeout)
        except TimeoutError:
            raise CrrTimeoutError(
                f"projector at {self._written_seq}, not {seq}, after {timeout:g}s"
            ) from None

    # -- input ------------------------------------------------------------

    def _on_event(self, m: StoredMessage) -> None:
        env = Envelope(seq=m.seq, subject=m.subject, received_at=m.time, data=m.data)
        ch = apply(self.state, env)
        self.applied += 1
        self._applied_seq = m.seq
        self._stream_pending = m.pending
        if ch.deadletter is not None and m.subject != DEADLETTER:
            self.deadletter_count += 1
            self._deadletters.append(DeadLetter(
                seq=m.seq, subject=m.subject, reason=ch.deadletter,
                payload=m.data[:4096].decode("utf-8", "replace"),
                received_at=format_time(m.time),
            ))
            log.warning("dead-lettered event %d on %s: %s", m.seq, m.subject, ch.deadletter)
        self._dirty.merge(ch)
        self._wake.set()

    # -- output -----------------------------------------------------------

    async def _load_written(self) -> None:
        """Read what CRR_SNAPSHOT holds now, so unchanged records are not rewritten."""
        def keep(m: StoredMessage) -> None:
            self._written[m.subject] = m.data

        reader = OrderedReader(self._nc, stream=SNAPSHOT_STREAM, subject="crr.v1.snapshot.>",
                               handler=keep)
        await reader.start()
        try:
            await reader.wait_ready(60.0)
        finally:
            await reader.stop()

    async def _publish(self, subject: str, data: bytes) -> None:
        if self._written.get(subject) == data:
            return
        await self._js.publish(subject, data)
        self._written[subject] = data
        self.writes += 1

    async def _flush(self) -> None:
        seq = self._applied_seq
        dirty, self._dirty = self._dirty, _Dirty()
        out: list[tuple[str, bytes]] = []
        if dirty.catalog and self.state.catalog is not None:
            out.append((SNAPSHOT_CATALOG, encode(self.state.catalog)))
        if dirty.cluster:
            out.append((SNAPSHOT_CLUSTER, encode(cluster_snapshot(self.state))))
        out.extend((host_snapshot_subject(h), encode(host_snapshot(self.state, h)))
                   for h in sorted(dirty.hosts))
        letters, self._deadletters = self._deadletters, []
        try:
            for i in range(0, len(out), WRITE_WINDOW):
                await asyncio.gather(*(self._publish(s, d) for s, d in out[i:i + WRITE_WINDOW]))
            for dl in letters:
                await self._js.publish(DEADLETTER, encode(dl),
                                       headers={"Nats-Msg-Id": f"deadletter/{dl.seq}"})
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
            # Put everything back; the next round retries (the fold state is intact).
            log.warning("snapshot write failed (%s); will retry", exc)
            self._dirty.merge(Changes(hosts=frozenset(dirty.hosts), cluster=dirty.cluster,
                                      catalog=dirty.catalog, deadletter=None))
            self._deadletters[:0] = letters
            raise
        async with self._position_changed:
            self._written_seq = max(self._written_seq, seq)
            self._position_changed.notify_all()

    async def _write_status(self) -> None:
        now = time.time()
        status = ProjectorStatus(
            last_seq=self._written_seq,
            stream_last_seq=self._applied_seq + self._stream_pending,
            lag=self._stream_pending,
            last_tick=format_time(now),
            started_at=format_time(self._started_at),
            applied=self.applied,
            deadletters=self.deadletter_count,
            hosts=len(self.state.hosts),
            projector_id=self.projector_id,
        )
        await self._js.publish(SNAPSHOT_PROJECTOR, encode(status))

    # -- main loop --------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Project until `stop` is set (or the task is cancelled)."""
        stop = stop or asyncio.Event()

        async def relay_stop() -> None:
            await stop.wait()
            self._wake.set()

        relay = asyncio.create_task(relay_stop())
        await provision(self._nc, self._settings)
        await self._load_written()
        self._events = OrderedReader(self._nc, stream=EVENTS_STREAM, subject="crr.v1.>",
                                     handler=self._on_event)
        await self._events.start()
        try:
            await self._events.wait_ready(300.0)
            # Initial load done: bring expiry up to now, then write the differences only.
            self._dirty.merge(expire(self.state, time.time()))
            await self._flush()
            self.ready.set()
            log.info("projector ready at seq %d (%d hosts)", self._written_seq,
                     len(self.state.hosts))
            next_status = 0.0
            failures = 0
            while not stop.is_set():
                now = time.time()
                deadline = next_deadline(self.state)
                wait = next_status - now
                if deadline is not None:
                    wait = min(wait, deadline - now)
                if not self._dirty and wait > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), wait)
                self._wake.clear()
                now = time.time()
                self._dirty.merge(expire(self.state, now))
                try:
                    wrote = bool(self._dirty or self._deadletters)
                    if wrote:
                        await self._flush()
                    # Status after every flush, so readers of CRR_SNAPSHOT learn the
                    # position right behind the records it covers (stream order).
                    if wrote or now >= next_status:
                        await self._write_status()
                        next_status = now + self._status_interval
                    failures = 0
                except (nats.errors.Error, nats.js.errors.Error, TimeoutError):
                    failures += 1
                    await asyncio.sleep(min(2.0, 0.05 * 2 ** min(failures, 6)))
        finally:
            relay.cancel()
            await self._events.stop()
