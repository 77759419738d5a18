"""A per-host door's view of the snapshot: that host's record, the cluster record, the catalog.

One ordered consumer on CRR_SNAPSHOT filtered to exactly those three subjects and the
projector's status records (last per subject, then live): a bridge beside each of 50k
nodes reads a handful of records, never the whole snapshot.  Wants are planned at the
`judged_at` of those statuses (the projector's watermark, at most `outage_hold` back:
docs/contract.md, "Freshness at the watermark"); a status record alone does not wake
the engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping

from crr.admin.liveness import judgement
from crr.bridges.engine import Clock, Planner
from crr.bus.connection import Connection
from crr.bus.ordered import OrderedReader, StoredMessage
from crr.projections.coverage import Coverage
from crr.projections.exports import NodeWant, plan_host
from crr.projections.freshness import Judgement
from crr.schemas.catalog import Catalog
from crr.schemas.codec import decode
from crr.schemas.errors import PayloadError
from crr.schemas.snapshot import ClusterSnapshot, HostSnapshot, ProjectorStatus
from crr.schemas.subjects import (
    SNAPSHOT_CATALOG,
    SNAPSHOT_CLUSTER,
    SNAPSHOT_PROJECTOR,
    SNAPSHOT_STREAM,
    STATUS_PARTITIONS,
    host_snapshot_subject,
    is_projector_status,
    snapshot_kind,
)

log = logging.getLogger("crr.bridge")


class HostSource:
    """Follows one host's records (see module doc); a `Source` for the engine."""

    def __init__(self, nc: Connection, host: str, *, clock: Clock = time.time) -> None:
        self.host = host
        self.record: HostSnapshot | None = None
        self.cluster: ClusterSnapshot | None = None
        self.planner = Planner()
        self.catalog: Catalog | None = None
        self.coverage = Coverage()
        """The projector's status records (their watermark: `judgement`)."""
        self.judged: Judgement | None = None
        """The judgement the last wants were planned at (`holding` for the bridge's status)."""
        self.changed = asyncio.Event()
        self.position = 0
        """Last CRR_SNAPSHOT sequence handled."""
        self._changed_at: float | None = None
        self._clock = clock
        self._subject = host_snapshot_subject(host)
        self._reader = OrderedReader(
            nc, stream=SNAPSHOT_STREAM, subject=self._subject, handler=self._on_msg,
            filter_subjects=[self._subject, SNAPSHOT_CLUSTER, SNAPSHOT_CATALOG,
                             SNAPSHOT_PROJECTOR, STATUS_PARTITIONS])

    @property
    def changed_at(self) -> float | None:
        """Clock time of the oldest change not yet planned."""
        return self._changed_at

    def _on_msg(self, m: StoredMessage) -> None:
        self.position = max(self.position, m.seq)
        try:
            if is_projector_status(m.subject):
                if m.data:
                    self.coverage.add(m.subject, m.seq, decode(m.data, ProjectorStatus))
                else:
                    self.coverage.remove(m.subject)
                return  # (no re-plan for a status alone: see the module doc)
            kind = snapshot_kind(m.subject)
            if kind == "catalog":
                self.catalog = decode(m.data, Catalog)
                self.planner.set_catalog(self.catalog)
            elif kind == "cluster":
                self.cluster = decode(m.data, ClusterSnapshot) if m.data else None
            elif m.subject == self._subject:
                self.record = decode(m.data, HostSnapshot) if m.data else None  # empty: forgotten
        except PayloadError as exc:
            log.warning("bridge: ignoring undecodable %s at seq %d: %s", m.subject, m.seq, exc)
            return
        if self._changed_at is None:
            self._changed_at = self._clock()
        self.changed.set()

    def wants(self, now: float) -> dict[str, NodeWant]:
        """This host's want at `now` (nothing while no catalog with exports is known)."""
        self._changed_at = None
        exports = self.planner.exports
        if exports is None:
            return {}
        judged = self.judged = said(self.judged, self.judgement(now))
        return on_clock({self.host: plan_host(exports, self.record, self.cluster,
                                              judged.judged_at)}, judged)

    def judgement(self, now: float | None = None) -> Judgement:
        """When this host's values are judged at `now` (default: the clock), from the
        projector's statuses (`crr.admin.liveness.judgement`)."""
        return judgement(self.coverage.current, self.catalog,
                         self._clock() if now is None else now)

    async def start(self, timeout: float = 30.0) -> None:
        """Subscribe and wait for the initial load."""
        await self._reader.start()
        await self._reader.wait_ready(timeout)

    async def stop(self) -> None:
        """Unsubscribe."""
        await self._reader.stop()


def on_clock(wants: Mapping[str, NodeWant], judged: Judgement) -> dict[str, NodeWant]:
    """`wants` planned at `judged.judged_at`, with their `expires_at` moved onto the clock
    (by the lag `now - judged_at`), so the engine does not wake again and again for a
    deadline the judgement has not reached while it holds."""
    shift = judged.now - judged.judged_at
    if shift <= 0:
        return dict(wants)
    return {h: w if w.expires_at is None else dataclasses.replace(
        w, expires_at=w.expires_at + shift) for h, w in wants.items()}


def said(before: Judgement | None, now: Judgement) -> Judgement:
    """`now`, logged when the bridge starts or stops holding (or passes `outage_hold`)."""
    was = (before.holding, before.expired) if before is not None else (False, False)
    if (now.holding, now.expired) != was:
        if now.detail:
            log.warning("bridge: %s", now.detail)
        else:
            log.warning("bridge: caught up with the projector's watermark; no longer holding")
    return now
