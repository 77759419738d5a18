"""A restarted projector restores from CRR_SNAPSHOT (the snapshot is the checkpoint).

Real nats-server, real Projector.  A restart after partial reports keeps every
value, deadline, last_value and counter and writes no record; a kill between a
record write and the status write neither applies an event twice nor loses one;
a snapshot that is gone, of another layout or undecodable makes the projector
rebuild from CRR_EVENTS and say why — never crash.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client

from crr.bus.follower import read_snapshot_bytes
from crr.bus.streams import StreamSettings, provision
from crr.history.replay import run_replay
from crr.projections.history import CapturePoint, Replay, json_differences
from crr.projector.service import Projector
from crr.schemas.catalog_loader import load_catalog_text
from crr.schemas.codec import decode, encode
from crr.schemas.snapshot import HostSnapshot, ProjectorStatus
from crr.schemas.subjects import (
    EVENTS_STREAM,
    SNAPSHOT_PROJECTOR,
    SNAPSHOT_STREAM,
    host_snapshot_subject,
    status_subject,
)
from tests.history.test_replay import cli
from tests.support.faults import CrrProcess, caught_up, eventually
from tests.support.projector import (
    FAST_CATALOG_YAML,
    publish_catalog,
    publish_report,
    running_partitions,
)

HOSTS = ["node1", "node2", "gpu-7.dc2", "x"]
LONGER = load_catalog_text(FAST_CATALOG_YAML.replace(
    "reporter: scratch, interval: 60s", "reporter: scratch, interval: 90s"))


async def everything_written(nc: Client, running: list[Projector]) -> None:
    """Every partition has written CRR_EVENTS's last event, and its status after it."""
    last = (await nc.jetstream().stream_info(EVENTS_STREAM)).state.last_seq
    for p in running:
        if p.partition is None:
            await p.wait_until(last)

    async def covered() -> bool | None:
        raw = await read_snapshot_bytes(nc)
        for p in running:
            entry = raw.get(status_subject(p.partition))
            if entry is None or decode(entry[1], ProjectorStatus).covered_seq < last:
                return None
        return True

    await eventually(covered, 20, f"every status covers seq {last}")


async def partial_reports(nc: Client) -> None:
    """The issue's scenario: datasets and scratch_total once, then reports on the same
    subjects that omit them; one rejected value on node2."""
    await publish_catalog(nc)
    for i, host in enumerate(HOSTS):
        await publish_report(nc, "scratch", host, {"scratch_free": 10.0 + i}, seq=1)
        await publish_report(nc, "datasets", host, {"datasets": ["imagenet", "c4"]}, seq=1)
    await publish_report(nc, "flexlm", None, {"matlab_free": 4}, seq=1)
    await publish_report(nc, "scratch", "node2", {"scratch_free": -1}, seq=2)  # rejected
    for host in HOSTS:
        await publish_report(nc, "scratch", host, {}, seq=3)  # omits scratch_free
        await publish_report(nc, "datasets", host, {}, seq=2)  # omits datasets


def records_of(raw: dict[str, tuple[int, bytes]]) -> dict[str, tuple[int, bytes]]:
    """Host and cluster records (not statuses, catalog, leases), with their stream seqs."""
    return {s: r for s, r in raw.items()
            if s.startswith("crr.v1.snapshot.host.") or s == "crr.v1.snapshot.cluster"}


