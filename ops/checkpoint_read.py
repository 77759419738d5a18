"""Reading the projector's checkpoint: what CRR_SNAPSHOT holds, last record per subject.

One small function, so that the projector's restore reads CRR_SNAPSHOT the
way every other reader does: today with the lowest-level ordered read
(`bus.ordered.OrderedReader`, DeliverLastPerSubject); switching it to the
shared follower of compacted streams is a change of this function only.
"""

from __future__ import annotations

from nats.aio.client import Client

from bus.ordered import OrderedReader, StoredMessage
from bus.subjects import SNAPSHOT_STREAM

RawRecords = dict[str, tuple[int, bytes]]
"""CRR_SNAPSHOT subject -> (stream sequence, raw bytes) of its last record."""


async def load_checkpoint(nc: Client, timeout: float = 300.0) -> RawRecords:
    """Every record CRR_SNAPSHOT holds now (empty if the stream holds none)."""
    out: RawRecords = {}

    def keep(m: StoredMessage) -> None:
        out[m.subject] = (m.seq, m.data)

    reader = OrderedReader(nc, stream=SNAPSHOT_STREAM, subject="crr.v1.snapshot.>",
                           handler=keep)
    await reader.start()
    try:
        await reader.wait_ready(timeout)
    finally:
        await reader.stop()
    return out
