"""Reading the projector's checkpoint: what CRR_SNAPSHOT holds, last record per subject.

One small function, so that the projector's restore reads CRR_SNAPSHOT the
way every other reader does: today with the lowest-level ordered read
(`crr.bus.follower.read_snapshot_bytes`: one `crr.bus.ordered.OrderedReader`,
DeliverLastPerSubject); switching it to the
shared follower of compacted streams is a change of this function only.
"""

from __future__ import annotations

import logging

from crr.bus.connection import Connection
from crr.bus.follower import read_snapshot_bytes
from crr.schemas.subjects import SNAPSHOT_STREAM

log = logging.getLogger("crr.projector")

RawRecords = dict[str, tuple[int, bytes]]
"""CRR_SNAPSHOT subject -> (stream sequence, raw bytes) of its last record."""


async def load_checkpoint(nc: Connection, timeout: float = 300.0) -> RawRecords:
    """Every record CRR_SNAPSHOT holds now (empty if the stream holds none).

    Said at INFO before the read: with many hosts it takes seconds (and a restore
    follows), which an operator watching a start-up (or a test) can tell apart."""
    log.info("projector: reading the checkpoint (the last record per subject of %s)",
             SNAPSHOT_STREAM)
    records = await read_snapshot_bytes(nc, timeout)
    log.info("projector: checkpoint read, %d record(s)", len(records))
    return records