@pytest.mark.parametrize("partitions", [1, 2])
async def test_restart_after_partial_reports_restores_everything(
        nc: Client, nats_url: str, capsys: pytest.CaptureFixture[str], partitions: int) -> None:
    """Restart after partial reports: every record is byte-identical (values, deadlines,
    last_value, rejected_total), none is rewritten, and the counters go on."""
    await provision(nc, StreamSettings(partitions=partitions), update=True)
    async with running_partitions(nc, partitions) as running:
        await partial_reports(nc)
        await everything_written(nc, running)
        before = records_of(await read_snapshot_bytes(nc))
        counts = [(p.applied, p.deadletter_count) for p in running]
    node2 = decode(before[host_snapshot_subject("node2")][1], HostSnapshot)
    assert node2.values["datasets"].value == ["c4", "imagenet"]
    assert node2.reporters["scratch"].rejected_total == 1
    async with running_partitions(nc, partitions) as again:
        assert all(p.restored for p in again), [p.start_note for p in again]
        assert [p.writes - p.status_writes for p in again] == [0] * partitions
        assert [(p.applied, p.deadletter_count) for p in again] == counts
        after = records_of(await read_snapshot_bytes(nc))
        assert after == before  # same bytes at the same stream sequences: nothing written
        # A later partial report still finds the values the earlier one set.
        seq = await publish_report(nc, "scratch", "node2", {"scratch_free": -2}, seq=4)
        await everything_written(nc, again)
        assert max(p.position for p in again) >= seq
        raw = await read_snapshot_bytes(nc)
        rec = decode(raw[host_snapshot_subject("node2")][1], HostSnapshot)
        assert rec.values["datasets"].state == "fresh"
        assert rec.values["scratch_free"].value == 11.0
        assert rec.reporters["scratch"].rejected_total == 2
        status = decode(raw[status_subject(again[0].partition)][1], ProjectorStatus)
        assert status.start.startswith("restored from CRR_SNAPSHOT"), status.start
    await assert_replay_equals_live(nc)
    # `crr replay --verify` replays the input the restored projector stands for.
    code, out, err = await cli(["replay", "--server", nats_url, "--verify"], capsys)
    assert code == 0, out + err
    assert out.count("byte-identical") == partitions, out


async def assert_replay_equals_live(nc: Client) -> None:
    """The whole history replayed without a restart gives the live host records."""
    last = (await nc.jetstream().stream_info(EVENTS_STREAM)).state.last_seq
    replay = Replay([CapturePoint(seq=last)])
    await run_replay(replay, nc=nc, file=None, stop_seq=last, label="test")
    mine = {s: b for s, b in replay.captures[0].records().items()
            if s.startswith("crr.v1.snapshot.host.")}
    live = {s: b for s, (_, b) in (await read_snapshot_bytes(nc)).items()
            if s.startswith("crr.v1.snapshot.host.")}
    differences = {s: json_differences(mine[s], live[s]) for s in mine
                   if s in live and mine[s] != live[s]}
    assert differences == {}
    assert mine == live


async def test_kill_between_record_and_status_write_applies_nothing_twice(
        nc: Client) -> None:
    """CRR_SNAPSHOT holding records newer than the status (what a SIGKILL between a record
    write and the status write leaves): the restart neither applies those events again
    (rejected_total would double) nor loses any, and rewrites nothing."""
    js = nc.jetstream()
    async with running_partitions(nc, 1) as running:
        await partial_reports(nc)
        await everything_written(nc, running)
        old_status = (await js.get_last_msg(SNAPSHOT_STREAM, SNAPSHOT_PROJECTOR)).data
        # Events after that status: written as records, and then the status "never was".
        await publish_report(nc, "scratch", "node1", {"scratch_free": -3}, seq=5)
        await publish_report(nc, "datasets", "node1", {"datasets": ["c4"]}, seq=5)
        # A catalog change in the window: it restamps every host holding scratch_free (and
        # the status's catalog is no longer the catalog record: it is read from CRR_EVENTS).
        await publish_catalog(nc, LONGER)
        await publish_report(nc, "scratch", "x", {"scratch_free": 1.5}, seq=5)
        await everything_written(nc, running)
        before = records_of(await read_snapshot_bytes(nc))
        applied = running[0].applied
    assert old_status is not None
    await js.publish(SNAPSHOT_PROJECTOR, old_status)  # the status of before those events
    async with running_partitions(nc, 1) as again:
        p = again[0]
        assert p.restored, p.start_note
        deferred = re.search(r"(\d+) written after the status", p.start_note)
        assert deferred is not None, p.start_note
        assert int(deferred.group(1)) == len(HOSTS), p.start_note
        assert p.applied == applied
        assert records_of(await read_snapshot_bytes(nc)) == before  # nothing rewritten
    node1 = decode(before[host_snapshot_subject("node1")][1], HostSnapshot)
    assert node1.reporters["scratch"].rejected_total == 1
    assert node1.values["datasets"].value == ["c4"]
    await assert_replay_equals_live(nc)


async def start_note(nc: Client, **options: Any) -> tuple[str, bool]:
    """Run a projector until ready; its status's `start` and whether it restored."""
    async with running_partitions(nc, 1, **options) as running:
        await everything_written(nc, running)
        entry = (await read_snapshot_bytes(nc))[SNAPSHOT_PROJECTOR]
        return decode(entry[1], ProjectorStatus).start, running[0].restored


