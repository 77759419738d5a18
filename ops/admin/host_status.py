"""The STATUS of a host in listings (`crr hosts`), derived from its snapshot record at `now`.

The state of a value at `now` is the freshness rule every surface shares
(`crr.projections.freshness.entry_state`).
"""

from __future__ import annotations

from typing import Final, Literal

from crr.admin.reporter_health import FAILING_STATES
from crr.projections.freshness import entry_state
from crr.schemas.snapshot import HostSnapshot

HostStatus = Literal["ok", "failing", "stale", "unknown", "empty"]

STATUS_HELP: Final = (
    "STATUS: ok (every value fresh, every reporter ok) · failing (a reporter is failing) · "
    "stale (a value expired) · unknown (a reporter said null) · empty (no values yet)"
)


def host_status(snap: HostSnapshot, now: float) -> HostStatus:
    """The worst of: a failing reporter, a stale value, an unknown value; else ok (or empty)."""
    if any(st.state in FAILING_STATES for st in snap.reporters.values()):
        return "failing"
    states = {entry_state(e, now) for e in snap.values.values()}
    if "stale" in states:
        return "stale"
    if "unknown" in states:
        return "unknown"
    return "ok" if states or snap.inventory else "empty"
