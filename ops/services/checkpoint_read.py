"""Reading the projector's checkpoint: what CRR_SNAPSHOT holds, last record per subject.

One small function, so that the projector's restore reads CRR_SNAPSHOT the
way every other reader does: today with the lowest-level ordered read
(`ops.services.replay.read_snapshot_bytes`: one `bus.ordered.OrderedReader`,
DeliverLastPerSubject); switching it to the
shared follower of compacted streams is a change of this function only.
"""

from __future__ import annotations

from nats.aio.client import Client

from ops.services.replay import read_snapshot_bytes

RawRecords = dict[str, tuple[int, bytes]]
"""CRR_SNAPSHOT subject -> (stream sequence, raw bytes) of its last record."""


async def load_checkpoint(nc: Client, timeout: float = 300.0) -> RawRecords:
    """Every record CRR_SNAPSHOT holds now (empty if the stream holds none)."""
    return await read_snapshot_bytes(nc, timeout)
