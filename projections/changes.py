"""What one fold step changed: `Changes` (the answer of `apply`/`expire`) and `Acc`, which
collects them while the step runs, so the caller rewrites only the records named."""

from __future__ import annotations

from typing import Final

import msgspec

from crr.projections.state import Record


class Changes(msgspec.Struct, frozen=True, kw_only=True):
    """What one `apply` or `expire` changed, so the caller rewrites only those records."""

    hosts: frozenset[str] = frozenset()
    cluster: bool = False
    catalog: bool = False
    deadletter: str | None = None
    """Why the event could not be applied (the caller dead-letters it), else None."""


NO_CHANGES: Final = Changes()


class Acc:
    """Collects changes during one call (one set, no per-change allocation)."""

    __slots__ = ("at_seq", "at_time", "catalog", "cluster", "hosts")

    def __init__(self, at_seq: int = 0, at_time: float = 0.0) -> None:
        self.hosts: set[str] = set()
        self.cluster = False
        self.catalog = False
        self.at_seq = at_seq
        """`as_of` stamped on records an event changes (its own seq and time, but see pending)."""
        self.at_time = at_time

    def touch(self, host: str | None) -> None:
        if host is None:
            self.cluster = True
        else:
            self.hosts.add(host)

    def result(self, deadletter: str | None = None) -> Changes:
        if not self.hosts and not self.cluster and not self.catalog and deadletter is None:
            return NO_CHANGES
        return Changes(hosts=frozenset(self.hosts), cluster=self.cluster,
                       catalog=self.catalog, deadletter=deadletter)


def stamp(rec: Record, acc: Acc) -> None:
    """Stamp `rec` as of the event being applied (its `as_of`)."""
    rec.as_seq = acc.at_seq
    rec.as_time = acc.at_time