async def test_deleted_snapshot_stream_rebuilds_and_says_so(
        nc: Client, caplog: pytest.LogCaptureFixture) -> None:
    """CRR_SNAPSHOT deleted: the projector rebuilds from CRR_EVENTS and says why."""
    caplog.set_level(logging.INFO, logger="crr.projector")
    async with running_partitions(nc, 1) as running:
        await partial_reports(nc)
        await everything_written(nc, running)
        before = records_of(await read_snapshot_bytes(nc))
    await nc.jetstream().delete_stream(SNAPSHOT_STREAM)
    note, restored = await start_note(nc)
    assert not restored
    assert note.startswith("rebuilt from CRR_EVENTS:"), note
    assert "not in CRR_SNAPSHOT" in note
    assert "the fold of 19 retained event(s) from seq 1" in note, note
    assert "values reported only before then are gone" in note, note
    after = records_of(await read_snapshot_bytes(nc))
    # The rebuild folds the whole retained history: the values later partial reports
    # omitted are back, byte for byte as before (docs/contract.md, "Payloads", the snapshot equals
    # a fold of every retained event: never the last event per
    # subject alone).
    assert after.keys() == before.keys()
    assert {s: b for s, (_, b) in after.items()} == {s: b for s, (_, b) in before.items()}
    node1 = decode(after[host_snapshot_subject("node1")][1], HostSnapshot)
    assert node1.values["datasets"].value == ["c4", "imagenet"]
    assert node1.values["scratch_free"].value == 10.0
    assert any("rebuilding from CRR_EVENTS" in r.message for r in caplog.records)


async def test_snapshot_of_another_layout_rebuilds(nc: Client) -> None:
    """A status written for another partition count: rebuild, with the reason."""
    async with running_partitions(nc, 1) as running:
        await partial_reports(nc)
        await everything_written(nc, running)
    entry = await nc.jetstream().get_last_msg(SNAPSHOT_STREAM, SNAPSHOT_PROJECTOR)
    assert entry.data is not None
    status = decode(entry.data, ProjectorStatus)
    forged = encode(ProjectorStatus(**{**{f: getattr(status, f)
                                          for f in status.__struct_fields__},
                                       "partitions": 3}))
    await nc.jetstream().publish(SNAPSHOT_PROJECTOR, forged)
    note, restored = await start_note(nc)
    assert not restored
    assert "partition(s)" in note, note


async def test_undecodable_record_rebuilds_and_is_rewritten(
        nc: Client, caplog: pytest.LogCaptureFixture) -> None:
    """A host record that does not decode: rebuild (logged, in the status), never a
    crash, and the record is written again from events."""
    caplog.set_level(logging.WARNING, logger="crr.projector")
    async with running_partitions(nc, 1) as running:
        await partial_reports(nc)
        await everything_written(nc, running)
    await nc.jetstream().publish(host_snapshot_subject("node1"), b"{not a record")
    note, restored = await start_note(nc)
    assert not restored
    assert "does not decode" in note, note
    raw = await read_snapshot_bytes(nc)
    assert decode(raw[host_snapshot_subject("node1")][1], HostSnapshot).host == "node1"
    assert any("does not decode" in r.message for r in caplog.records)


async def test_two_partitions_restore_their_own_hosts(nc: Client) -> None:
    """Each partition restores only the hosts it owns, and the cluster record is 0's."""
    await provision(nc, StreamSettings(partitions=2), update=True)
    async with running_partitions(nc, 2) as running:
        await partial_reports(nc)
        await everything_written(nc, running)
        owned = [set(p.state.hosts) for p in running]
    async with running_partitions(nc, 2) as again:
        assert [p.host_count for p in again] == [len(hosts) for hosts in owned]
        for p in again:  # a report of each host places its restored record
            for host in owned[again.index(p)]:
                await publish_report(nc, "scratch", host, {"scratch_free": 1.0}, seq=9)
        await everything_written(nc, again)
        assert [set(p.state.hosts) for p in again] == owned
        assert again[0].state.cluster.reporters
        assert not again[1].state.cluster.reporters
        assert all(p.restored for p in again)


