"""An ordered reader of a subject nothing was written to is ready at once, also when the
stream holds other subjects (DeliverLastPerSubject then starts the consumer at the stream's
last sequence, which once left such a reader waiting for ever); so the active catalog reads
as "none" at once on a server whose projector has written only its status."""

from __future__ import annotations

from nats.aio.client import Client

from crr.bus.catalog_watch import fetch_catalog
from crr.bus.ordered import OrderedReader, StoredMessage
from crr.bus.outbox import Outbox
from crr.bus.streams import provision
from crr.schemas.subjects import SNAPSHOT_CATALOG, SNAPSHOT_PROJECTOR, SNAPSHOT_STREAM


async def test_reader_of_an_unwritten_subject_is_ready_at_once(nc: Client) -> None:
    """Other subjects hold records, ours none: ready within 2 s, nothing handled; then a
    record on ours is handled live."""
    await provision(nc)
    for _ in range(3):
        await nc.jetstream().publish(SNAPSHOT_PROJECTOR, b"{}")
    got: list[StoredMessage] = []
    reader = OrderedReader(nc, stream=SNAPSHOT_STREAM, subject=SNAPSHOT_CATALOG,
                           handler=got.append)
    await reader.start()
    try:
        await reader.wait_ready(2.0)
        assert got == []
        assert await fetch_catalog(nc, timeout=2.0) is None
    finally:
        await reader.stop()


async def test_outbox_tells_of_each_acknowledged_publish(nc: Client) -> None:
    """`Outbox.on_ack` gets subject, payload and stream sequence of every stored message."""
    await provision(nc)
    acks: list[tuple[str, bytes, int]] = []
    outbox = Outbox(nc)
    outbox.on_ack = lambda subject, payload, seq: acks.append((subject, payload, seq))
    await outbox.start()
    outbox.put("crr.v1.report.host.n1.r", b'{"a":1}', msg_id="r/n1/b/1")
    outbox.put("crr.v1.health.host.n1.r", b'{"b":2}', msg_id="r/n1/b/2", keep="all")
    await outbox.flush()
    await outbox.close()
    seqs = {s: seq for s, _, seq in acks}
    assert sorted((s, p) for s, p, _ in acks) == [("crr.v1.health.host.n1.r", b'{"b":2}'),
                                                  ("crr.v1.report.host.n1.r", b'{"a":1}')]
    info = await nc.jetstream().stream_info("CRR_EVENTS")
    assert sorted(seqs.values()) == [info.state.last_seq - 1, info.state.last_seq]
