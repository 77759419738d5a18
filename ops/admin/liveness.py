"""Projector liveness and the judgement time for every reader: the rules applied now.

The rules themselves are `crr.projections.freshness.projector_liveness` and
`crr.projections.freshness.judge` (pure); this is their IO edge: the wall clock,
the threshold from `CRR_PROJECTOR_SILENT_AFTER` (seconds; default 15), and
`judgement`, the ONE place a reader (the scheduler view and `select[]`, `crr
hosts`/`select`/`explain`/`health`, the REST API and the status page through it, the
bridges) learns the `judged_at` it judges freshness at (docs/contract.md, "Freshness
at the watermark").
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence

from crr.projections.freshness import (
    DEFAULT_SILENT_AFTER,
    Judgement,
    ProjectorLiveness,
    judge,
    projector_liveness,
    watermark_of,
)
from crr.schemas.catalog import DEFAULT_OUTAGE_HOLD, Catalog
from crr.schemas.errors import CrrError
from crr.schemas.snapshot import ProjectorStatus

SILENT_AFTER_ENV = "CRR_PROJECTOR_SILENT_AFTER"


def silent_after(environ: Mapping[str, str] | None = None) -> float:
    """Seconds without a projector status before it counts as silent (CrrError if malformed)."""
    env = os.environ if environ is None else environ
    raw = env.get(SILENT_AFTER_ENV, "").strip()
    if not raw:
        return DEFAULT_SILENT_AFTER
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise CrrError(f"{SILENT_AFTER_ENV}={raw}: expected a positive number of seconds")
    return value


def liveness_now(statuses: Sequence[ProjectorStatus],
                 threshold: float | None = None) -> ProjectorLiveness:
    """`projector_liveness` of the current layout's status records at the wall clock."""
    return projector_liveness(statuses, time.time(),
                              silent_after() if threshold is None else threshold)


def warn_unless_live(statuses: Sequence[ProjectorStatus], command: str) -> ProjectorLiveness:
    """The liveness now; a one-line warning on stderr when the projector is not live (for
    listings whose stdout has a fixed shape: `--json`, `crr select`)."""
    live = liveness_now(statuses)
    if live.state != "live":
        print(f"crr {command}: warning: projector {live.detail}", file=sys.stderr)
    return live


def judgement(statuses: Sequence[ProjectorStatus], catalog: Catalog | None,
              now: float | None = None) -> Judgement:
    """When a reader judges freshness: `judge` of the current layout's statuses' watermark
    (`watermark_of`) at `now` (default: the wall clock) with the catalog's `outage_hold`
    (the default without a catalog).  Its `judged_at` is the `now` to pass to every
    freshness rule (`host_at`, `select`, `explain`, exports)."""
    hold = catalog.outage_hold_s() if catalog is not None else DEFAULT_OUTAGE_HOLD
    return judge(watermark_of(statuses), time.time() if now is None else now, hold)


def warn_if_holding(judged: Judgement, command: str) -> None:
    """One warning line on stderr while holding or past `outage_hold` (stdout keeps its
    shape: `--json`, `crr select`)."""
    if judged.detail:
        print(f"crr {command}: warning: {judged.detail}", file=sys.stderr)
