"""Projector liveness for the CLI and the REST API: the threshold, and the rule applied now.

The rule itself is `crr.projections.freshness.projector_liveness` (pure); this
is its IO edge: the wall clock, and the threshold from
`CRR_PROJECTOR_SILENT_AFTER` (seconds; default 15).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence

from crr.projections.freshness import DEFAULT_SILENT_AFTER, ProjectorLiveness, projector_liveness
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
