"""The projector's use of the cyclic GC (`crr projector`, a process-wide choice): the
long-lived fold state frozen out of its sight once built (the initial load itself runs
under `crr.runtime.gc_pause.gc_paused`)."""

from __future__ import annotations

import gc

from crr.projections.state import ProjectionState


class Freezer:
    """Takes the fold state out of the cyclic GC's sight (`gc.freeze`), when enabled.

    The fold state of 50k hosts is millions of objects that never form
    garbage cycles; every full collection scanned them all, a 130-270 ms
    pause (measured) that showed up as report→view p99 latency.  Frozen
    once the initial load is folded and again each time the host count
    grew by a tenth, past 1000 (new hosts bring new long-lived records); a young
    collection first, so little short-lived garbage is frozen with them.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._frozen_hosts = 0

    def freeze(self, state: ProjectionState) -> None:
        gc.collect(1)
        gc.freeze()
        self._frozen_hosts = len(state.hosts)

    def loaded(self, state: ProjectionState) -> None:
        """The initial load (or a rebuild) is folded: collect, then freeze what is alive."""
        if self.enabled:
            gc.collect()
            self.freeze(state)

    def grown(self, state: ProjectionState) -> None:
        """Freeze again if the host count grew by a tenth (past 1000) since last time."""
        if self.enabled and len(state.hosts) > max(1000, self._frozen_hosts * 1.1):
            self.freeze(state)

    def discard(self) -> None:
        """The frozen state is garbage now (a rebuild starts over)."""
        if self.enabled:
            gc.unfreeze()
