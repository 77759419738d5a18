"""The projector service on a real nats-server: apply, reject, dead-letter, expire, restart."""

from __future__ import annotations

import asyncio
import time

from nats.aio.client import Client

from crr.bus.ordered import OrderedReader, StoredMessage
from crr.schemas.codec import decode
from crr.schemas.events import DeadLetter
from crr.schemas.snapshot import HostSnapshot
from crr.schemas.subjects import DEADLETTER, SNAPSHOT_STREAM, host_snapshot_subject
from crr.schemas.wire_time import parse_time
from tests.support.faults import eventually
from tests.support.projector import (
    publish_catalog,
    publish_report,
    read_consistent_snapshot,
    running_projector,
    stored_host,
)


async def test_report_becomes_fresh_snapshot(nc: Client) -> None:
    """A valid report is in CRR_SNAPSHOT, fresh, once the projector passes its seq."""
    async with running_projector(nc) as p:
        await publish_catalog(nc)
        seq = await publish_report(nc, "scratch", "node1.dc2", {"scratch_free": 812.5})
        await p.wait_until(seq)
        _, snap = await stored_host(nc, "node1.dc2")
    entry = snap.values["scratch_free"]
    assert (entry.value, entry.state, entry.reporter) == (812.5, "fresh", "scratch")
    assert snap.as_of.seq == seq


async def test_invalid_value_rejected_previous_kept(nc: Client) -> None:
    """A negative value (min 0) and a value of another reporter are rejected and counted;
    the previous valid value stays and the valid rest of the report applies."""
    async with running_projector(nc) as p:
        await publish_catalog(nc)
        await publish_report(nc, "scratch", "n1", {"scratch_free": 100.0}, seq=1)
        seq = await publish_report(nc, "scratch", "n1",
                                   {"scratch_free": -5, "datasets": ["x"]}, seq=2)
        await p.wait_until(seq)
        _, snap = await stored_host(nc, "n1")
    assert snap.values["scratch_free"].value == 100.0
    assert "datasets" not in snap.values
    rep = snap.reporters["scratch"]
    assert rep.state == "rejecting"
    assert rep.rejected == 2
    assert any("datasets" in r for r in rep.rejections)


async def test_garbage_is_dead_lettered_and_projector_goes_on(nc: Client) -> None:
    """Garbage bytes go to crr.v1.deadletter with their seq and reason; later events apply."""
    letters: list[DeadLetter] = []
    got = asyncio.Event()

    def on_letter(m: StoredMessage) -> None:
        letters.append(decode(m.data, DeadLetter))
        got.set()

    reader = OrderedReader(nc, stream="CRR_EVENTS", subject=DEADLETTER, handler=on_letter)
    await reader.start()
    try:
        async with running_projector(nc) as p:
            await publish_catalog(nc)
            bad = await publish_report(nc, "scratch", "n1", {}, raw=b"\x00\xffnot json")
            good = await publish_report(nc, "scratch", "n1", {"scratch_free": 1.0}, seq=2)
            await p.wait_until(good)
            await asyncio.wait_for(got.wait(), 10)
            _, snap = await stored_host(nc, "n1")
    finally:
        await reader.stop()
    assert letters[0].seq == bad
    assert letters[0].subject == "crr.v1.report.host.n1.scratch"
    assert "JSON" in letters[0].reason or "decode" in letters[0].reason.lower()
    assert snap.values["scratch_free"].value == 1.0


async def test_subject_payload_mismatch_is_rejected(nc: Client) -> None:
    """A payload claiming another host than its subject does not change either host."""
    async with running_projector(nc) as p:
        await publish_catalog(nc)
        await publish_report(nc, "scratch", "n1", {"scratch_free": 5.0}, seq=1)
        forged = (b'{"reporter":"scratch","host":"n2","boot":"b","seq":9,'
                  b'"observed_at":"2026-12-02T14:00:00Z","values":{"scratch_free":1}}')
        seq = await publish_report(nc, "scratch", "n1", {}, raw=forged, seq=2)
        await p.wait_until(seq)
        _, snap = await stored_host(nc, "n1")
        assert snap.values["scratch_free"].value == 5.0
        msg = await nc.jetstream().stream_info(SNAPSHOT_STREAM,
                                               subjects_filter=host_snapshot_subject("n2"))
        assert not msg.state.subjects


