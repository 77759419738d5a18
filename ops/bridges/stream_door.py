"""A door that speaks to its target on a stream it cannot read back (HTCondor, LSF).

The startd cron and the melim read the bridge's stdout; neither can be asked
what it has.  So "what the target shows" is what was written last, and each
update is one rendered block per node, flushed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TextIO

from crr.bridges.door import Applied, Observed
from crr.projections.exports import CompiledExports, NodeWant
from crr.schemas.errors import BridgeError

Render = Callable[[NodeWant, Sequence[str]], str]
"""(want, every declared feature name, sorted) → the text of one update."""


class StreamDoor:
    """Writes rendered updates to `out` (see module doc)."""

    def __init__(self, name: str, out: TextIO, exports: Callable[[], CompiledExports | None],
                 render: Render) -> None:
        self.name = name
        self.out = out
        self._exports = exports
        self._render = render
        self._last: dict[str, NodeWant] = {}

    async def observe(self, nodes: Sequence[str]) -> Mapping[str, Observed]:
        """What was written last (the target cannot be read back)."""
        return {n: Observed(matches=self._last.get(n), written=n in self._last) for n in nodes}

    async def apply(self, changes: Mapping[str, NodeWant]) -> Applied:
        """Write one update per node (a per-host door: this host)."""
        exports = self._exports()
        names = sorted(exports.features) if exports is not None else []
        for node, want in changes.items():
            try:
                self.out.write(self._render(want, names))
                self.out.flush()
            except OSError as exc:
                raise BridgeError(f"cannot write to {self.name}'s reader: {exc}") from exc
            self._last[node] = want
        return Applied(done=frozenset(changes), calls=len(changes))
