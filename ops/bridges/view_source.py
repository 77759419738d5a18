"""A whole-cluster door's view of the snapshot: the scheduler view (`crr.view.scheduler_view`).

For a door that serves every node from one process (Slurm): the view's
columnar table, followed live; the wants of every host are planned from it
(`crr.projections.exports.plan_table`).  The view's listener marks the source
changed on every record, the catalog record re-plans the exports (a catalog
whose exports no longer compile keeps the last good plan: `Planner`).

Wants are planned at the view's `judged_at` (the projector's watermark, at most
`outage_hold` back: docs/contract.md, "Freshness at the watermark"), so a projector
that stops or falls behind changes nothing on the target until `outage_hold` runs out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping

from crr.bridges.engine import Clock, Planner
from crr.projections.exports import NodeWant, plan_table
from crr.projections.freshness import Judgement
from crr.schemas.catalog import Catalog
from crr.view.scheduler_view import SchedulerView

log = logging.getLogger("crr.bridge")


class ViewSource:
    """Every host of a `SchedulerView` (started and ready); a `Source` for the engine."""

    def __init__(self, view: SchedulerView, *, clock: Clock = time.time) -> None:
        self.view = view
        self.planner = Planner()
        self.changed = asyncio.Event()
        self._changed_at: float | None = None
        self._clock = clock
        self._catalog: Catalog | None = None
        self.judged: Judgement | None = None
        """The judgement the last wants were planned at (`holding` for the bridge's status)."""
        self._unsubscribe = view.subscribe(self._on_change)
        self._follow_catalog()

    @property
    def changed_at(self) -> float | None:
        """Clock time of the oldest change not yet planned."""
        return self._changed_at

    def _on_change(self, _subject: str) -> None:
        if self._changed_at is None:
            self._changed_at = self._clock()
        self.changed.set()

    def _follow_catalog(self) -> None:
        catalog = self.view.catalog
        if catalog is not None and catalog is not self._catalog:
            self._catalog = catalog
            self.planner.set_catalog(catalog)

    def wants(self, now: float) -> dict[str, NodeWant]:
        """Every host's want at `now` (nothing while no catalog with exports is known)."""
        self._changed_at = None
        self._follow_catalog()
        exports = self.planner.exports
        if exports is None:
            return {}
        judged = self.judged = said(self.judged, self.view.judgement(now))
        return on_clock(plan_table(exports, self.view.table, judged.judged_at), judged)

    def close(self) -> None:
        """Stop listening to the view."""
        self._unsubscribe()


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