async def test_sigkill_under_load_loses_nothing_and_applies_nothing_twice(
        nc: Client, nats_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`crr projector` SIGKILLed while partial reports (some rejected) stream in, another
    started: the live records equal a replay of the whole history without a restart
    (so every rejected value is counted exactly once) and `--verify` passes."""
    args = ["projector", "--server", nats_url]
    first = CrrProcess([*args, "--id", "p1"], tmp_path / "p1.log").start()
    second: CrrProcess | None = None
    rounds = 12
    try:
        await publish_catalog(nc)
        await caught_up(nc, 30, projector_id="p1")  # its start: the catalog, nothing else
        for r in range(rounds):
            for i, host in enumerate(HOSTS):
                values: dict[str, Any] = ({"scratch_free": float(r + i)} if r % 3
                                          else {"scratch_free": -1.0})  # rejected
                await publish_report(nc, "scratch", host, values, seq=10 + r)
                if r % 4 == 0:
                    await publish_report(nc, "datasets", host, {"datasets": [f"d{r}"]},
                                         seq=10 + r)
            if r == 2:
                await caught_up(nc, 30, projector_id="p1")  # a status to restore from
            if r == rounds // 2:
                first.kill()  # wherever it is: folding, writing records, or its status
                second = CrrProcess([*args, "--id", "p2"], tmp_path / "p2.log").start()
        snap = await caught_up(nc, 30, projector_id="p2")
    finally:
        first.stop()
        if second is not None:
            second.stop()
    start = snap.projectors[0].start
    assert start.startswith("restored from CRR_SNAPSHOT"), start
    await assert_replay_equals_live(nc)
    raw = await read_snapshot_bytes(nc)
    rec = decode(raw[host_snapshot_subject("node1")][1], HostSnapshot)
    assert rec.reporters["scratch"].rejected_total == len(range(0, rounds, 3))
    code, out, err = await cli(["replay", "--server", nats_url, "--verify"], capsys)
    assert code == 0, out + err


async def test_a_status_of_checkpoint_format_1_still_restores(nc: Client) -> None:
    """A status from before `next_due_ts` (format 1): the records are read for their first
    deadlines at start, as that projector's successor did; it restores, rewrites nothing."""
    async with running_partitions(nc, 1) as running:
        await partial_reports(nc)
        await everything_written(nc, running)
        before = records_of(await read_snapshot_bytes(nc))
    entry = await nc.jetstream().get_last_msg(SNAPSHOT_STREAM, SNAPSHOT_PROJECTOR)
    assert entry.data is not None
    status = decode(entry.data, ProjectorStatus)
    assert status.checkpoint == 2
    await nc.jetstream().publish(SNAPSHOT_PROJECTOR, encode(msgspec.structs.replace(
        status, checkpoint=1, next_due_ts=None)))
    note, restored = await start_note(nc)
    assert restored, note
    assert note.startswith("restored from CRR_SNAPSHOT"), note
    assert records_of(await read_snapshot_bytes(nc)) == before


async def test_a_record_not_read_at_start_that_does_not_restore_rebuilds(
        nc: Client, caplog: pytest.LogCaptureFixture) -> None:
    """A record the status covers is not read at start; when it turns out not to restore
    (read after ready, or first needed), the projector rebuilds from CRR_EVENTS (logged,
    in its status) and writes the record again."""
    caplog.set_level(logging.WARNING, logger="crr.projector")
    async with running_partitions(nc, 1) as running:
        await partial_reports(nc)
        await everything_written(nc, running)
    # Looks like a record the status covers (as_of.seq 1), but is not one.
    await nc.jetstream().publish(host_snapshot_subject("node1"),
                                 b'{"as_of":{"seq":1,"broken"}')
    async with running_partitions(nc, 1) as again:
        p = again[0]
        await publish_report(nc, "scratch", "node1", {"scratch_free": 3.0}, seq=4)

        async def rebuilt() -> bool | None:
            entry = (await read_snapshot_bytes(nc)).get(SNAPSHOT_PROJECTOR)
            start = decode(entry[1], ProjectorStatus).start if entry else ""
            return True if "does not restore" in start else None

        await eventually(rebuilt, 20, "a status saying the projector rebuilt")
        await everything_written(nc, again)
        assert p.rebuilds == 1
    raw = await read_snapshot_bytes(nc)
    node1 = decode(raw[host_snapshot_subject("node1")][1], HostSnapshot)
    assert node1.values["scratch_free"].value == 3.0
    assert any("does not restore" in r.message for r in caplog.records)
