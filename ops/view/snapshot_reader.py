"""Read the whole of CRR_SNAPSHOT once (CLI listings): hosts, cluster, catalog, projectors."""

from __future__ import annotations

from dataclasses import dataclass, field

from crr.bus.connection import Connection
from crr.bus.follower import load_compacted
from crr.bus.ordered import StoredMessage
from crr.projections.coverage import Coverage
from crr.schemas.catalog import Catalog
from crr.schemas.codec import decode
from crr.schemas.snapshot import ClusterSnapshot, HostSnapshot, ProjectorStatus
from crr.schemas.subjects import SNAPSHOT_ALL, SNAPSHOT_STREAM, snapshot_host, snapshot_kind


@dataclass
class SnapshotContents:
    """Everything CRR_SNAPSHOT held when it was read."""

    hosts: dict[str, HostSnapshot] = field(default_factory=dict)
    cluster: ClusterSnapshot | None = None
    catalog: Catalog | None = None
    projector: ProjectorStatus | None = None
    """The newest projector status record (for one projector: its status)."""
    last_seq: int = 0
    coverage: Coverage = field(default_factory=Coverage, compare=False, repr=False)
    """Every projector status record (`crr.v1.snapshot.projector[.<k>]`) read."""

    @property
    def projectors(self) -> list[ProjectorStatus]:
        """The status records of the current projector layout (one, or one per partition)."""
        return self.coverage.current

    @property
    def projector_position(self) -> int:
        """Every CRR_EVENTS event up to this sequence is in the snapshot (0: not known).

        The minimum `covered_seq` over the current layout (`crr.projections.coverage`)."""
        return self.coverage.position


def absorb(contents: SnapshotContents, m: StoredMessage) -> None:
    """Fold one CRR_SNAPSHOT message into `contents` (last write per subject wins)."""
    contents.last_seq = max(contents.last_seq, m.seq)
    match snapshot_kind(m.subject):
        case "host":
            if m.data:
                snap = decode(m.data, HostSnapshot)
                contents.hosts[snap.host] = snap
            else:  # a delete marker (`crr hosts forget`): the host is gone
                contents.hosts.pop(snapshot_host(m.subject), None)
        case "cluster":
            contents.cluster = decode(m.data, ClusterSnapshot)
        case "catalog":
            contents.catalog = decode(m.data, Catalog)
        case "projector":
            if m.data:
                contents.coverage.add(m.subject, m.seq, decode(m.data, ProjectorStatus))
            else:  # a purge or delete marker
                contents.coverage.remove(m.subject)
            contents.projector = contents.coverage.newest


async def read_snapshot(nc: Connection, timeout: float = 30.0) -> SnapshotContents:
    """Load the current snapshot (`crr.bus.follower.load_compacted`: last per subject)."""
    contents = SnapshotContents()
    await load_compacted(nc, stream=SNAPSHOT_STREAM, subject=SNAPSHOT_ALL,
                         handler=lambda m: absorb(contents, m), timeout=timeout)
    return contents