async def test_reports_before_catalog_are_kept(nc: Client) -> None:
    """Events published before any catalog are applied when the catalog arrives."""
    async with running_projector(nc) as p:
        await publish_report(nc, "scratch", "early", {"scratch_free": 42.0})
        seq = await publish_catalog(nc)
        await p.wait_until(seq)
        _, snap = await stored_host(nc, "early")
    assert snap.values["scratch_free"].value == 42.0


async def test_value_turns_stale_promptly(nc: Client) -> None:
    """A 200 ms value (grace 100 ms) is published stale soon after its deadline, with
    stale_since = expires_at and the last value kept."""
    seen: asyncio.Queue[HostSnapshot] = asyncio.Queue()
    reader = OrderedReader(nc, stream=SNAPSHOT_STREAM, subject=host_snapshot_subject("b1"),
                           handler=lambda m: seen.put_nowait(decode(m.data, HostSnapshot)))
    await reader.start()
    try:
        async with running_projector(nc):
            await publish_catalog(nc)
            await publish_report(nc, "blinker", "b1", {"blink": 3.0})
            while True:
                snap = await asyncio.wait_for(seen.get(), 10)
                if snap.values["blink"].state == "stale":
                    break
            seen_at = time.time()
    finally:
        await reader.stop()
    entry = snap.values["blink"]
    assert entry.value is None
    assert entry.last_value == 3.0
    assert entry.stale_since == entry.expires_at
    lateness = seen_at - parse_time(entry.expires_at)
    assert 0 <= lateness < 2.0, lateness


async def test_restart_rebuilds_identical_snapshot_without_writes(nc: Client) -> None:
    """A restarted projector rebuilds from last-per-subject and rewrites nothing."""
    async with running_projector(nc) as p:
        await publish_catalog(nc)
        for i, host in enumerate(["a", "b", "c"]):
            await publish_report(nc, "scratch", host, {"scratch_free": float(i)}, seq=i + 1)
            await publish_report(nc, "datasets", host, {"datasets": ["c4", "imagenet"]},
                                 seq=i + 1)
        last = await publish_report(nc, "flexlm", None, {"matlab_free": 7.0})
        await p.wait_until(last)
    before = {h: await stored_host(nc, h) for h in ["a", "b", "c"]}
    async with running_projector(nc) as p2:
        assert p2.writes == 0
        # New events after the restart still apply.
        seq = await publish_report(nc, "scratch", "a", {"scratch_free": 99.0}, seq=10)
        await p2.wait_until(seq)
        after = {h: await stored_host(nc, h) for h in ["b", "c"]}
        _, a = await stored_host(nc, "a")
    assert after == {h: before[h] for h in ["b", "c"]}
    assert a.values["scratch_free"].value == 99.0


async def test_status_covers_a_burst_once_caught_up(nc: Client) -> None:
    """A burst the projector folds behind (status not after every flush while behind):
    once it has caught up, a status covers the last event without waiting for the status
    interval (an hour here), and every record it covers is stored before it."""
    async with running_projector(nc, status_interval=3600) as p:
        await publish_catalog(nc)
        hosts = [f"burst{i}" for i in range(300)]
        seqs: list[int] = []
        for round_ in range(1, 6):
            seqs += await asyncio.gather(*(
                publish_report(nc, "scratch", h, {"scratch_free": float(round_)}, seq=round_)
                for h in hosts))
        last = max(seqs)
        await p.wait_until(last)

        async def covered() -> bool:
            status, _ = await read_consistent_snapshot(nc)
            return status.last_seq == last

        await eventually(covered, 10, "a status covering the burst's last event")
        status, records = await read_consistent_snapshot(nc)
    assert status.applied == p.applied
    assert {decode(records[host_snapshot_subject(h)], HostSnapshot)
            .values["scratch_free"].value for h in hosts} == {5.0}
