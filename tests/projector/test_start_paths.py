"""Nothing lost on any start path: the snapshot equals a fold of every retained event.

Real nats-server, real Projectors.  Each host sends one full report (`r_free`, `r_os`,
`r_sets`) and then partial ones (`r_free` only), all with a 1 h interval, so the last
event of every subject omits what the first carried.  Whatever way the projector then
starts — first start over stored events, CRR_SNAPSHOT lost, a repartition (1→2, 2→1,
2→3), a checkpoint format it does not know, the server losing acknowledged messages —
every omitted value is still there, and the records equal a replay of the history.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

import crr.projector.checks
import crr.projector.service as projector_module
from crr.bus.follower import read_snapshot_bytes
from crr.bus.server import NatsServer
from crr.bus.streams import StreamSettings, provision
from crr.projector.start import Start, retention_gap
from crr.schemas.catalog_loader import load_catalog_text
from crr.schemas.codec import decode, encode
from crr.schemas.errors import BusTimeoutError
from crr.schemas.snapshot import HostSnapshot, ProjectorStatus
from crr.schemas.subjects import (
    EVENTS_STREAM,
    SNAPSHOT_STREAM,
    host_snapshot_subject,
    status_subject,
)
from tests.history.test_replay import cli
from tests.projector.test_restore import assert_replay_equals_live, everything_written
from tests.support.faults import CrrProcess, caught_up, eventually
from tests.support.projector import (
    publish_catalog,
    publish_report,
    running_partitions,
    running_projector,
)

CATALOG = load_catalog_text("""
version: 1
resources:
  r_free: {kind: numeric, scope: host, reporter: node, interval: 1h, min: 0}
  r_os:   {kind: string, scope: host, reporter: node, interval: 1h}
  r_sets: {kind: string_set, scope: host, reporter: node, interval: 1h}
reporters:
  node: {type: external, interval: 1h}
""")
HOSTS = [f"n{i:02d}" for i in range(24)] + ["gpu-7.dc2"]


async def full_reports(nc: Client) -> None:
    """The catalog, then one full report per host (seq 1)."""
    await publish_catalog(nc, CATALOG)
    for i, host in enumerate(HOSTS):
        await publish_report(nc, "node", host, {
            "r_free": float(i), "r_os": f"rhel{i % 3}", "r_sets": ["imagenet", f"s{i}"]}, seq=1)


async def partial_reports(nc: Client, seq: int) -> int:
    """A report per host that carries `r_free` only (and one rejected value); the last seq."""
    last = 0
    for i, host in enumerate(HOSTS):
        values: dict[str, object] = {"r_free": 100.0 * seq + i}
        if host == "n03":
            values["r_os"] = 7  # rejected (not a string): r_os keeps its earlier value
        last = await publish_report(nc, "node", host, values, seq=seq)
    return last


def assert_nothing_omitted_lost(raw: dict[str, tuple[int, bytes]], free_seq: int) -> None:
    """Every host keeps r_os and r_sets of its full report, with r_free of the last one."""
    missing = []
    for i, host in enumerate(HOSTS):
        entry = raw.get(host_snapshot_subject(host))
        assert entry is not None, host
        snap = decode(entry[1], HostSnapshot)
        got = {n: e.value for n, e in snap.values.items()}
        want = {"r_free": 100.0 * free_seq + i, "r_os": f"rhel{i % 3}",
                "r_sets": sorted(["imagenet", f"s{i}"])}
        if got != want:
            missing.append((host, got, want))
    assert missing == [], f"{len(missing)} of {len(HOSTS)} hosts differ, first: {missing[0]}"
    n03 = decode(raw[host_snapshot_subject("n03")][1], HostSnapshot)
    assert n03.reporters["node"].rejected_total >= 1


async def assert_verified(nc: Client, nats_url: str, capsys: pytest.CaptureFixture[str],
                          partitions: int) -> None:
    """`crr replay --verify` agrees with every partition's records, with no stray note."""
    code, out, err = await cli(["replay", "--server", nats_url, "--verify"], capsys)
    assert code == 0, out + err
    assert out.count("byte-identical") == partitions, out
    assert "older version" not in err, err


