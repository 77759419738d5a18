"""The port a scheduler target implements for the bridge engine (`crr.bridges.engine`).

A door is the target's side only: what it shows for some nodes now
(`observe`) and how to make it show crr's wants (`apply`).  Planning, diffing,
rate limiting, retries, metrics and health are the engine's, so every target
behaves alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from crr.projections.exports import NodeWant


@dataclass(frozen=True, slots=True)
class Observed:
    """What the target shows for one node now, as far as crr owns it."""

    known: bool = True
    """False: the target has no such node (reported once by the engine, then skipped)."""
    features: frozenset[str] = frozenset()
    """The crr-owned features the target has on the node (an admin's own are not listed)."""
    drain: str | None = None
    """The crr drain reason the node carries (None: not drained by crr)."""
    matches: NodeWant | None = None
    """For targets that cannot be read back (a stream to HTCondor or LSF), the want
    the door last wrote; the engine compares against it."""
    timed: bool = False
    """The target holds `matches.expires_at` too (NFD's `# +expiry-time=`): a want that
    only moved its expiry (a refresh with the same value) must still be written."""
    written: bool = True
    """False: the door has not told the target anything it still shows (a stream's first
    update, an NFD file not written yet or changed by someone): written whatever the want,
    so a host without features still gets its block, `undefined`s included."""


@dataclass(frozen=True, slots=True)
class Applied:
    """What an `apply` call achieved: nodes done, and the ones that failed, with why."""

    done: frozenset[str] = frozenset()
    failed: Mapping[str, str] = field(default_factory=dict)
    unknown: frozenset[str] = frozenset()
    """Nodes the target said it does not know."""
    calls: int = 0
    """Target commands issued (for batching figures)."""


class Door(Protocol):
    """A scheduler target (see the module doc).

    `apply` may raise a `crr.schemas.errors.BridgeError` (retriable: the engine retries
    the whole batch with back-off) or return per-node failures in `Applied.failed`.
    """

    name: str
    """The target's name (`nfd`, `condor`, `elim`, `slurm`): metric label and the
    health reporter `bridge-<name>`."""

    async def observe(self, nodes: Sequence[str]) -> Mapping[str, Observed]:
        """What the target has now for `nodes` (a node left out: unknown to the target)."""
        ...

    async def apply(self, changes: Mapping[str, NodeWant]) -> Applied:
        """Make the target show `changes` (node → want); only these nodes change."""
        ...
