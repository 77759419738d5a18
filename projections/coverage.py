"""How far CRR_SNAPSHOT covers CRR_EVENTS, from the projector status records it holds.

Pure: no IO.  One unpartitioned projector writes `crr.v1.snapshot.projector`;
N partitions write `crr.v1.snapshot.projector.<k>`, each covering only its
own subjects.  A reader wants one number — "every event up to this
`CRR_EVENTS` sequence is reflected in the snapshot" — so it takes the
minimum of the partitions' `covered_seq`: every event belongs to some
partition (the catalog to all, cluster subjects to 0), and partition k has
written everything of its own up to its `covered_seq`.

Layouts change (an operator repartitions, or goes back to one projector)
and the compacted stream keeps the old status records.  The newest status
record (highest CRR_SNAPSHOT sequence) says which layout is current: its
`partitions` N picks the records `.0`…`.N-1` written under the same N (or
the unpartitioned record); the others are left-overs and ignored.  Until
every partition of the current layout has written a status, the position
is 0 ("not known"), never a partial minimum.
"""

from __future__ import annotations

from crr.schemas.snapshot import ProjectorStatus


def covered(status: ProjectorStatus) -> int:
    """The `CRR_EVENTS` sequence one status record vouches for (see `covered_seq`)."""
    if status.covered_seq:
        return status.covered_seq
    # A writer from before `covered_seq`: unpartitioned, `last_seq` covers everything up
    # to it; a partition's `last_seq` only its own subjects, which proves nothing.
    return status.last_seq if status.partition is None else 0


class Coverage:
    """The projector status records seen so far, and the position they add up to.

    Feed it every record on `crr.v1.snapshot.projector[.<k>]` with its
    CRR_SNAPSHOT sequence (`add`); read `position` and `current`.
    """

    __slots__ = ("_records",)

    def __init__(self) -> None:
        self._records: dict[str, tuple[int, ProjectorStatus]] = {}

    def add(self, subject: str, snapshot_seq: int, status: ProjectorStatus) -> None:
        """A status record as read from CRR_SNAPSHOT (`subject` tells the records apart)."""
        self._records[subject] = (snapshot_seq, status)

    def remove(self, subject: str) -> None:
        """The record on `subject` was deleted or purged."""
        self._records.pop(subject, None)

    @property
    def newest(self) -> ProjectorStatus | None:
        """The most recently written status record (None: none seen)."""
        if not self._records:
            return None
        return max(self._records.values(), key=lambda r: r[0])[1]

    @property
    def current(self) -> list[ProjectorStatus]:
        """The status records of the current layout (partitions in order; may be incomplete)."""
        newest = self.newest
        if newest is None:
            return []
        if newest.partition is None:
            return [newest]
        n = newest.partitions
        by_partition: dict[int, tuple[int, ProjectorStatus]] = {}
        for seq, st in self._records.values():
            if st.partition is None or st.partitions != n:
                continue
            if n is not None and not 0 <= st.partition < n:
                continue
            known = by_partition.get(st.partition)
            if known is None or seq > known[0]:
                by_partition[st.partition] = (seq, st)
        return [by_partition[k][1] for k in sorted(by_partition)]

    @property
    def expected(self) -> int | None:
        """How many records the current layout has (None: unknown — an older writer)."""
        newest = self.newest
        if newest is None:
            return None
        return 1 if newest.partition is None else newest.partitions

    @property
    def position(self) -> int:
        """Every `CRR_EVENTS` event up to this sequence is reflected in CRR_SNAPSHOT.

        0 until every record of the current layout is there."""
        current = self.current
        expected = self.expected
        if not current or expected is None or len(current) < expected:
            return 0
        return min(covered(st) for st in current)
