"""Read the whole of CRR_SNAPSHOT once (CLI listings): hosts, cluster, catalog, projector status."""

from __future__ import annotations

from dataclasses import dataclass, field

from nats.aio.client import Client

from bus.ordered import OrderedReader, StoredMessage
from bus.subjects import (
    SNAPSHOT_CATALOG,
    SNAPSHOT_CLUSTER,
    SNAPSHOT_HOST_PREFIX,
    SNAPSHOT_PROJECTOR,
    SNAPSHOT_STREAM,
)
from schemas.catalog import Catalog
from schemas.codec import decode
from schemas.snapshot import ClusterSnapshot, HostSnapshot, ProjectorStatus


@dataclass
class SnapshotContents:
    """Everything CRR_SNAPSHOT held when it was read."""

    hosts: dict[str, HostSnapshot] = field(default_factory=dict)
    cluster: ClusterSnapshot | None = None
    catalog: Catalog | None = None
    projector: ProjectorStatus | None = None
    last_seq: int = 0


def absorb(contents: SnapshotContents, m: StoredMessage) -> None:
    """Fold one CRR_SNAPSHOT message into `contents` (last write per subject wins)."""
    contents.last_seq = max(contents.last_seq, m.seq)
    if m.subject.startswith(SNAPSHOT_HOST_PREFIX):
        snap = decode(m.data, HostSnapshot)
        contents.hosts[snap.host] = snap
    elif m.subject == SNAPSHOT_CLUSTER:
        contents.cluster = decode(m.data, ClusterSnapshot)
    elif m.subject == SNAPSHOT_CATALOG:
        contents.catalog = decode(m.data, Catalog)
    elif m.subject == SNAPSHOT_PROJECTOR:
        contents.projector = decode(m.data, ProjectorStatus)


async def read_snapshot(nc: Client, timeout: float = 30.0) -> SnapshotContents:
    """Load the current snapshot with one ordered consumer (DeliverLastPerSubject)."""
    contents = SnapshotContents()
    reader = OrderedReader(nc, stream=SNAPSHOT_STREAM, subject="crr.v1.snapshot.>",
                           handler=lambda m: absorb(contents, m))
    await reader.start()
    try:
        await reader.wait_ready(timeout)
    finally:
        await reader.stop()
    return contents