async def statuses(nc: Client) -> list[ProjectorStatus]:
    raw = await read_snapshot_bytes(nc)
    return [decode(b, ProjectorStatus) for s, (_, b) in sorted(raw.items())
            if s.startswith("crr.v1.snapshot.projector")]


async def test_first_start_over_stored_events_folds_the_whole_history(
        nc: Client, nats_url: str, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    """Agents deployed before the projector: its first start folds every stored event,
    says so (with the first retained event's time), and loses no omitted value."""
    caplog.set_level(logging.INFO, logger="crr.projector")
    await provision(nc)
    await full_reports(nc)
    await partial_reports(nc, 2)
    last = await partial_reports(nc, 3)
    async with running_projector(nc) as p:
        await p.wait_until(last)
        assert not p.restored
        assert p.start_note.startswith("rebuilt from CRR_EVENTS: "), p.start_note
        assert "first start" in p.start_note
        assert f"the fold of {last} retained event(s) from seq 1" in p.start_note
        assert "values reported only before then are gone" in p.start_note
        assert p.retained_from is not None
        assert_nothing_omitted_lost(await read_snapshot_bytes(nc), 3)
        st = (await statuses(nc))[0]
        assert st.phase == ""
        assert st.progress is None
        assert st.retained_from == p.retained_from
        assert st.start_seq == 0
    await assert_replay_equals_live(nc)
    await assert_verified(nc, nats_url, capsys, 1)
    assert any("rebuilt from" in r.message for r in caplog.records)


@pytest.mark.parametrize("partitions", [1, 2])
async def test_snapshot_lost_rebuild_keeps_omitted_values(
        nc: Client, nats_url: str, capsys: pytest.CaptureFixture[str], partitions: int) -> None:
    """CRR_SNAPSHOT deleted: each partition rebuilds from the retained history (its own
    hosts only) and every value a later partial report omitted is back."""
    await provision(nc, StreamSettings(partitions=partitions), update=True)
    async with running_partitions(nc, partitions) as running:
        await full_reports(nc)
        await partial_reports(nc, 2)
        await everything_written(nc, running)
    await nc.jetstream().delete_stream(SNAPSHOT_STREAM)
    async with running_partitions(nc, partitions) as again:
        assert not any(p.restored for p in again), [p.start_note for p in again]
        await everything_written(nc, again)
        assert_nothing_omitted_lost(await read_snapshot_bytes(nc), 2)
        if partitions > 1:
            owned = [set(p.state.hosts) for p in again]
            assert set.union(*owned) == set(HOSTS)
            assert sum(len(o) for o in owned) == len(HOSTS)  # each host in one partition
    await assert_replay_equals_live(nc)
    await assert_verified(nc, nats_url, capsys, partitions)


@pytest.mark.parametrize(("old", "new"), [(1, 2), (2, 1), (2, 3)])
async def test_repartition_restores_and_loses_nothing(
        nc: Client, nats_url: str, capsys: pytest.CaptureFixture[str], old: int,
        new: int) -> None:
    """Changing `--partitions`: every new partition restores from the old layout's host
    records (no rebuild), says so in its start note, and folds on: the partial reports
    published before and after the change leave every omitted value in place."""
    await provision(nc, StreamSettings(partitions=old), update=True)
    async with running_partitions(nc, old) as running:
        await full_reports(nc)
        await partial_reports(nc, 2)
        await everything_written(nc, running)
    await provision(nc, StreamSettings(partitions=new), update=True)
    await partial_reports(nc, 3)  # stored under the new layout, before it runs
    async with running_partitions(nc, new) as again:
        notes = [p.start_note for p in again]
        assert all(p.restored for p in again), notes
        assert all(f"repartitioned from {old} to {new} partition(s)" in n for n in notes), notes
        await everything_written(nc, again)
        assert_nothing_omitted_lost(await read_snapshot_bytes(nc), 3)
        assert sum(p.host_count for p in again) == len(HOSTS), [p.host_count for p in again]
        await partial_reports(nc, 4)
        await everything_written(nc, again)
        assert_nothing_omitted_lost(await read_snapshot_bytes(nc), 4)
    # And a restart in the new layout restores from its own statuses.
    async with running_partitions(nc, new) as third:
        assert all(p.restored for p in third)
        assert not any("repartitioned" in p.start_note for p in third)
        await everything_written(nc, third)
        assert_nothing_omitted_lost(await read_snapshot_bytes(nc), 4)
    await assert_replay_equals_live(nc)
    await assert_verified(nc, nats_url, capsys, new)


async def test_unknown_checkpoint_format_rebuilds_and_keeps_omitted_values(
        nc: Client, nats_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A status of a checkpoint format this projector does not know (an upgrade that
    changed it): it rebuilds from the history, says why, and keeps every value."""
    async with running_projector(nc) as p:
        await full_reports(nc)
        last = await partial_reports(nc, 2)
        await p.wait_until(last)
    entry = await nc.jetstream().get_last_msg(SNAPSHOT_STREAM, status_subject(None))
    assert entry.data is not None
    status = decode(entry.data, ProjectorStatus)
    await nc.jetstream().publish(status_subject(None),
                                 encode(msgspec.structs.replace(status, checkpoint=99)))
    async with running_projector(nc) as again:
        assert not again.restored
        assert "checkpoint format is 99" in again.start_note, again.start_note
        await again.wait_until(last)
        assert_nothing_omitted_lost(await read_snapshot_bytes(nc), 2)
    await assert_verified(nc, nats_url, capsys, 1)


async def test_an_unfinished_rebuild_is_not_restored_from(nc: Client) -> None:
    """A status that says `rebuilding` (a rebuild killed half-way) is never restored from:
    the next start rebuilds again and ends with the same records."""
    async with running_projector(nc) as p:
        await full_reports(nc)
        last = await partial_reports(nc, 2)
        await p.wait_until(last)
    before = {s: b for s, (_, b) in (await read_snapshot_bytes(nc)).items()
              if s.startswith("crr.v1.snapshot.host.")}
    entry = await nc.jetstream().get_last_msg(SNAPSHOT_STREAM, status_subject(None))
    assert entry.data is not None
    status = decode(entry.data, ProjectorStatus)
    await nc.jetstream().publish(status_subject(None), encode(
        msgspec.structs.replace(status, phase="rebuilding")))
    async with running_projector(nc) as again:
        assert not again.restored
        assert "did not finish" in again.start_note, again.start_note
        await again.wait_until(last)
        after = {s: b for s, (_, b) in (await read_snapshot_bytes(nc)).items()
                 if s.startswith("crr.v1.snapshot.host.")}
        assert after == before


async def test_after_lost_acknowledged_messages_the_rebuild_keeps_omitted_values(
        server_and_client: tuple[NatsServer, Client]) -> None:
    """The server comes back without the tail of CRR_EVENTS (the full and partial reports
    before it survive): the projector's rebuild folds what the stream holds, so every
    omitted value of the surviving history is kept (the last event per subject alone —
    the partial reports — would drop r_os and r_sets on every host)."""
    server, nc = server_and_client
    await full_reports(nc)
    kept = await partial_reports(nc, 2)
    async with running_projector(nc, status_interval=3600) as projector:
        await projector.wait_until(kept)
        last = await partial_reports(nc, 3)
        await projector.wait_until(last)
        # The crash: CRR_EVENTS comes back with its history up to `kept` only.
        survivors = []
        async for m in _stored(nc, kept):
            survivors.append(m)
        await nc.jetstream().delete_stream(EVENTS_STREAM)
        await provision(nc)
        for subject, data, headers in survivors:
            await nc.jetstream().publish(subject, data, headers=headers)
        server.kill()
        server.start()

        async def rebuilt() -> bool:
            if projector.rebuilds != 1:
                return False
            try:
                assert_nothing_omitted_lost(await read_snapshot_bytes(nc), 2)
            except AssertionError:
                return False
            return True

        await eventually(rebuilt, 30, "projector rebuilt from the shortened stream")
        assert "lost acknowledged messages" in projector.start_note, projector.start_note


async def _stored(nc: Client, upto: int) -> AsyncIterator[tuple[str, bytes, dict[str, str]]]:
    """(subject, data, headers) of CRR_EVENTS's messages up to `upto`, in order."""
    js = nc.jetstream()
    for seq in range(1, upto + 1):
        m = await js.get_msg(EVENTS_STREAM, seq=seq)
        yield m.subject or "", m.data or b"", dict(m.headers or {})


async def test_rebuild_status_and_progress_are_visible(nc: Client) -> None:
    """While rebuilding, the projector's status says `rebuilding` with its progress (as
    `crr projector`, `/healthz`, the page and the view read it); after, it says nothing
    of it."""
    await provision(nc)
    await publish_catalog(nc, CATALOG)
    js = nc.jetstream()
    acks = [await js.publish_async(f"crr.v1.report.host.h{i % 50}.node", msgspec.json.encode({
        "reporter": "node", "host": f"h{i % 50}", "boot": "b", "seq": i + 1,
        "observed_at": "2026-12-02T14:00:00.000Z", "values": {"r_free": float(i)}}))
        for i in range(2000)]
    last = 0
    for fut in acks:
        last = max(last, int((await fut).seq))
    seen: list[ProjectorStatus] = []

    async def on_status(msg: Msg) -> None:
        st = decode(msg.data, ProjectorStatus)
        if st.phase == "rebuilding":
            seen.append(st)

    sub = await nc.subscribe(status_subject(None), cb=on_status)
    try:
        async with running_projector(nc, status_interval=0.05) as p:
            await p.wait_until(last)
            assert p.rebuild_progress is None
            st = (await statuses(nc))[0]
            assert st.phase == ""
            assert st.progress is None
    finally:
        await sub.unsubscribe()
    # The first is written before the first event is read; later ones show progress.
    first = seen[0]
    assert first.progress is not None
    assert (first.progress.folded, first.progress.to_fold) == (0, last)
    assert first.progress.from_seq == 1
    assert first.last_seq == first.covered_seq == 0  # claims no coverage while rebuilding
    assert "rebuilt from CRR_EVENTS" in first.start
    for st in seen[1:]:
        assert st.progress is not None
        assert st.progress.folded <= st.progress.to_fold <= last


async def test_stale_leftover_status_of_an_older_layout_is_not_trusted(
        nc: Client, nats_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """1 → 2 → 1: the unpartitioned status left from before the first change is older
    than the two partitions' statuses; the new unpartitioned projector restores from the
    partitions' records (the newer layout) and loses nothing."""
    async with running_partitions(nc, 1) as running:
        await full_reports(nc)
        await everything_written(nc, running)
    await provision(nc, StreamSettings(partitions=2), update=True)
    async with running_partitions(nc, 2) as running:
        await partial_reports(nc, 2)
        await everything_written(nc, running)
    await provision(nc, StreamSettings(partitions=1), update=True)
    async with running_partitions(nc, 1) as again:
        assert again[0].restored, again[0].start_note
        assert "repartitioned from 2 to 1" in again[0].start_note, again[0].start_note
        await everything_written(nc, again)
        assert_nothing_omitted_lost(await read_snapshot_bytes(nc), 2)
    await assert_verified(nc, nats_url, capsys, 1)


async def test_retention_shorter_than_a_lifetime_is_warned_at_start(
        nc: Client, caplog: pytest.LogCaptureFixture) -> None:
    """CRR_EVENTS kept for 30 min while values live 1 h 30 min (interval + grace): the
    projector warns that a rebuild could only fold what is retained, naming each one."""
    caplog.set_level(logging.WARNING, logger="crr.projector")
    settings = StreamSettings(events_max_age=1800)
    await provision(nc, settings, update=True)
    await publish_catalog(nc, CATALOG)
    async with running_projector(nc, settings=settings) as p:
        assert p.ready.is_set()
    warned = [r.message for r in caplog.records if "retention" in r.message]
    assert len(warned) == 1, warned
    assert "max_age 1800s" in warned[0]
    assert "r_free (5400s)" in warned[0]
    assert "--retention" in warned[0]


async def test_bad_events_met_by_a_rebuild_go_to_dead_letters(nc: Client) -> None:
    """Undecodable and unappliable events in the retained history are dead-lettered by the
    rebuild exactly as live (with their sequence and reason), and lose nothing else."""
    await provision(nc)
    await full_reports(nc)
    garbage = await publish_report(nc, "node", "n01", {}, seq=90, raw=b"{not json")
    wrong = await publish_report(nc, "node", "n02", {}, seq=91, raw=msgspec.json.encode({
        "reporter": "node", "host": "someone-else", "boot": "b", "seq": 91,
        "observed_at": "2026-12-02T14:00:00.000Z", "values": {"r_free": 1.0}}))
    last = await partial_reports(nc, 2)
    letters: list[int] = []

    async def on_letter(msg: Msg) -> None:
        letters.append(msgspec.json.decode(msg.data)["seq"])

    sub = await nc.subscribe("crr.v1.deadletter", cb=on_letter)
    try:
        async with running_projector(nc) as p:
            await p.wait_until(last)
            assert not p.restored
            assert p.deadletter_count == 2
            assert_nothing_omitted_lost(await read_snapshot_bytes(nc), 2)
            await eventually(lambda: sorted(letters) == [garbage, wrong], 10,
                             "both dead letters published")
    finally:
        await sub.unsubscribe()


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
async def test_a_rebuild_killed_half_way_starts_again_and_ends_the_same(
        nc: Client, nats_url: str, tmp_path: Path) -> None:
    """`kill -9` of a real `crr projector` while it rebuilds (its `rebuilding` status is
    out): the next one does not restore from that status, rebuilds again, and its records
    equal a replay of the history — every omitted value kept."""
    await provision(nc)
    await full_reports(nc)
    js = nc.jetstream()
    acks = [await js.publish_async(f"crr.v1.report.host.n{i % 24:02d}.node", msgspec.json.encode({
        "reporter": "node", "host": f"n{i % 24:02d}", "boot": "b2", "seq": i + 1,
        "observed_at": "2026-12-02T14:00:00.000Z", "values": {}})) for i in range(20_000)]
    for fut in acks:
        await fut
    last = await partial_reports(nc, 2)
    first = CrrProcess(["projector", "--server", nats_url, "--id", "first"],
                       tmp_path / "first.log").start()
    try:
        async def rebuilding() -> bool:
            try:
                m = await js.get_last_msg(SNAPSHOT_STREAM, status_subject(None))
            except Exception:
                return False
            return m.data is not None and decode(m.data, ProjectorStatus).phase == "rebuilding"

        await eventually(rebuilding, 30, "the first projector says it is rebuilding")
    finally:
        first.kill()
    second = CrrProcess(["projector", "--server", nats_url, "--id", "second"],
                        tmp_path / "second.log").start()
    try:
        snap = await caught_up(nc, 60, projector_id="second")
        assert snap.projector is not None
        assert snap.projector.phase == ""
        assert "did not finish" in snap.projector.start, snap.projector.start
        assert snap.projector.last_seq == last
        assert_nothing_omitted_lost(await read_snapshot_bytes(nc), 2)
        await assert_replay_equals_live(nc)
    finally:
        second.stop()


def test_retention_removing_events_during_a_rebuild_is_said() -> None:
    """Retention removed the first events before the rebuild read them: the note says
    which, and that it went on; nothing is said when the first event read was the first."""
    assert retention_gap(1, 1) is None
    assert retention_gap(5, 0) is None  # nothing read (an empty stream)
    assert retention_gap(1, 41) == ("retention removed events 1..40 while the rebuild read; "
                                    "it went on from seq 41")


@pytest.mark.parametrize("created_again_by", ["this projector", "another writer"])
async def test_snapshot_deleted_under_a_running_projector_is_written_again(
        created_again_by: str, nc: Client, nats_url: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """CRR_SNAPSHOT deleted while the projector runs, then created again by this projector
    (its next write fails: it creates the stream) or at once by another writer (the other
    partition of two, an admin's `crr` command: no write of this one fails, but its status
    ack comes at a lower sequence than the one before — the chaos run's seed 3 found this).
    Either way every record is rewritten from the fold state (no restart, nothing folded
    again), and a later partial report still keeps every omitted value."""
    async with running_projector(nc, status_interval=0.2) as p:
        await full_reports(nc)
        last = await partial_reports(nc, 2)
        await p.wait_until(last)
        await nc.jetstream().delete_stream(SNAPSHOT_STREAM)
        if created_again_by == "another writer":
            await provision(nc)

        async def rewritten() -> bool:
            try:
                assert_nothing_omitted_lost(await read_snapshot_bytes(nc), 2)
            except Exception:
                return False
            return True

        await eventually(rewritten, 30, "every record written again")
        assert p.snapshot_recreations == 1
        assert p.rebuilds == 0
        last = await partial_reports(nc, 3)
        await p.wait_until(last)
        assert_nothing_omitted_lost(await read_snapshot_bytes(nc), 3)
    await assert_verified(nc, nats_url, capsys, 1)


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
async def test_a_server_that_does_not_answer_at_start_is_retried(
        nc: Client, nats_url: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A cluster electing its meta leader answers a start-up call with a timeout (the
    chaos run saw projectors exit on it): the projector says so and tries again; a load
    that failed half-way (the history folded, then a timeout) starts from nothing, so
    no event is folded twice and the snapshot is the fold of every retained event."""
    await full_reports(nc)
    last = await partial_reports(nc, 2)
    real_check, real_load = crr.projector.checks.check_layout, Start.load
    calls = {"check": 0, "load": 0}

    async def check_once_silent(*args: object, **kw: object) -> float | None:
        calls["check"] += 1
        if calls["check"] == 1:
            raise BusTimeoutError("no answer in time (nats: timeout)")
        return await real_check(*args, **kw)  # type: ignore[arg-type]

    async def load_then_fail_once(self: Start, *, restore: bool, digest: bool = False) -> None:
        calls["load"] += 1
        await real_load(self, restore=restore, digest=digest)
        if calls["load"] == 1:
            raise BusTimeoutError("no answer in time (nats: timeout)")

    monkeypatch.setattr(projector_module, "check_layout", check_once_silent)
    monkeypatch.setattr(Start, "load", load_then_fail_once)
    with caplog.at_level(logging.WARNING, logger="crr.projector"):
        async with running_projector(nc, status_interval=0.2) as p:
            await p.wait_until(last)
            assert_nothing_omitted_lost(await read_snapshot_bytes(nc), 2)
    assert calls == {"check": 3, "load": 2}, calls
    assert sum("cannot start yet" in r.getMessage() for r in caplog.records) == 2
    await assert_verified(nc, nats_url, capsys, 1)
