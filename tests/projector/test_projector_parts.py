"""The projector's named parts, each on its own: `Position` and `SnapshotWriter` (real server)."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client

from crr.bus.tracing import SpanContext
from crr.projections.record.columns import COLUMNS_HEADER
from crr.projector.checkpoint_read import load_checkpoint
from crr.projector.position import Position
from crr.projector.snapshot_writer import SnapshotWriter, WrittenRecords
from crr.schemas.errors import CrrTimeoutError
from crr.schemas.events import DeadLetter
from crr.schemas.subjects import DEADLETTER, EVENTS_STREAM, SNAPSHOT_STREAM, host_snapshot_subject


async def test_position_tracks_folded_dropped_and_written(nc: Client) -> None:
    """wait_until returns once a flush covers the sequence; coverage of an unpartitioned
    projector is what it wrote; a restart sets every position at once."""
    pos = Position(nc.jetstream(), None)
    pos.folded(5, pending=2)
    pos.dropped(6, pending=1)
    assert (pos.applied, pos.handled, pos.pending) == (5, 6, 1)
    waiter = asyncio.create_task(pos.wait_until(5, timeout=5))
    await pos.flushed(5, 6)
    await waiter
    with pytest.raises(CrrTimeoutError, match="projector at 5, not 9"):
        await pos.wait_until(9, timeout=0.01)
    await pos.coverage()
    assert (pos.covered, pos.stream_last) == (6, 6)
    await pos.restart_at(40, covered=41, stream_last=45)
    assert (pos.applied, pos.written, pos.covered, pos.stream_last) == (40, 40, 41, 45)
    await pos.wait_until(40, timeout=1)


async def test_partition_coverage_asks_the_server(nc: Client) -> None:
    """An idle partition is covered up to the stream's end when none of its subjects
    has an event after what it wrote."""
    js = nc.jetstream()
    for i in range(3):
        await js.publish(f"crr.v1.report.host.n{i}.r", b"{}")
    last = (await js.stream_info(EVENTS_STREAM)).state.last_seq
    pos = Position(js, ["crr.v1.health.host.*.*"])  # nothing of its own in the stream
    await pos.coverage()
    assert pos.covered == last


async def test_writer_skips_what_the_stream_holds(nc: Client) -> None:
    """A record is written once; the same bytes again, or after loading what CRR_SNAPSHOT
    holds into a new writer, are not written; a dead letter goes out once per event."""
    subject = host_snapshot_subject("n1")
    writer = SnapshotWriter(nc)
    try:
        await writer.write(iter([(subject, b'{"a":1}', None)]))
        await writer.write(iter([(subject, b'{"a":1}', None)]))
        assert writer.writes == 1
        letter = DeadLetter(seq=7, subject="crr.v1.report.host.n1.r", reason="bad",
                            payload="{", received_at="2027-01-15T08:00:00.000Z")
        await writer.write(iter(()), [letter, letter])
    finally:
        await writer.close()
    again = SnapshotWriter(nc)
    try:
        again.load(await load_checkpoint(nc))
        assert await again.publish(subject, b'{"a":1}') is None
        assert await again.publish(subject, b'{"a":2}') is not None
    finally:
        await again.close()
    info = await nc.jetstream().stream_info(SNAPSHOT_STREAM)
    assert info.state.messages == 1
    msg = await nc.jetstream().get_last_msg(EVENTS_STREAM, DEADLETTER)
    assert msg.seq == (await nc.jetstream().stream_info(EVENTS_STREAM)).state.last_seq
    assert (await nc.jetstream().stream_info(EVENTS_STREAM)).state.messages == 1


@pytest.mark.parametrize("keep_bytes", [False, True])
def test_written_records_loaded_are_compared_whole_until_digested(keep_bytes: bool) -> None:
    """Records read at start are kept whole (no digest on the restart's path) and still
    tell unchanged from changed; `digest_some` then keeps only digests."""
    written = WrittenRecords(keep_bytes=keep_bytes)
    written.load([("a", b"one"), ("b", b"two"), ("c", b"three")])
    assert (len(written), written.unhashed) == (3, 3)
    assert written.same("a", b"one")
    assert not written.same("a", b"uno")
    written.set("a", b"uno")
    assert written.same("a", b"uno", WrittenRecords.digest(b"uno"))
    assert (len(written), written.unhashed) == (3, 2)
    written.digest_some(1)
    written.digest_some(5)
    assert (len(written), written.unhashed) == (3, 0)
    assert written.same("b", b"two")
    assert written.same("c", b"three")
    assert not written.same("c", b"four")
    written.pop("b")
    assert not written.same("b", b"two")
    assert len(written.items()) == (2 if keep_bytes else 0)


@pytest.mark.parametrize("traced", [False, True], ids=["pipelined", "one-by-one"])
async def test_writer_sends_columns_unless_the_record_would_not_fit(nc: Client,
                                                                   traced: bool) -> None:
    """A record goes out with its columns header; one that the header would push past the
    server's max_payload goes out without it (readers read it whole), never not at all."""
    big = b'{"a":"' + b"x" * (nc.max_payload - 8 * 1024) + b'"}'
    columns = '{"host":"n2","v":{"a":"' + "y" * 6000 + '"}}'
    writer = SnapshotWriter(nc)
    parents: dict[str, SpanContext] = {}
    if traced:  # the one-by-one path (records continuing a trace, fenced writes)
        parent = SpanContext(trace_id=1, span_id=1, is_remote=True)
        parents = {host_snapshot_subject(h): parent for h in ("n1", "n2")}
    try:
        await writer.write(iter([(host_snapshot_subject("n1"), b'{"a":1}', '{"host":"n1"}'),
                                 (host_snapshot_subject("n2"), big, columns)]), (), parents)
        assert not parents  # each trace continued by its record's write
        assert writer.writes == 2
    finally:
        await writer.close()
    js = nc.jetstream()
    small = await js.get_last_msg(SNAPSHOT_STREAM, host_snapshot_subject("n1"))
    assert small.headers is not None
    assert small.headers[COLUMNS_HEADER] == '{"host":"n1"}'
    stored = await js.get_last_msg(SNAPSHOT_STREAM, host_snapshot_subject("n2"))
    assert stored.data == big
    assert COLUMNS_HEADER not in (stored.headers or {})
